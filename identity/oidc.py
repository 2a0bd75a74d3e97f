"""Single sign-on with OpenID Connect: the provider found by discovery, ID tokens checked
strictly, and mozilla-django-oidc's code flow (PKCE, state, nonce) on top.

mozilla-django-oidc runs the authorization code flow well but reads its endpoints from settings
and checks neither the token's issuer nor its audience; both are filled in here. The command
line's device grant ends at the same checks (`verify_id_token`, audience the CLI's client).
"""

from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from identity.sign_in import oidc_user

# Signatures we accept: asymmetric only, so a client secret can never sign a token ("none"
# and HS256 are refused whatever the token's header says).
ALGORITHMS = ("RS256", "ES256")
# Clock difference tolerated between the provider and us, in seconds.
LEEWAY = 60
DISCOVERY_TTL = 300.0
HTTP_TIMEOUT = 10.0
REQUIRED_CLAIMS = ["iss", "aud", "exp", "iat", "sub"]


class ProviderUnavailable(Exception):
    """The provider could not be reached or answered nonsense; trying later may help."""


class TokenRefused(Exception):
    """An ID token that fails a check: never signs anyone in."""


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str = ""
    end_session_endpoint: str = ""
    device_authorization_endpoint: str = ""


_discovered: dict[str, tuple[float, Provider]] = {}
_key_sets: dict[str, jwt.PyJWKClient] = {}
_lock = threading.Lock()


def discovery_url(issuer: str) -> str:
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def discover(issuer: str | None = None) -> Provider:
    """The provider's endpoints from its discovery document, kept for DISCOVERY_TTL seconds.
    The document must name the configured issuer exactly (OpenID Connect Discovery, 4.3)."""
    issuer = issuer or settings.ACTIVATE_OIDC_ISSUER
    now = time.monotonic()
    with _lock:
        cached = _discovered.get(issuer)
    if cached is not None and now - cached[0] < DISCOVERY_TTL:
        return cached[1]
    try:
        response = httpx.get(discovery_url(issuer), timeout=HTTP_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ProviderUnavailable(f"cannot read the provider's discovery document: {exc}") from None
    if not isinstance(document, dict) or document.get("issuer") != issuer:
        found = document.get("issuer") if isinstance(document, dict) else None
        raise ProviderUnavailable(f"the provider calls itself {found!r}, not {issuer!r}")
    try:
        provider = Provider(
            issuer=issuer,
            authorization_endpoint=str(document["authorization_endpoint"]),
            token_endpoint=str(document["token_endpoint"]),
            jwks_uri=str(document["jwks_uri"]),
            userinfo_endpoint=str(document.get("userinfo_endpoint") or ""),
            end_session_endpoint=str(document.get("end_session_endpoint") or ""),
            device_authorization_endpoint=str(document.get("device_authorization_endpoint") or ""),
        )
    except KeyError as exc:
        raise ProviderUnavailable(f"the discovery document has no {exc.args[0]}") from None
    with _lock:
        _discovered[issuer] = (now, provider)
    return provider


def forget_providers() -> None:
    """Drop what discovery and the key sets cached (tests start providers of their own)."""
    with _lock:
        _discovered.clear()
        _key_sets.clear()


def _signing_key(provider: Provider, token: str) -> jwt.PyJWK:
    with _lock:
        client = _key_sets.get(provider.jwks_uri)
        if client is None:
            client = jwt.PyJWKClient(
                provider.jwks_uri, lifespan=int(DISCOVERY_TTL), timeout=int(HTTP_TIMEOUT)
            )
            _key_sets[provider.jwks_uri] = client
    try:
        # An unknown key id makes it read the set again (the provider rotated its keys).
        return client.get_signing_key_from_jwt(token)
    except jwt.PyJWKClientConnectionError as exc:
        raise ProviderUnavailable(f"cannot read the provider's keys: {exc}") from None
    except (jwt.PyJWKClientError, jwt.InvalidTokenError) as exc:
        raise TokenRefused(f"no key of the provider's signed it: {exc}") from None


def verify_id_token(
    token: str, *, audience: str, nonce: str | None, provider: Provider | None = None
) -> dict[str, Any]:
    """The claims of ``token`` once every check passed: signed by a key of the provider's
    JWKS with an allowed algorithm, issued by the configured issuer for ``audience`` (and, with
    several audiences, authorised for it), not expired, and carrying ``nonce`` when one was
    sent (the device grant sends none)."""
    provider = provider or discover()
    try:
        algorithm = jwt.get_unverified_header(token).get("alg")
    except jwt.InvalidTokenError as exc:
        raise TokenRefused(f"not a signed token: {exc}") from None
    if algorithm not in ALGORITHMS:
        raise TokenRefused(f"signed with {algorithm!r}; accepted: {', '.join(ALGORITHMS)}")
    key = _signing_key(provider, token)
    if key.algorithm_name != algorithm:
        raise TokenRefused(f"the provider's key is for {key.algorithm_name}, not {algorithm}")
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=[algorithm],
            audience=audience,
            issuer=provider.issuer,
            leeway=LEEWAY,
            options={"require": REQUIRED_CLAIMS},
        )
    except jwt.InvalidTokenError as exc:
        raise TokenRefused(str(exc)) from None
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    authorised = claims.get("azp")
    if (len(audiences) > 1 or authorised is not None) and authorised != audience:
        raise TokenRefused(f"the token was issued to {authorised!r}, not to this client")
    if nonce is not None and not (nonce and hmac.compare_digest(str(claims.get("nonce")), nonce)):
        raise TokenRefused("the token's nonce is not the one this sign-in sent")
    return claims


def claims_with_userinfo(
    claims: dict[str, Any], access_token: str, provider: Provider
) -> dict[str, Any]:
    """The ID token's claims, completed from the userinfo endpoint when a claim we read is
    missing (some providers put groups only there). Userinfo must be about the same subject."""
    wanted = {
        settings.ACTIVATE_OIDC_USERNAME_CLAIM,
        settings.ACTIVATE_OIDC_UNIX_CLAIM,
        settings.ACTIVATE_OIDC_GROUPS_CLAIM,
    }
    if wanted <= claims.keys() or not provider.userinfo_endpoint or not access_token:
        return claims
    try:
        response = httpx.get(
            provider.userinfo_endpoint,
            headers={"Authorization": f"Bearer {access_token}"},
            timeout=HTTP_TIMEOUT,
        )
        response.raise_for_status()
        extra = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ProviderUnavailable(f"cannot read userinfo: {exc}") from None
    if not isinstance(extra, dict) or extra.get("sub") != claims["sub"]:
        raise TokenRefused("userinfo is about another subject than the ID token")
    return {**extra, **claims}


def user_for_id_token(token: str, *, audience: str, nonce: str | None) -> AbstractBaseUser:
    """The platform user an ID token names, made or matched on first sign-in."""
    return oidc_user(verify_id_token(token, audience=audience, nonce=nonce))


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code flow with the endpoints found by discovery, ID tokens
    checked by `verify_id_token`, and people mapped by `identity.sign_in.oidc_user`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Nothing is fetched here: Django makes every backend for every password login too.
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.ACTIVATE_OIDC_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.ACTIVATE_OIDC_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = ALGORITHMS[0]
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.provider: Provider | None = None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if request is None or not request.GET.get("code") or not request.GET.get("state"):
            return None  # a password login, or anything but our callback
        self.provider = discover()
        self.OIDC_OP_TOKEN_ENDPOINT = self.provider.token_endpoint
        self.OIDC_OP_USER_ENDPOINT = self.provider.userinfo_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = self.provider.jwks_uri
        return super().authenticate(request, **kwargs)

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        # The browser's flow always sends a nonce: a missing one ("") refuses every token.
        return verify_id_token(
            token,
            audience=settings.ACTIVATE_OIDC_CLIENT_ID,
            nonce=kwargs.get("nonce") or "",
            provider=self.provider,
        )

    def get_or_create_user(
        self, access_token: str, id_token: str, payload: dict[str, Any]
    ) -> AbstractBaseUser | None:
        assert self.provider is not None  # authenticate() discovered it
        # SignInRefused goes up to the callback view, which says why on the login page.
        return oidc_user(claims_with_userinfo(payload, access_token, self.provider))
