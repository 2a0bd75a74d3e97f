"""The ID token checks (identity.oidc.verify_id_token), token by token: made with PyJWT and keys
of our own, served as a JWKS over real HTTP, and a forgery in the real provider's name."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from harness.identity import Provider as RealProvider
from harness.identity import start_provider
from identity.oidc import (
    Provider,
    ProviderUnavailable,
    TokenRefused,
    discover,
    forget_providers,
    verify_id_token,
)

ISSUER = "https://idp.example.test"
AUDIENCE = "activate-web"
NONCE = "n-0S6_WzA2Mj"
KID = "test-key-1"


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def provider(rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey) -> Iterator[Provider]:
    """A JWKS endpoint (real HTTP on loopback) publishing our RSA and EC public keys."""
    keys = []
    for kid, key, alg in ((KID, rsa_key, "RS256"), ("ec-1", ec_key, "ES256")):
        jwk = json.loads(jwt.algorithms.get_default_algorithms()[alg].to_jwk(key.public_key()))
        keys.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})
    body = json.dumps({"keys": keys}).encode()

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    forget_providers()
    yield Provider(
        issuer=ISSUER,
        authorization_endpoint=f"{ISSUER}/auth",
        token_endpoint=f"{ISSUER}/token",
        jwks_uri=f"http://127.0.0.1:{server.server_port}/jwks",
    )
    server.shutdown()
    forget_providers()


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice-1",
        "iat": now,
        "exp": now + 300,
        "nonce": NONCE,
        "preferred_username": "alice",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def token(key: Any, *, alg: str = "RS256", kid: str = KID, **changes: Any) -> str:
    return jwt.encode(claims(**changes), key, algorithm=alg, headers={"kid": kid})


def check(provider: Provider, raw: str, *, nonce: str | None = NONCE) -> dict[str, Any]:
    return verify_id_token(raw, audience=AUDIENCE, nonce=nonce, provider=provider)


def test_a_good_token_passes_with_rs256_and_es256(
    provider: Provider, rsa_key: Any, ec_key: Any
) -> None:
    assert check(provider, token(rsa_key))["sub"] == "alice-1"
    assert check(provider, token(ec_key, alg="ES256", kid="ec-1"))["sub"] == "alice-1"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"aud": "someone-else"}, r"(?i)audience"),
        ({"aud": ["someone-else", AUDIENCE]}, "issued to"),
        ({"aud": [AUDIENCE, "other"], "azp": "other"}, "issued to"),
        ({"iss": "https://evil.example.test"}, r"(?i)issuer"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, r"(?i)expired"),
        ({"iat": None}, "iat"),
        ({"exp": None}, "exp"),
        ({"nonce": "an-old-sign-ins"}, "nonce"),
        ({"nonce": None}, "nonce"),
    ],
)
def test_a_token_failing_one_check_is_refused(
    provider: Provider, rsa_key: Any, changes: dict[str, Any], reason: str
) -> None:
    with pytest.raises(TokenRefused, match=reason):
        check(provider, token(rsa_key, **changes))


def test_several_audiences_pass_when_we_are_the_authorised_party(
    provider: Provider, rsa_key: Any
) -> None:
    assert check(provider, token(rsa_key, aud=[AUDIENCE, "api"], azp=AUDIENCE))


def test_a_token_signed_by_another_key_under_the_providers_key_id_is_refused(
    provider: Provider,
) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(TokenRefused, match=r"(?i)signature"):
        check(provider, token(stranger))


def test_symmetric_and_unsigned_tokens_are_refused(provider: Provider) -> None:
    with pytest.raises(TokenRefused, match="HS256"):
        check(provider, token("the-client-secret-as-a-key-0123456789", alg="HS256"))
    unsigned = jwt.encode(claims(), None, algorithm="none")
    with pytest.raises(TokenRefused, match="none"):
        check(provider, unsigned)


def test_a_token_without_nonce_passes_only_where_none_was_sent(
    provider: Provider, rsa_key: Any
) -> None:
    # The device grant (`pw auth login`) sends no nonce; the browser's flow always does.
    assert check(provider, token(rsa_key, nonce=None), nonce=None)
    with pytest.raises(TokenRefused, match="nonce"):
        check(provider, token(rsa_key), nonce="")


@pytest.fixture(scope="module")
def real_provider() -> Iterator[RealProvider]:
    with start_provider() as running:
        yield running


def test_a_forgery_in_the_real_providers_name_is_refused(real_provider: RealProvider) -> None:
    # Given the real provider's key id, and a token in its format signed with another key
    forget_providers()
    found = discover(real_provider.issuer)
    kid = jwt.PyJWKClient(found.jwks_uri).get_jwk_set().keys[0].key_id
    assert kid
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = token(stranger, kid=kid, iss=real_provider.issuer, aud=real_provider.web.client_id)
    # Then the provider's JWKS does not vouch for it
    with pytest.raises(TokenRefused, match=r"(?i)signature"):
        verify_id_token(forged, audience=real_provider.web.client_id, nonce=NONCE, provider=found)
    forget_providers()


def test_discovery_refuses_a_document_naming_another_issuer(real_provider: RealProvider) -> None:
    forget_providers()
    with pytest.raises(ProviderUnavailable, match="calls itself"):
        discover(real_provider.issuer + "/")
    forget_providers()
