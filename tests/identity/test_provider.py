"""The tests' OpenID provider (scripts/idp, oidc-provider) does what the platform's single
sign-on and `pw auth login` will rely on: discovery, the authorization code flow with PKCE
through its own login page, the device flow, signed ID tokens with the people's claims,
RP-initiated logout and revocation. Driven by script, as the harness's helpers do it."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from harness.identity import (
    CAROL,
    DEVICE_GRANT,
    FRANK,
    WRONG_PASSWORD,
    IdentityUser,
    Provider,
    complete_device_flow,
    follow_on_provider,
    sign_in,
    sign_out,
    start_provider,
)


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with start_provider() as running:
        yield running


@pytest.fixture(scope="module")
def discovery(provider: Provider) -> dict[str, Any]:
    return provider.discovery()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verified_claims(token: str, jwks_uri: str) -> dict[str, Any]:
    """The ID token's claims once its RS256 signature checks out against the provider's JWKS."""
    header, payload, signature = token.split(".")
    kid = json.loads(unb64url(header))["kid"]
    jwk = next(k for k in httpx.get(jwks_uri).json()["keys"] if k["kid"] == kid)
    public = rsa.RSAPublicNumbers(
        int.from_bytes(unb64url(jwk["e"])), int.from_bytes(unb64url(jwk["n"]))
    ).public_key()
    public.verify(
        unb64url(signature), f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256()
    )
    return dict(json.loads(unb64url(payload)))


class Login:
    """One authorization request of the web client, with its PKCE verifier, state and nonce."""

    def __init__(self, provider: Provider, discovery: dict[str, Any]) -> None:
        self.provider = provider
        self.discovery = discovery
        self.verifier = secrets.token_urlsafe(48)
        self.state = secrets.token_urlsafe(8)
        self.nonce = secrets.token_urlsafe(8)

    def url(self, *, pkce: bool = True) -> str:
        params = {
            "client_id": self.provider.web.client_id,
            "response_type": "code",
            "scope": "openid profile email groups",
            "redirect_uri": self.provider.web.redirect_uris[0],
            "state": self.state,
            "nonce": self.nonce,
            "code_challenge": b64url(hashlib.sha256(self.verifier.encode()).digest()),
            "code_challenge_method": "S256",
        }
        if not pkce:
            del params["code_challenge"], params["code_challenge_method"]
        return f"{self.discovery['authorization_endpoint']}?{urlencode(params)}"

    def tokens(self, code: str, verifier: str | None = None) -> httpx.Response:
        web = self.provider.web
        assert web.client_secret is not None
        return httpx.post(
            self.discovery["token_endpoint"],
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": web.redirect_uris[0],
                "code_verifier": verifier or self.verifier,
            },
            auth=(web.client_id, web.client_secret),
        )


def callback_query(response: httpx.Response) -> dict[str, str]:
    assert response.status_code in (302, 303), response.text
    return {k: v[0] for k, v in parse_qs(urlparse(response.headers["location"]).query).items()}


def test_discovery_offers_pkce_s256_the_device_flow_and_logout(
    provider: Provider, discovery: dict[str, Any]
) -> None:
    assert discovery["issuer"] == provider.issuer
    assert discovery["code_challenge_methods_supported"] == ["S256"]
    assert discovery["device_authorization_endpoint"] == f"{provider.issuer}/device/auth"
    assert discovery["end_session_endpoint"] == f"{provider.issuer}/session/end"
    assert discovery["revocation_endpoint"]
    assert discovery["jwks_uri"] == provider.jwks_uri
    assert {"preferred_username", "groups", "email"} <= set(discovery["claims_supported"])


def test_code_flow_with_pkce_through_the_login_page(
    provider: Provider, discovery: dict[str, Any]
) -> None:
    login = Login(provider, discovery)
    with httpx.Client(timeout=10) as http:
        # Given the provider's own login page
        page = follow_on_provider(http, http.get(login.url()))
        assert page.status_code == 200 and 'name="login"' in page.text
        assert '<button type="submit">Sign in</button>' in page.text
        # When the password is wrong, the page says so and nothing goes back to the client
        wrong = sign_in(http, page, IdentityUser(CAROL.login, "not-carols", {}))
        assert wrong.status_code == 200 and WRONG_PASSWORD in wrong.text
        # Then with the right one the browser goes back with a code and the state
        back = sign_in(http, wrong, CAROL)
    query = callback_query(back)
    assert back.headers["location"].startswith(provider.web.redirect_uris[0])
    assert query["state"] == login.state and query["iss"] == provider.issuer
    # And the code needs the PKCE verifier it was asked with
    assert login.tokens(query["code"], verifier=secrets.token_urlsafe(48)).status_code == 400
    # (a code is good once: the wrong verifier spent it) so once more, rightly
    with httpx.Client(timeout=10) as http:
        back = sign_in(http, follow_on_provider(http, http.get(login.url())), CAROL)
    tokens = login.tokens(callback_query(back)["code"])
    assert tokens.status_code == 200, tokens.text
    claims = verified_claims(tokens.json()["id_token"], provider.jwks_uri)
    assert claims["iss"] == provider.issuer and claims["aud"] == provider.web.client_id
    assert claims["nonce"] == login.nonce
    assert claims["sub"] == CAROL.sub
    assert claims["preferred_username"] == "PWCarol"
    assert claims["groups"] == ["hpc-users"]
    assert claims["email"] == "carol@activate.test"


def test_an_authorization_request_without_pkce_is_refused(
    provider: Provider, discovery: dict[str, Any]
) -> None:
    with httpx.Client(timeout=10) as http:
        refused = http.get(Login(provider, discovery).url(pkce=False))
    assert refused.status_code in (302, 303)
    assert callback_query(refused)["error"] == "invalid_request"


def test_the_device_flow_completed_by_script(provider: Provider, discovery: dict[str, Any]) -> None:
    # Given a device code asked for by the public command-line client
    started = httpx.post(
        discovery["device_authorization_endpoint"],
        data={"client_id": provider.cli.client_id, "scope": "openid profile groups"},
    ).json()
    poll = {
        "grant_type": DEVICE_GRANT,
        "device_code": started["device_code"],
        "client_id": provider.cli.client_id,
    }
    pending = httpx.post(discovery["token_endpoint"], data=poll)
    assert pending.json()["error"] == "authorization_pending"
    # When the person opens the link, confirms the code and signs in
    done = complete_device_flow(started["verification_uri_complete"], FRANK)
    assert done.status_code == 200
    # Then the command line's next poll gets their tokens
    tokens = httpx.post(discovery["token_endpoint"], data=poll)
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["refresh_token"]
    claims = verified_claims(tokens.json()["id_token"], provider.jwks_uri)
    assert claims["aud"] == provider.cli.client_id
    assert (claims["preferred_username"], claims["groups"]) == ("frank.other", ["other"])


def active(discovery: dict[str, Any], token: str, auth: tuple[str, str]) -> bool:
    answer = httpx.post(discovery["introspection_endpoint"], data={"token": token}, auth=auth)
    return bool(answer.json()["active"])


def test_a_revoked_access_token_is_no_longer_active(
    provider: Provider, discovery: dict[str, Any]
) -> None:
    login = Login(provider, discovery)
    web = provider.web
    assert web.client_secret is not None
    auth = (web.client_id, web.client_secret)
    with httpx.Client(timeout=10) as http:
        back = sign_in(http, follow_on_provider(http, http.get(login.url())), CAROL)
    token = login.tokens(callback_query(back)["code"]).json()["access_token"]
    assert active(discovery, token, auth)
    revoked = httpx.post(discovery["revocation_endpoint"], data={"token": token}, auth=auth)
    assert revoked.status_code == 200
    assert not active(discovery, token, auth)


def test_logout_ends_the_providers_session_and_its_tokens(
    provider: Provider, discovery: dict[str, Any]
) -> None:
    login = Login(provider, discovery)
    web = provider.web
    assert web.client_secret is not None
    with httpx.Client(timeout=10) as http:
        # Given a person signed in: a second request needs no password
        back = sign_in(http, follow_on_provider(http, http.get(login.url())), CAROL)
        tokens = login.tokens(callback_query(back)["code"]).json()
        again = follow_on_provider(http, http.get(Login(provider, discovery).url()))
        assert "code" in callback_query(again)
        # When the client sends them to the end-session endpoint and they confirm
        end_session = urlencode(
            {
                "id_token_hint": tokens["id_token"],
                "post_logout_redirect_uri": web.post_logout_redirect_uris[0],
                "state": "after-logout",
            }
        )
        ended = sign_out(http, f"{discovery['end_session_endpoint']}?{end_session}")
        # Then they go back to the client, and the next login asks for the password again
        assert ended.headers["location"] == f"{web.post_logout_redirect_uris[0]}?state=after-logout"
        page = follow_on_provider(http, http.get(Login(provider, discovery).url()))
        assert page.status_code == 200 and 'name="password"' in page.text
    # And the session's access token (no offline_access asked) ended with it
    assert not active(discovery, tokens["access_token"], (web.client_id, web.client_secret))
