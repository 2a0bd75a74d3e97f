"""pw auth login: an API key checked against the platform and stored, or one got by signing in
with the site's single sign-on (the provider's device authorization grant, RFC 8628): a code
to confirm in any browser, then the provider's ID token exchanged at the platform for a key
that expires and cannot make keys."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from typing import Any

import httpx

from activate_cli.client import TIMEOUT_SECONDS, USER_AGENT, ApiClient
from activate_cli.config import HOST_ENV, KEY_ENV, Config, normalize_host, write_credentials
from activate_cli.errors import CliError, Unreachable

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEFAULT_INTERVAL = 5.0
SLOW_DOWN_STEP = 5.0


def ask(prompt: str, *, secret: bool = False) -> str:
    try:
        answer = getpass.getpass(prompt) if secret else input(prompt)
    except EOFError:
        answer = ""
    if not answer.strip():
        raise CliError(f"no {prompt.rstrip(': ').lower()} given")
    return answer.strip()


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def sign_on_offer(host: str) -> dict[str, Any]:
    """What the platform says of its single sign-on (``enabled``, ``issuer``, ``client_id``,
    ``scopes``); a platform without it, or an older one, offers none."""
    with ApiClient(Config(platform_host=host, api_key="")) as client:
        offer = client.get("/auth/oidc/", not_found="no single sign-on")
    return offer if isinstance(offer, dict) else {}


def _provider_json(http: httpx.Client, method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    try:
        response = http.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise Unreachable(f"cannot reach the sign-on provider at {url} ({exc})") from None
    try:
        return response.status_code, response.json()
    except ValueError:
        raise CliError(
            f"the sign-on provider answered {url} with HTTP {response.status_code}, not JSON"
        ) from None


def _error_of(body: Any) -> str:
    return str(body.get("error") or "") if isinstance(body, dict) else ""


def _poll_for_tokens(
    http: httpx.Client, token_endpoint: str, client_id: str, grant: dict[str, Any]
) -> dict[str, Any]:
    interval = float(grant.get("interval") or DEFAULT_INTERVAL)
    deadline = time.monotonic() + float(grant.get("expires_in") or 600)
    form = {"grant_type": DEVICE_GRANT, "device_code": grant["device_code"], "client_id": client_id}
    while True:
        time.sleep(interval)
        code, body = _provider_json(http, "POST", token_endpoint, data=form)
        error = _error_of(body)
        if code == 200 and isinstance(body, dict):
            return body
        if error == "authorization_pending":
            pass
        elif error == "slow_down":
            interval += SLOW_DOWN_STEP
        elif error == "expired_token":
            raise CliError("the code expired before it was confirmed; run `pw auth login` again")
        elif error == "access_denied":
            raise CliError("the sign-in was refused at the provider")
        else:
            detail = body.get("error_description") if isinstance(body, dict) else None
            raise CliError(f"the sign-on provider refused the sign-in: {detail or error or code}")
        if time.monotonic() > deadline:
            raise CliError("the code expired before it was confirmed; run `pw auth login` again")


def device_sign_in(host: str, offer: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Run the device grant with the platform's CLI client; the provider's ID token, and the
    platform's answer to it (``key``, ``username``, ``expires_at``)."""
    issuer, client_id = str(offer.get("issuer") or ""), str(offer.get("client_id") or "")
    scopes = str(offer.get("scopes") or "openid")
    with httpx.Client(timeout=TIMEOUT_SECONDS, headers={"User-Agent": USER_AGENT}) as http:
        discovery_url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        code, discovery = _provider_json(http, "GET", discovery_url)
        if code != 200 or not isinstance(discovery, dict) or discovery.get("issuer") != issuer:
            raise CliError(f"{discovery_url} is not the discovery document of {issuer}")
        device_endpoint = discovery.get("device_authorization_endpoint")
        token_endpoint = discovery.get("token_endpoint")
        if not device_endpoint or not token_endpoint:
            raise CliError(f"the sign-on provider {issuer} offers no sign-in by code")
        code, grant = _provider_json(
            http, "POST", str(device_endpoint), data={"client_id": client_id, "scope": scopes}
        )
        if code != 200 or not isinstance(grant, dict) or "device_code" not in grant:
            raise CliError(f"the sign-on provider refused to start a sign-in: {_error_of(grant)}")
        say(f"To sign in, open {grant['verification_uri']} and enter the code {grant['user_code']}")
        if grant.get("verification_uri_complete"):
            say(f"  or open {grant['verification_uri_complete']}")
        say("Waiting for the sign-in to be confirmed...")
        tokens = _poll_for_tokens(http, str(token_endpoint), client_id, grant)
    id_token = tokens.get("id_token")
    if not isinstance(id_token, str):
        raise CliError("the sign-on provider gave no ID token (is the scope openid asked for?)")
    with ApiClient(Config(platform_host=host, api_key="")) as client:
        answer = client.post("/auth/oidc/", {"id_token": id_token})
    return id_token, answer


def login(args: argparse.Namespace) -> int:
    host = normalize_host(args.platform_host or os.environ.get(HOST_ENV) or ask("Platform host: "))
    key = args.api_key or (None if args.sso else os.environ.get(KEY_ENV))
    if not key:
        try:
            offer = sign_on_offer(host)
        except CliError:
            if args.sso:
                raise
            offer = {}
        if offer.get("enabled"):
            if not args.sso:
                say("This platform offers single sign-on (pass --api-key to use a key instead).")
            _, answer = device_sign_in(host, offer)
            config = Config(platform_host=host, api_key=str(answer["key"]))
            path = write_credentials(config)
            print(
                f"Logged in to {host} as {answer.get('username')} until "
                f"{answer.get('expires_at')}; key saved in {path}"
            )
            return 0
        if args.sso:
            raise CliError(f"{host} does not offer single sign-on; log in with an API key")
    key = key or ask("API key: ", secret=True)
    config = Config(platform_host=host, api_key=key.strip())
    with ApiClient(config) as client:
        me = client.get("/me/")
    path = write_credentials(config)
    print(f"Logged in to {config.platform_host} as {me.get('username')}; key saved in {path}")
    return 0


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    auth = commands.add_parser(
        "auth", help="log in with single sign-on or an API key", parents=[common]
    )
    sub = auth.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser(
        "login",
        help="sign in (single sign-on when the platform offers it) or check an API key, and save "
        "the key for later commands",
        parents=[common],
    )
    way = p.add_mutually_exclusive_group()
    way.add_argument("--api-key", help=f"default: {KEY_ENV}, else asked for")
    way.add_argument(
        "--sso",
        action="store_true",
        help="sign in with the site's single sign-on: a code to confirm in a browser",
    )
    p.set_defaults(run=login, needs_client=False)
