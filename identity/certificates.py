"""The platform as an SSH certificate authority for clusters that trust it.

A cluster's CA key is made here (ed25519) and kept encrypted like every other private key. For
each login as a user the platform makes a fresh key in memory and signs a certificate for it:
valid for minutes (ACTIVATE_SSH_CERT_LIFETIME), for one principal (the user's Unix name there),
naming the platform user in its key id, and allowing only what the platform does over it: a PTY
(terminals) and port forwarding (sessions reach their node through ``direct-tcpip`` channels as
the worker's owner). No agent or X11 forwarding, no ~/.ssh/rc. Nothing is written to disk.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    SSHCertificateBuilder,
    SSHCertificateType,
)
from django.conf import settings

from core.keystore import decrypt_private_key, encrypt_private_key

# Where the operator puts the CA's public line on each login host, and the sshd_config lines.
TRUSTED_CA_FILE = "/etc/ssh/activate_user_ca_keys"
PRINCIPALS_FILE = "/etc/ssh/activate_principals/%u"
# A login host whose clock runs behind ours still accepts a certificate signed just now.
CLOCK_SKEW = 60
# Only what the platform does as a user: terminals ask for a PTY, and sessions reach their
# node through direct-tcpip channels (port forwarding).
EXTENSIONS = (b"permit-pty", b"permit-port-forwarding")


@dataclass(frozen=True)
class CertificateAuthority:
    """A new CA: its private key encrypted for storage, and its public line for sshd."""

    private_key_encrypted: str = field(repr=False)
    public_key: str


@dataclass(frozen=True)
class UserCertificate:
    """A login's key and its certificate, in memory only."""

    private_key: str = field(repr=False)  # OpenSSH form, for paramiko
    certificate: str  # "ssh-ed25519-cert-v01@openssh.com AAAA... key id"
    key_id: str
    principal: str
    serial: int
    valid_after: int
    valid_before: int


def new_authority(comment: str) -> CertificateAuthority:
    """A new ed25519 CA key; ``comment`` ends its public line (which cluster, which platform)."""
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    return CertificateAuthority(encrypt_private_key(pem), f"{_public_line(key)} {comment}")


def _public_line(key: ed25519.Ed25519PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def authority_comment(cluster_name: str) -> str:
    return f"activate-ca:{settings.ACTIVATE_INSTALLATION_ID}:{cluster_name}"


def key_id_for(username: str, user_id: int) -> str:
    """What sshd logs for a login with the certificate: which platform user it was made for."""
    return f"activate:{settings.ACTIVATE_INSTALLATION_ID}:{username}:{user_id}"


def sign_user_certificate(
    ca_private_key_encrypted: str,
    *,
    principal: str,
    key_id: str,
    lifetime: int | None = None,
    now: float | None = None,
) -> UserCertificate:
    """A fresh key and its certificate for logging in as ``principal`` (exactly that Unix name),
    valid from a minute ago to ``lifetime`` seconds (ACTIVATE_SSH_CERT_LIFETIME) ahead.

    KeyDecryptionError if the CA key was stored under another ACTIVATE_SECRET_KEY.
    """
    ca = serialization.load_ssh_private_key(
        decrypt_private_key(ca_private_key_encrypted).encode(), password=None
    )
    if not isinstance(ca, ed25519.Ed25519PrivateKey):
        raise ValueError("the cluster's CA key is not an ed25519 key")
    started = int(time.time() if now is None else now)
    seconds = settings.ACTIVATE_SSH_CERT_LIFETIME if lifetime is None else lifetime
    key = ed25519.Ed25519PrivateKey.generate()
    serial = secrets.randbits(64)
    builder = (
        SSHCertificateBuilder()
        .public_key(key.public_key())
        .serial(serial)
        .type(SSHCertificateType.USER)
        .key_id(key_id.encode())
        .valid_principals([principal.encode()])
        .valid_after(started - CLOCK_SKEW)
        .valid_before(started + seconds)
    )
    for extension in EXTENSIONS:
        builder = builder.add_extension(extension, b"")
    certificate = builder.sign(ca)
    return UserCertificate(
        private_key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ).decode(),
        certificate=f"{certificate.public_bytes().decode()} {key_id}",
        key_id=key_id,
        principal=principal,
        serial=serial,
        valid_after=started - CLOCK_SKEW,
        valid_before=started + seconds,
    )


def sshd_instructions(ca_public_key: str) -> str:
    """What an operator does on each login host for it to trust the platform's certificates."""
    return (
        f"1. Put this line in {TRUSTED_CA_FILE} (root-owned, mode 0644):\n"
        f"   {ca_public_key}\n"
        "2. Add to /etc/ssh/sshd_config and reload sshd:\n"
        f"   TrustedUserCAKeys {TRUSTED_CA_FILE}\n"
        f"3. Optionally, to list per user the names their certificates may log in as (else the\n"
        "   certificate's principal must be the user name itself, which is what the platform\n"
        "   signs):\n"
        f"   AuthorizedPrincipalsFile {PRINCIPALS_FILE}"
    )
