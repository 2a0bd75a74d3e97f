"""Cluster private keys are stored encrypted with a key derived from the project's secret."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class KeyDecryptionError(Exception):
    """The stored key was encrypted under another ACTIVATE_SECRET_KEY."""


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"activate-cluster-keys:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt_private_key(pem: str) -> str:
    return _fernet().encrypt(pem.encode()).decode()


def decrypt_private_key(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise KeyDecryptionError(
            "the cluster's private key cannot be decrypted; was ACTIVATE_SECRET_KEY changed?"
        ) from None
