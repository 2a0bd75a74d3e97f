"""`pw auth login --sso` against a live platform and the real provider (scripts/idp): the
device grant's code confirmed by script as a person would, the key it saves works, cannot make
API keys, and once expired is refused with a sentence that says what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from harness.identity import CAROL, DEVICE_GRANT, Provider, complete_device_flow
from identity.models import Identity, Source
from tests.identity.sso import sso_platform
from workers_app.models import ApiKey, KeyScope

pytestmark = pytest.mark.django_db(transaction=True)
PW = Path(sys.executable).with_name("pw")
TIMEOUT = 60


@pytest.fixture
def provider(live_server: Any) -> Iterator[Provider]:
    with sso_platform(live_server.url, ACTIVATE_CLI_KEY_HOURS=2) as running:
        yield running


def pw_env(live_server: Any, home: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "PW_PLATFORM_HOST": live_server.url}


def sign_in_by_pw(live_server: Any, home: Path, *args: str) -> tuple[int, str, str]:
    """Run `pw auth login ARGS`, confirm the code it shows at the provider as carol."""
    process = subprocess.Popen(
        [str(PW), "auth", "login", *args],
        env=pw_env(live_server, home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    seen = []
    try:
        for line in process.stderr:
            seen.append(line)
            if line.strip().startswith("or open "):
                complete_device_flow(line.strip().removeprefix("or open "), CAROL)
                break
        stdout, rest = process.communicate(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, stdout, "".join(seen) + rest


def test_pw_auth_login_sso_completes_a_device_flow_and_saves_a_session_key(
    provider: Provider, live_server: Any, tmp_path: Path
) -> None:
    # When carol runs `pw auth login --sso` and confirms the code it shows in her browser
    code, stdout, stderr = sign_in_by_pw(live_server, tmp_path, "--sso")
    # Then pw says who she is, and saved a key
    assert code == 0, stderr
    assert "To sign in, open" in stderr and "Logged in to" in stdout and "PWCarol" in stdout
    saved = json.loads((tmp_path / ".config" / "pw" / "credentials.json").read_text())
    secret = saved["api_key"]
    key = ApiKey.objects.get(user__username="PWCarol")
    assert key.scope == KeyScope.SESSION and key.expires_at is not None
    assert timedelta(hours=1.9) < key.expires_at - timezone.now() < timedelta(hours=2.1)
    assert Identity.objects.get(user__username="PWCarol").source == Source.OIDC
    # And the key works, for pw too
    api = httpx.Client(
        base_url=f"{live_server.url}/api", headers={"Authorization": f"Bearer {secret}"}
    )
    assert api.get("/me/").json()["username"] == "PWCarol"
    listed = subprocess.run(
        [str(PW), "workers", "ls"],
        env=pw_env(live_server, tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    # But it cannot make or list API keys
    made = api.post("/api-keys/", json={"name": "forever"})
    assert made.status_code == 403 and "cannot manage API keys" in made.json()["detail"]
    assert api.get("/api-keys/").status_code == 403
    assert ApiKey.objects.filter(user__username="PWCarol").count() == 1
    # And once expired it is refused, saying what to do
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = api.get("/me/")
    assert expired.status_code == 401
    assert expired.json()["detail"] == "API key expired; run pw auth login"
    again = subprocess.run(
        [str(PW), "workers", "ls"],
        env=pw_env(live_server, tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert again.returncode != 0 and "API key expired; run pw auth login" in again.stderr


def test_plain_pw_auth_login_offers_single_sign_on_when_the_platform_has_it(
    provider: Provider, live_server: Any, tmp_path: Path
) -> None:
    code, stdout, stderr = sign_in_by_pw(live_server, tmp_path)
    assert code == 0, stderr
    assert "offers single sign-on" in stderr and "PWCarol" in stdout


def test_a_full_key_still_manages_api_keys(live_server: Any) -> None:
    user = User.objects.create_user("keeper")
    _, secret = ApiKey.issue(user, name="full")
    api = httpx.Client(
        base_url=f"{live_server.url}/api", headers={"Authorization": f"Bearer {secret}"}
    )
    made = api.post("/api-keys/", json={"name": "second"})
    assert made.status_code == 201 and made.json()["key"].startswith("pwk_")
    assert {k["name"] for k in api.get("/api-keys/").json()["results"]} == {"full", "second"}
    assert api.delete(f"/api-keys/{made.json()['id']}/").status_code == 204


def test_the_platform_without_single_sign_on_says_so(live_server: Any, tmp_path: Path) -> None:
    offer = httpx.get(f"{live_server.url}/api/auth/oidc/").json()
    assert offer["enabled"] is False
    refused = subprocess.run(
        [str(PW), "auth", "login", "--sso"],
        env=pw_env(live_server, tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert refused.returncode == 1 and "does not offer single sign-on" in refused.stderr


def device_id_token(provider: Provider) -> str:
    """An ID token for the command line's client, by the device grant, confirmed as carol."""
    with httpx.Client(timeout=20) as http:
        started = http.post(
            f"{provider.issuer}/device/auth",
            data={"client_id": provider.cli.client_id, "scope": "openid profile"},
        ).json()
        complete_device_flow(started["verification_uri_complete"], CAROL)
        tokens = http.post(
            f"{provider.issuer}/token",
            data={
                "grant_type": DEVICE_GRANT,
                "device_code": started["device_code"],
                "client_id": provider.cli.client_id,
            },
        ).json()
    return str(tokens["id_token"])


def test_an_id_token_buys_one_key_and_a_replay_of_it_none(
    provider: Provider, live_server: Any
) -> None:
    token = device_id_token(provider)
    exchange = f"{live_server.url}/api/auth/oidc/"

    first = httpx.post(exchange, json={"id_token": token}, timeout=20)
    again = httpx.post(exchange, json={"id_token": token}, timeout=20)

    assert first.status_code == 200, first.text
    assert again.status_code == 403 and "already exchanged" in again.text
    assert ApiKey.objects.filter(user__username="PWCarol").count() == 1
