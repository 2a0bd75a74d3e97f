"""Paths as the API carries them: bytes on the cluster, a UTF-8 string (``path``) when they are
one, always also urlsafe base64 of the raw bytes (``path_b64``)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from core.errors import ParameterError

MAX_PATH = 4096


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii")


def display(raw: bytes) -> str:
    """What a person reads: UTF-8, with U+FFFD for bytes that are none."""
    return raw.decode("utf-8", "replace")


def path_from(data: Mapping[str, Any], name: str = "path", *, required: bool = True) -> bytes:
    """The path a request names as ``name`` (a string) or ``name``_b64 (its bytes, base64)."""
    encoded, plain = data.get(f"{name}_b64"), data.get(name)
    if encoded not in (None, ""):
        if not isinstance(encoded, str):
            raise ParameterError(f"{name}_b64", "must be a string")
        try:
            padded = encoded + "=" * (-len(encoded) % 4)
            raw = base64.b64decode(padded, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise ParameterError(f"{name}_b64", "is not urlsafe base64") from None
        field = f"{name}_b64"
    elif plain not in (None, ""):
        if not isinstance(plain, str):
            raise ParameterError(name, "must be a string")
        raw, field = plain.encode("utf-8", "surrogateescape"), name
    elif required:
        raise ParameterError(name, f"give {name} or {name}_b64")
    else:
        return b""
    if b"\x00" in raw:
        raise ParameterError(field, "a path cannot hold a NUL byte")
    if len(raw) > MAX_PATH:
        raise ParameterError(field, f"a path is at most {MAX_PATH} bytes")
    return raw


def parent_of(path: bytes) -> bytes | None:
    """The folder holding an absolute path; None for /."""
    trimmed = path.rstrip(b"/")
    if not trimmed:
        return None
    head = trimmed.rsplit(b"/", 1)[0]
    return head or b"/"


def name_of(path: bytes) -> bytes:
    return path.rstrip(b"/").rsplit(b"/", 1)[-1]


def join(folder: bytes, name: bytes) -> bytes:
    return folder.rstrip(b"/") + b"/" + name
