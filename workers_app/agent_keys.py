"""The key a worker's job is given to sign its agent's requests, issued at every submission.

The key is HMAC(platform key, "agent:<worker public id>:<key id>"): the agents' server derives it
again from what a request names (agents/signing.py), and the platform stores only its SHA-256
(the worker's ``agent_secret_hash``, replaced at every submission attempt, so an older job's key
stops working).
"""

from __future__ import annotations

import functools
import hmac
import secrets
from dataclasses import dataclass

from django.conf import settings

from workers_app.models import hash_secret


@dataclass(frozen=True)
class AgentKey:
    """What a job is given (key id and key) and what the platform keeps (the key's hash)."""

    key_id: str
    key: str
    key_hash: str


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
