"""Malformed settings stop start-up with a message that names the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_check(**env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ACTIVATE_HEARTBEAT_TIMEOUT": "abc"}, "ACTIVATE_HEARTBEAT_TIMEOUT"),
        ({"ACTIVATE_POLL_INTERVAL": "-3"}, "ACTIVATE_POLL_INTERVAL"),
        (
            {"ACTIVATE_HEARTBEAT_INTERVAL": "90", "ACTIVATE_HEARTBEAT_TIMEOUT": "120"},
            "ACTIVATE_HEARTBEAT_INTERVAL",
        ),
        ({"ACTIVATE_SWEEP_INTERVAL": "500"}, "ACTIVATE_SWEEP_INTERVAL"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
        ({"ACTIVATE_PUBLIC_URL": "ftp://x"}, "ACTIVATE_PUBLIC_URL"),
        ({"ACTIVATE_DEBUG": "maybe"}, "ACTIVATE_DEBUG"),
        ({"DATABASE_URL": "nonsense://"}, "DATABASE_URL"),
        ({"ACTIVATE_INSTALLATION_ID": "Prod-1"}, "ACTIVATE_INSTALLATION_ID"),
    ],
)
def test_given_a_malformed_setting_then_startup_stops_naming_it(
    env: dict[str, str], named: str
) -> None:
    result = run_check(**env)
    assert result.returncode != 0
    assert named in result.stderr
    assert "Traceback" not in result.stderr


def test_given_well_formed_settings_then_startup_succeeds() -> None:
    result = run_check(ACTIVATE_HEARTBEAT_INTERVAL="5", ACTIVATE_HEARTBEAT_TIMEOUT="12")
    assert result.returncode == 0, result.stderr


def test_given_production_settings_without_a_secret_key_then_startup_stops() -> None:
    result = run_check(DJANGO_SETTINGS_MODULE="activate.settings.prod")
    assert result.returncode != 0
    assert "ACTIVATE_SECRET_KEY" in result.stderr
