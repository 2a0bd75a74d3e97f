"""Agents sign every request and the platform signs every answer (HMAC-SHA256).

A job is given once, inside its script, a key id and a key. The key is
HMAC(platform key, "agent:<worker public id>:<key id>"): the platform derives it again from what
a request names and stores only its SHA-256 (the worker's ``agent_secret_hash``, replaced at
every submission attempt, so an older job's key stops working). On the wire travel the worker
id, key id, a timestamp, a nonce and the signature; none of them works for another request.

A request's signature covers method, path, timestamp, nonce and the body's SHA-256; the
timestamp must be within ``ACTIVATE_AGENT_SIGNATURE_WINDOW`` of this server's clock, the nonce
unseen, and no later request of the same key accepted already (an agent's timestamps go
strictly up; both are remembered in Redis for twice the window), so a request held back by
someone on the way is worthless once the agent has been heard again. Answers are signed only
for requests that passed those checks, so nobody can obtain a signed answer for a nonce the
agent chose.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from django.conf import settings

from workers_app.agents.heartbeats import HeartbeatStore, Nonce
from workers_app.agents.service import AgentRefused
from workers_app.models import hash_secret

SCHEME = "ActivateHMAC"
SIGNATURE_HEADER = "X-Activate-Signature"
NONCE_PREFIX = "activate:nonce:"
ORDER_PREFIX = "activate:agent-order:"
WORKER_ID = re.compile(r"[a-z0-9]{1,16}")
TOKEN = re.compile(r"[A-Za-z0-9_\-]{16,64}")
TIMESTAMP = re.compile(r"([0-9]{1,12})(?:\.([0-9]{1,6}))?")
SIGNATURE = re.compile(r"[0-9a-f]{64}")
FIELDS = ("worker", "key", "ts", "nonce", "sig")


class Unauthenticated(AgentRefused):
    """The request is not proven to come from the worker's job: answered 401, never signed."""

    def __init__(self, message: str) -> None:
        super().__init__(401, message)


@dataclass(frozen=True)
class AgentKey:
    """What a job is given (key id and key) and what the platform keeps (the key's hash)."""

    key_id: str
    key: str
    key_hash: str


@dataclass(frozen=True)
class SignedCall:
    """A request whose signature, timestamp and form were checked (its nonce not yet)."""

    worker: str
    key_id: str
    nonce: str
    seq: int  # its time in microseconds: an agent's requests go strictly up
    key: bytes

    @property
    def key_hash(self) -> str:
        return hash_secret(self.key.decode())


@functools.cache
def _platform_key(secret_key: str) -> bytes:
    return hmac.digest(secret_key.encode(), b"activate agent keys", "sha256")


def derive_key(public_id: str, key_id: str, *, secret_key: str | None = None) -> str:
    platform_key = _platform_key(secret_key or settings.SECRET_KEY)
    return hmac.digest(platform_key, f"agent:{public_id}:{key_id}".encode(), "sha256").hex()


def issue_agent_key(public_id: str, *, secret_key: str | None = None) -> AgentKey:
    """A fresh key for one submission attempt of a worker's job."""
    key_id = secrets.token_urlsafe(18)
    key = derive_key(public_id, key_id, secret_key=secret_key)
    return AgentKey(key_id=key_id, key=key, key_hash=hash_secret(key))


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def request_signature(key: bytes, method: str, path: str, ts: str, nonce: str, body: bytes) -> str:
    message = f"{method}\n{path}\n{ts}\n{nonce}\n{body_digest(body)}".encode()
    return hmac.digest(key, message, "sha256").hex()


def answer_signature(key: bytes, status: int, nonce: str, body: bytes) -> str:
    message = f"{status}\n{nonce}\n{body_digest(body)}".encode()
    return hmac.digest(key, message, "sha256").hex()


def _fields(header: str) -> dict[str, str]:
    scheme, _, rest = header.partition(" ")
    if scheme.lower() == "bearer":
        raise Unauthenticated(
            f"agents sign their requests ({SCHEME}); a bearer secret is not accepted"
        )
    if scheme != SCHEME:
        raise Unauthenticated(f"missing {SCHEME} authorization")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name in fields:
            raise Unauthenticated("malformed authorization")
        fields[name] = value
    if sorted(fields) != sorted(FIELDS):
        raise Unauthenticated("malformed authorization")
    return fields


def verify_request(header: str, method: str, path: str, body: bytes, *, now: float) -> SignedCall:
    """The checked claim of a signed request; Unauthenticated (401) if anything is off."""
    fields = _fields(header)
    worker, key_id, ts, nonce, sig = (fields[name] for name in FIELDS)
    when = TIMESTAMP.fullmatch(ts)
    if not (
        WORKER_ID.fullmatch(worker)
        and TOKEN.fullmatch(key_id)
        and TOKEN.fullmatch(nonce)
        and when
        and SIGNATURE.fullmatch(sig)
    ):
        raise Unauthenticated("malformed authorization")
    key = derive_key(worker, key_id).encode()
    if not hmac.compare_digest(request_signature(key, method, path, ts, nonce, body), sig):
        raise Unauthenticated("bad signature")
    seconds, fraction = when.group(1), when.group(2) or ""
    seq = int(seconds) * 1_000_000 + int(fraction.ljust(6, "0"))
    if abs(now - seq / 1e6) > settings.ACTIVATE_AGENT_SIGNATURE_WINDOW:
        raise Unauthenticated("timestamp outside the accepted window (check the node's clock)")
    return SignedCall(worker=worker, key_id=key_id, nonce=nonce, seq=seq, key=key)


def nonce_of(call: SignedCall) -> Nonce:
    return Nonce(
        key=f"{NONCE_PREFIX}{call.worker}:{call.nonce}",
        order_key=f"{ORDER_PREFIX}{call.worker}:{call.key_id}",
        seq=call.seq,
        ttl=int(2 * settings.ACTIVATE_AGENT_SIGNATURE_WINDOW) + 1,
    )


def consume_nonce(call: SignedCall) -> None:
    """Remember the request; Unauthenticated if it is not fresh (a replay, or a request held
    back on the way and sent after a later one of the same agent)."""
    if not HeartbeatStore().fresh(nonce_of(call)):
        raise Unauthenticated("replayed request")


def sign_answer(call: SignedCall, status: int, body: bytes) -> str:
    return answer_signature(call.key, status, call.nonce, body)
