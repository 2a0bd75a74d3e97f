"""The platform's single sign-on pointed at a real provider (harness.identity, scripts/idp):
the settings and /oidc/ URLs it would have with ACTIVATE_OIDC_ISSUER set, for the live test
server of pytest-django (which serves this process's settings)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from django.conf import settings
from django.test import override_settings
from django.urls import clear_url_caches

import activate.urls
from harness.identity import (
    IdentityUser,
    Provider,
    cli_client,
    follow_on_provider,
    sign_in,
    start_provider,
    web_client,
)
from identity.oidc import forget_providers

OIDC_BACKEND = "identity.oidc.OidcBackend"


def _urls_again() -> None:
    importlib.reload(activate.urls)
    clear_url_caches()


@contextmanager
def sso_platform(live_url: str, **more: Any) -> Iterator[Provider]:
    """A provider with the platform's web client (its callback and post-logout URIs on
    ``live_url``) and the CLI's, and the platform configured for both."""
    provider = start_provider(
        clients=[
            web_client(f"{live_url}/oidc/callback/", post_logout_redirect_uri=f"{live_url}/login/"),
            cli_client(),
        ]
    )
    overrides = {
        "ACTIVATE_OIDC_ISSUER": provider.issuer,
        "ACTIVATE_OIDC_CLIENT_ID": provider.web.client_id,
        "ACTIVATE_OIDC_CLIENT_SECRET": provider.web.client_secret,
        "OIDC_RP_CLIENT_ID": provider.web.client_id,
        "OIDC_RP_CLIENT_SECRET": provider.web.client_secret,
        "ACTIVATE_OIDC_CLI_CLIENT_ID": provider.cli.client_id,
        "ACTIVATE_OIDC_LABEL": "Test IdP",
        "AUTHENTICATION_BACKENDS": [*settings.AUTHENTICATION_BACKENDS, OIDC_BACKEND],
        **more,
    }
    forget_providers()
    try:
        with override_settings(**overrides):
            _urls_again()
            yield provider
    finally:
        forget_providers()
        _urls_again()
        provider.stop()


def browser_sign_in(http: httpx.Client, live_url: str, person: IdentityUser) -> httpx.Response:
    """A person's browser, by script: the platform's SSO button, the provider's login page,
    back to the platform's callback; the platform's answer to the callback (not followed)."""
    start = http.get(f"{live_url}/oidc/authenticate/")
    assert start.status_code == 302, start.text
    login_page = follow_on_provider(http, http.get(start.headers["location"]))
    assert login_page.status_code == 200, login_page.text
    back = sign_in(http, login_page, person)
    assert back.is_redirect and back.headers["location"].startswith(live_url), back.text
    return http.get(back.headers["location"])
