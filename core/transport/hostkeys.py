"""Host keys: read a server's key for an operator to check, and its OpenSSH fingerprint."""

from __future__ import annotations

import base64
import binascii
import hashlib
import socket

import paramiko

HOST_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
)


class HostKeyUnreadable(Exception):
    """The server could not be reached, or offered no usable key."""


def parse_key_line(line: str) -> tuple[str, bytes]:
    parts = line.strip().split()
    if len(parts) < 2:
        raise ValueError('host key must look like "ssh-ed25519 AAAA..."')
    key_type, encoded = parts[0], parts[1]
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("host key is not valid base64") from None
    # The blob starts with its own type name; a mismatch means a mangled or spliced key.
    if len(blob) < 4:
        raise ValueError("host key is too short")
    name_length = int.from_bytes(blob[:4], "big")
    if blob[4 : 4 + name_length] != key_type.encode():
        raise ValueError(f"host key data is not a {key_type} key")
    return key_type, blob


def fingerprint(host_key_line: str) -> str:
    """OpenSSH-style fingerprint ("SHA256:...") of a "type base64" key line. ValueError if bad."""
    _, blob = parse_key_line(host_key_line)
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def fetch_host_key(host: str, port: int, timeout: float) -> str:
    """The server's host key as "type base64", for an operator to check and pin."""
    transport: paramiko.Transport | None = None
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        transport = paramiko.Transport(sock)
        options = transport.get_security_options()
        offered = list(options.key_types)
        options.key_types = [t for t in HOST_KEY_TYPES if t in offered] + [
            t for t in offered if t not in HOST_KEY_TYPES
        ]
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise HostKeyUnreadable(f"cannot read the host key of {host}:{port}: {exc}") from exc
    finally:
        if transport is not None:
            transport.close()
