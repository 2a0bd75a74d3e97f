"""Public ids, job names and agent secrets: how a worker is named and recognised."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings

PUBLIC_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"


def generate_public_id() -> str:
    return "w" + "".join(secrets.choice(PUBLIC_ID_ALPHABET) for _ in range(10))


def job_name_prefix() -> str:
    return f"pw-worker-{settings.ACTIVATE_INSTALLATION_ID}-"


def job_name_for(public_id: str) -> str:
    return job_name_prefix() + public_id


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_agent_secret() -> tuple[str, str]:
    """A secret for one worker's job, and the hash the server keeps."""
    secret = secrets.token_urlsafe(32)
    return secret, hash_secret(secret)
