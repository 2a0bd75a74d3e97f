"""Malformed settings stop start-up with a message that names the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _data_dir_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The development settings keep a secret key in their data directory: not the checkout's."""
    monkeypatch.setenv("ACTIVATE_DATA_DIR", str(tmp_path / "data"))


def settings_environment(**env: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")}
    environ["ACTIVATE_DATA_DIR"] = os.environ["ACTIVATE_DATA_DIR"]
    environ.update(env)
    return environ


def run_check(**env: str) -> subprocess.CompletedProcess[str]:
    environ = settings_environment(**env)
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
        ({"ACTIVATE_AGENT_URL": "127.0.0.1:8001"}, "ACTIVATE_AGENT_URL"),
        ({"ACTIVATE_AGENT_SERVER": "agents"}, "ACTIVATE_AGENT_SERVER"),
        ({"ACTIVATE_MAX_REQUEST_BODY": "1k"}, "ACTIVATE_MAX_REQUEST_BODY"),
        ({"ACTIVATE_DEBUG": "maybe"}, "ACTIVATE_DEBUG"),
        ({"DATABASE_URL": "nonsense://"}, "DATABASE_URL"),
        ({"ACTIVATE_INSTALLATION_ID": "Prod-1"}, "ACTIVATE_INSTALLATION_ID"),
        ({"ACTIVATE_OIDC_ISSUER": "http://idp.example.org"}, "ACTIVATE_OIDC_ISSUER"),
        ({"ACTIVATE_OIDC_ISSUER": "https://idp.example.org"}, "ACTIVATE_OIDC_CLIENT_ID"),
        ({"ACTIVATE_OIDC_SCOPES": "profile email"}, "ACTIVATE_OIDC_SCOPES"),
        ({"ACTIVATE_CLI_KEY_HOURS": "a day"}, "ACTIVATE_CLI_KEY_HOURS"),
        ({"ACTIVATE_LDAP_URL": "ldap.example.org"}, "ACTIVATE_LDAP_URL"),
        ({"ACTIVATE_LDAP_URL": "ldaps://ldap.example.org"}, "ACTIVATE_LDAP_USER_BASE"),
        (
            {
                "ACTIVATE_LDAP_URL": "ldaps://ldap.example.org",
                "ACTIVATE_LDAP_USER_BASE": "ou=people,dc=example,dc=org",
                "ACTIVATE_LDAP_GROUP_TYPE": "nisNetgroup",
            },
            "ACTIVATE_LDAP_GROUP_TYPE",
        ),
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


def test_given_single_sign_on_and_a_directory_then_startup_succeeds() -> None:
    # Nothing is fetched at start-up: the provider and the directory need not answer yet.
    result = run_check(
        ACTIVATE_OIDC_ISSUER="https://idp.example.org/realms/hpc",
        ACTIVATE_OIDC_CLIENT_ID="activate",
        ACTIVATE_OIDC_CLIENT_SECRET="a-client-secret",
        ACTIVATE_LDAP_URL="ldaps://ldap.example.org",
        ACTIVATE_LDAP_USER_BASE="ou=people,dc=example,dc=org",
        ACTIVATE_LDAP_GROUP_BASE="ou=groups,dc=example,dc=org",
        ACTIVATE_LDAP_GROUP_TYPE="posixGroup",
    )
    assert result.returncode == 0, result.stderr


def test_given_production_settings_without_a_secret_key_then_startup_stops() -> None:
    result = run_check(DJANGO_SETTINGS_MODULE="activate.settings.prod")
    assert result.returncode != 0
    assert "ACTIVATE_SECRET_KEY" in result.stderr


STRONG_KEY = "k" * 50


def production_settings(**env: str) -> dict[str, object]:
    """The production settings module as a process with ``env`` would load them."""
    environ = settings_environment(**env, DJANGO_SETTINGS_MODULE="activate.settings.prod")
    script = (
        "import json, django\n"
        "from django.conf import settings\n"
        "django.setup()\n"
        "names = ['SECURE_HSTS_SECONDS', 'SECURE_PROXY_SSL_HEADER', 'SESSION_COOKIE_SECURE',\n"
        "         'CSRF_COOKIE_SECURE', 'SECURE_CONTENT_TYPE_NOSNIFF', 'DEBUG']\n"
        "print(json.dumps({name: getattr(settings, name) for name in names}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    loaded: dict[str, object] = json.loads(result.stdout)
    return loaded


def test_given_production_settings_with_a_short_secret_key_then_startup_stops_naming_it() -> None:
    result = run_check(
        DJANGO_SETTINGS_MODULE="activate.settings.prod",
        ACTIVATE_SECRET_KEY="k" * 49,
        ACTIVATE_AGENT_URL="https://agents.example.org",
    )
    assert result.returncode != 0
    assert "ACTIVATE_SECRET_KEY must be at least 50 characters" in result.stderr
    assert "Traceback" not in result.stderr


def test_given_production_settings_then_agents_use_https_unless_the_operator_says_so() -> None:
    plain = {"DJANGO_SETTINGS_MODULE": "activate.settings.prod", "ACTIVATE_SECRET_KEY": STRONG_KEY}
    refused = run_check(**plain, ACTIVATE_AGENT_URL="http://agents.example.org")
    assert refused.returncode != 0
    assert "ACTIVATE_AGENT_URL must start with https://" in refused.stderr
    assert "ACTIVATE_AGENT_PLAIN_HTTP" in refused.stderr

    allowed = run_check(
        **plain, ACTIVATE_AGENT_URL="http://10.0.0.5:8001", ACTIVATE_AGENT_PLAIN_HTTP="true"
    )
    assert allowed.returncode == 0, allowed.stderr


def test_given_production_settings_then_tls_comes_from_the_proxy_and_cookies_are_secure() -> None:
    loaded = production_settings(
        ACTIVATE_SECRET_KEY=STRONG_KEY, ACTIVATE_AGENT_URL="https://agents.example.org"
    )
    assert loaded["SECURE_HSTS_SECONDS"] == 31_536_000
    assert loaded["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert loaded["SESSION_COOKIE_SECURE"] is True
    assert loaded["CSRF_COOKIE_SECURE"] is True
    assert loaded["SECURE_CONTENT_TYPE_NOSNIFF"] is True
    assert loaded["DEBUG"] is False
