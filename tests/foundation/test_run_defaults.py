"""`make run` is safe by default. Its processes (manage.py, scripts/start.sh) load the
development settings; on a fresh clone nothing is set, and they must still show no debug pages
and sign and encrypt with a key nobody else knows."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from core.env import PUBLISHED_SECRET_KEYS, TEST_SECRET_KEY, is_published_secret

REPO = Path(__file__).resolve().parents[2]
# What a process of `make run` sees: its settings, and the page an unknown URL gets.
PROBE = """
import json
from django.conf import settings
from django.test import Client
page = Client().get("/no-such-page/", HTTP_HOST="127.0.0.1")
print(json.dumps({
    "debug": settings.DEBUG,
    "key": settings.SECRET_KEY,
    "status": page.status_code,
    "page": page.content.decode(),
}))
"""


def manage(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """manage.py as `make run` runs it on a fresh clone: nothing set but where its data goes."""
    unset = {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_") and k not in unset
    }
    environ.update(env, ACTIVATE_DATA_DIR=str(data_dir))
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def probe(data_dir: Path, **env: str) -> dict[str, object]:
    result = manage(data_dir, "shell", "-c", PROBE, **env)
    assert result.returncode == 0, result.stderr
    loaded: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_on_a_fresh_clone_debug_is_off_and_the_key_is_made_once_for_this_installation(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"

    first = probe(data)

    assert first["debug"] is False
    # An unknown URL is a plain 404, not Django's page listing every URL pattern.
    assert first["status"] == 404
    assert "URLconf" not in str(first["page"]) and "activate.urls" not in str(first["page"])
    key = str(first["key"])
    assert not is_published_secret(key) and len(key) >= 50
    key_file = data / "secret-key.txt"
    assert key_file.read_text().strip() == key
    assert mode(key_file) == 0o600 and mode(data) == 0o700
    # Kept: the next start (and every manage.py command) signs and decrypts with the same key.
    assert probe(data)["key"] == key
    # Made at random, not derived: another installation gets another key.
    assert probe(tmp_path / "elsewhere")["key"] != key


def test_debug_is_on_only_when_asked_for(tmp_path: Path) -> None:
    loaded = probe(tmp_path / "data", ACTIVATE_DEBUG="true")
    assert loaded["debug"] is True
    assert "URLconf" in str(loaded["page"])


def test_an_open_data_directory_is_closed_to_other_users(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    probe(data)
    assert mode(data) == 0o700


@pytest.mark.parametrize(
    "key", [*sorted(PUBLISHED_SECRET_KEYS), "django-insecure-" + "x" * 50, "insecure-" + "y" * 50]
)
@pytest.mark.parametrize("settings_module", ["activate.settings.dev", "activate.settings.prod"])
def test_a_published_key_is_refused_outside_tests(
    tmp_path: Path, key: str, settings_module: str
) -> None:
    result = manage(
        tmp_path / "data",
        "check",
        DJANGO_SETTINGS_MODULE=settings_module,
        ACTIVATE_SECRET_KEY=key,
        ACTIVATE_AGENT_URL="https://agents.example.org",
    )
    assert result.returncode != 0
    assert "ACTIVATE_SECRET_KEY is a published key" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_published_key_in_the_key_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    key_file = data / "secret-key.txt"
    key_file.write_text(TEST_SECRET_KEY + "\n")
    key_file.chmod(0o600)
    result = manage(data, "check")
    assert result.returncode != 0
    assert "published key" in result.stderr and "Traceback" not in result.stderr


def test_a_key_file_other_users_can_read_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    probe(data)
    key_file = data / "secret-key.txt"
    key_file.chmod(0o644)
    result = manage(data, "check")
    assert result.returncode != 0
    assert str(key_file) in result.stderr and "0644" in result.stderr
    assert "Traceback" not in result.stderr
