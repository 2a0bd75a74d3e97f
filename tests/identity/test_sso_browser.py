"""Single sign-on in the browser against the real provider (scripts/idp), driven by script as
a browser would: our button, the provider's login page, back to our callback, the Workers page;
and logout ending the provider's session too."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import import_module
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User

from harness.identity import CAROL, FRANK, Provider, sign_out
from identity.models import Identity, Source
from identity.oidc import TokenRefused, forget_providers, verify_id_token
from tests.identity.sso import browser_sign_in, sso_platform

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(live_server: Any) -> Iterator[Provider]:
    with sso_platform(live_server.url) as running:
        yield running


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as client:
        yield client


def id_token_of(http: httpx.Client) -> str:
    """The ID token the platform kept in the browser's session (for the provider's logout)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    session = store(session_key=http.cookies[settings.SESSION_COOKIE_NAME])
    return str(session["oidc_id_token"])


def test_the_login_page_offers_single_sign_on_beside_the_password_form(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    page = http.get(f"{live_server.url}/login/")
    assert page.status_code == 200
    assert "Sign in with Test IdP" in page.text and 'name="password"' in page.text


def test_a_person_of_the_provider_signs_in_and_lands_on_workers(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    # Given carol, who exists only at the provider, and a group the operator gave nobody yet
    Group.objects.create(name="local-operators")
    # When she signs in through the provider's own login page
    landed = browser_sign_in(http, live_server.url, CAROL)
    # Then the platform sends her to Workers, logged in as her preferred_username
    assert landed.status_code == 302 and landed.headers["location"] == "/workers/"
    workers = http.get(f"{live_server.url}/workers/")
    assert workers.status_code == 200 and "PWCarol" in workers.text
    user = User.objects.get(username="PWCarol")
    assert user.email == "carol@activate.test" and not user.has_usable_password()
    identity = Identity.objects.get(user=user)
    assert (identity.source, identity.subject, identity.site_name) == (
        Source.OIDC,
        "carol-0001",
        "PWCarol",
    )
    assert identity.groups == ["hpc-users"]
    assert set(user.groups.values_list("name", flat=True)) == {"hpc-users"}


def test_a_second_sign_in_matches_the_same_user_and_keeps_local_groups(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    browser_sign_in(http, live_server.url, CAROL)
    user = User.objects.get(username="PWCarol")
    # Given an operator's group, and a group the provider listed before but lists no more
    user.groups.add(Group.objects.create(name="local-operators"))
    Identity.objects.filter(user=user).update(groups=["hpc-users", "retired"])
    user.groups.add(Group.objects.create(name="retired"))
    # When she signs in again (another browser)
    with httpx.Client(timeout=20) as again:
        browser_sign_in(again, live_server.url, CAROL)
    # Then she is the same user, in the provider's groups and the operator's, not the retired
    assert User.objects.filter(username="PWCarol").count() == 1
    assert set(user.groups.values_list("name", flat=True)) == {"hpc-users", "local-operators"}


def test_a_disabled_user_is_refused_with_a_message(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    User.objects.create_user("frank.other", is_active=False)
    landed = browser_sign_in(http, live_server.url, FRANK)
    assert landed.headers["location"] == "/login/"
    page = http.get(f"{live_server.url}/login/")
    assert "Single sign-on failed" in page.text and "disabled" in page.text
    assert http.get(f"{live_server.url}/workers/").status_code == 302


def test_an_operators_local_account_is_not_taken_by_a_provider_name_until_linked(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    # Given a local operator whose name the provider also hands out
    operator = User.objects.create_user("PWCarol", password="local-pass-1", is_staff=True)
    # When carol signs in through the provider, she does not become the operator
    landed = browser_sign_in(http, live_server.url, CAROL)
    assert landed.headers["location"] == "/login/"
    assert "an operator&#x27;s local account" in http.get(f"{live_server.url}/login/").text
    assert http.get(f"{live_server.url}/workers/").status_code == 302
    # Until an operator links the two by the provider's subject
    Identity.objects.create(user=operator, source=Source.OIDC, subject=CAROL.sub)
    with httpx.Client(timeout=20) as again:
        assert browser_sign_in(again, live_server.url, CAROL).headers["location"] == "/workers/"


def test_logout_ends_the_providers_session_and_then_home_asks_for_login(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    browser_sign_in(http, live_server.url, CAROL)
    http.get(f"{live_server.url}/workers/")  # the CSRF cookie
    # When she logs out
    out = http.post(
        f"{live_server.url}/logout/",
        headers={"X-CSRFToken": http.cookies["csrftoken"]},
    )
    # Then the platform sends her to the provider's end_session with her ID token as the hint
    assert out.status_code == 302
    end_session = out.headers["location"]
    assert end_session.startswith(f"{provider.issuer}/session/end?")
    assert "id_token_hint=" in end_session
    # And confirming there brings her back to our login page
    back = sign_out(http, end_session)
    assert back.is_redirect and back.headers["location"].startswith(f"{live_server.url}/login/")
    home = http.get(f"{live_server.url}/")
    assert home.headers["location"] == "/login/"
    assert http.get(f"{live_server.url}/workers/").headers["location"].startswith("/login/")
    # And the provider asks for her password again
    again = http.get(f"{live_server.url}/oidc/authenticate/")
    page = http.get(again.headers["location"], follow_redirects=True)
    assert 'name="password"' in page.text


def test_a_real_token_for_the_browser_is_refused_for_another_audience_or_nonce(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    browser_sign_in(http, live_server.url, CAROL)
    token = id_token_of(http)
    claims = verify_id_token(token, audience=provider.web.client_id, nonce=None)
    assert claims["sub"] == "carol-0001"
    # The command line's exchange wants tokens issued to the CLI's client
    refused = httpx.post(f"{live_server.url}/api/auth/oidc/", json={"id_token": token})
    assert refused.status_code == 403 and "audience" in refused.json()["detail"].lower()
    # And an old nonce (another sign-in's) does not pass

    with pytest.raises(TokenRefused, match="nonce"):
        verify_id_token(token, audience=provider.web.client_id, nonce="another-sign-ins")
    assert verify_id_token(token, audience=provider.web.client_id, nonce=claims["nonce"])


def test_a_provider_that_is_down_is_said_on_the_login_page(
    provider: Provider, live_server: Any, http: httpx.Client
) -> None:
    provider.stop()

    forget_providers()
    start = http.get(f"{live_server.url}/oidc/authenticate/")
    assert start.status_code == 302 and start.headers["location"] == "/login/"
    page = http.get(f"{live_server.url}/login/")
    assert "cannot be reached" in page.text
