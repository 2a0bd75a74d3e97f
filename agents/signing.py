"""Agents sign every request and the platform signs every answer (HMAC-SHA256).

A job is given once, inside its script, a key id and a key (workers_app/agent_keys.py), which
is derived again here from what a request names and checked against the SHA-256 the platform
stores. On the wire travel the worker id, key id, a timestamp, a nonce and the signature; none
of them works for another request.

A request's signature covers method, path, timestamp, nonce and the body's SHA-256; the
timestamp must be within ``ACTIVATE_AGENT_SIGNATURE_WINDOW`` of Redis's clock (checked in the
same script as the nonce, agents/beats.py: one clock for every host of the platform), the nonce
unseen, and no later request of the same key accepted already (an agent's timestamps go
strictly up; both are remembered in Redis for twice the window), so a request held back by
someone on the way is worthless once the agent has been heard again. Answers are signed only
for requests that passed those checks, so nobody can obtain a signed answer for a nonce the
agent chose; but for one: a request signed with the worker's own key whose timestamp is outside
the window is refused with a signed 425 carrying the platform's time (``TimeRefused``), nothing
done and its nonce not remembered, so an agent whose node clock stepped re-bases and signs again
at once. That answer only tells the time, and only to a request signed with the worker's key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from typing import NamedTuple

from django.conf import settings

from agents.beats import AgentBeats, Nonce
from agents.errors import AgentRefused, TimeRefused
from workers_app.agent_keys import derive_key
from workers_app.models import hash_secret

SCHEME = "ActivateHMAC"
SIGNATURE_HEADER = "X-Activate-Signature"
NONCE_PREFIX = "activate:nonce:"
ORDER_PREFIX = "activate:agent-order:"
# The whole header, its fields in the order agents send them: one match on the hot path.
HEADER = re.compile(
    SCHEME + r" worker=([a-z0-9]{1,16}), key=([A-Za-z0-9_\-]{16,64}), "
    r"ts=(([0-9]{1,12})(?:\.([0-9]{1,6}))?), nonce=([A-Za-z0-9_\-]{16,64}), sig=([0-9a-f]{64})"
)


class Unauthenticated(AgentRefused):
    """The request is not proven to come from the worker's job: answered 401, never signed."""

    def __init__(self, message: str) -> None:
        super().__init__(401, message)


class SignedCall(NamedTuple):
    """A request whose signature, timestamp and form were checked (its nonce not yet)."""

    worker: str
    key_id: str
    nonce: str
    seq: int  # its time in microseconds: an agent's requests go strictly up
    key: bytes
    key_hash: str


@functools.lru_cache(maxsize=65536)
def _derived(secret_key: str, public_id: str, key_id: str) -> tuple[bytes, str]:
    # Every beat of an agent derives the same key: once per process is enough.
    key = derive_key(public_id, key_id, secret_key=secret_key)
    return key.encode(), hash_secret(key)


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def request_signature(key: bytes, method: str, path: str, ts: str, nonce: str, body: bytes) -> str:
    message = f"{method}\n{path}\n{ts}\n{nonce}\n{body_digest(body)}".encode()
    return hmac.digest(key, message, "sha256").hex()


# Answers are a few bodies over and over ({"status": "ok"} above all).
_answer_digest = functools.lru_cache(maxsize=1024)(body_digest)


def answer_signature(key: bytes, status: int, nonce: str, body: bytes) -> str:
    message = f"{status}\n{nonce}\n{_answer_digest(body)}".encode()
    return hmac.digest(key, message, "sha256").hex()


def _malformed(header: str) -> Unauthenticated:
    scheme = header.partition(" ")[0]
    if scheme.lower() == "bearer":
        return Unauthenticated(
            f"agents sign their requests ({SCHEME}); a bearer secret is not accepted"
        )
    if scheme != SCHEME:
        return Unauthenticated(f"missing {SCHEME} authorization")
    return Unauthenticated("malformed authorization")


def verify_request(
    header: str, method: str, path: str, body: bytes, *, now: float | None = None
) -> SignedCall:
    """The checked claim of a signed request; Unauthenticated (401) if anything is off. Its time
    is checked against ``now`` if given (TimeRefused), else with its nonce against Redis's."""
    match = HEADER.fullmatch(header)
    if match is None:
        raise _malformed(header)
    worker, key_id, ts, seconds, fraction, nonce, sig = match.groups()
    key, key_hash = _derived(settings.SECRET_KEY, worker, key_id)
    if not hmac.compare_digest(request_signature(key, method, path, ts, nonce, body), sig):
        raise Unauthenticated("bad signature")
    seq = int(seconds) * 1_000_000 + int((fraction or "").ljust(6, "0"))
    if now is not None and abs(now - seq / 1e6) > settings.ACTIVATE_AGENT_SIGNATURE_WINDOW:
        raise TimeRefused(now)
    return SignedCall(
        worker=worker, key_id=key_id, nonce=nonce, seq=seq, key=key, key_hash=key_hash
    )


def nonce_of(call: SignedCall) -> Nonce:
    return Nonce(
        key=f"{NONCE_PREFIX}{call.worker}:{call.nonce}",
        order_key=f"{ORDER_PREFIX}{call.worker}:{call.key_id}",
        seq=call.seq,
        ttl=int(2 * settings.ACTIVATE_AGENT_SIGNATURE_WINDOW) + 1,
        value=call.nonce,
        window=int(settings.ACTIVATE_AGENT_SIGNATURE_WINDOW * 1_000_000),
    )


def consume_nonce(call: SignedCall) -> None:
    """Remember the request; Unauthenticated if it is not fresh (a replay, or a request held
    back on the way and sent after a later one of the same agent); TimeRefused if its time is
    outside the window of Redis's clock."""
    if not AgentBeats().fresh(nonce_of(call)):
        raise Unauthenticated("replayed request")


def sign_answer(call: SignedCall, status: int, body: bytes) -> str:
    return answer_signature(call.key, status, call.nonce, body)
