"""The platform's SSH certificate authority, without a cluster: what a signed certificate says
(one principal, minutes of validity, the platform user in its key id, only the extensions the
platform uses), that its key is new each time and the CA's is kept encrypted."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import SSHCertificate, SSHCertificateType

from core.env import ConfigurationError, EnvReader
from core.keystore import decrypt_private_key
from identity import certificates, revocations


@pytest.fixture
def authority() -> certificates.CertificateAuthority:
    return certificates.new_authority("activate-ca:test:campus")


def parsed(line: str) -> SSHCertificate:
    certificate = serialization.load_ssh_public_identity(line.encode())
    assert isinstance(certificate, SSHCertificate)
    return certificate


def test_a_certificate_names_one_principal_the_platform_user_and_minutes_of_validity(
    authority: certificates.CertificateAuthority, settings
) -> None:
    settings.ACTIVATE_SSH_CERT_LIFETIME = 300
    now = time.time()

    signed = certificates.sign_user_certificate(
        authority.private_key_encrypted,
        principal="pwalice",
        key_id=certificates.key_id_for("alice", 7),
        now=now,
    )

    certificate = parsed(signed.certificate)
    certificate.verify_cert_signature()
    assert certificate.type is SSHCertificateType.USER
    assert certificate.valid_principals == [b"pwalice"]
    assert certificate.key_id == f"activate:{settings.ACTIVATE_INSTALLATION_ID}:alice:7".encode()
    assert certificate.valid_after == int(now) - 60
    assert certificate.valid_before == int(now) + 300
    # A PTY for terminals, forwarding for sessions' tunnels: no agent, no X11, no ~/.ssh/rc.
    assert certificate.extensions == {b"permit-port-forwarding": b"", b"permit-pty": b""}
    assert certificate.critical_options == {}
    ca_public = serialization.load_ssh_public_key(authority.public_key.encode())
    assert certificate.signature_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ) == ca_public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def test_each_login_gets_a_key_of_its_own_and_the_certificate_is_for_that_key(
    authority: certificates.CertificateAuthority,
) -> None:
    first, second = (
        certificates.sign_user_certificate(
            authority.private_key_encrypted, principal="pwalice", key_id="k"
        )
        for _ in range(2)
    )

    assert first.private_key != second.private_key and first.serial != second.serial
    key = serialization.load_ssh_private_key(first.private_key.encode(), password=None)
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    assert parsed(first.certificate).public_key().public_bytes(*raw) == (
        key.public_key().public_bytes(*raw)
    )
    assert "PRIVATE" not in repr(first) and "PRIVATE" not in repr(authority)


def test_the_lifetime_is_the_setting_unless_asked(
    authority: certificates.CertificateAuthority, settings
) -> None:
    settings.ACTIVATE_SSH_CERT_LIFETIME = 45
    signed = certificates.sign_user_certificate(
        authority.private_key_encrypted, principal="pwbob", key_id="k", now=1_000_000
    )
    short = certificates.sign_user_certificate(
        authority.private_key_encrypted, principal="pwbob", key_id="k", now=1_000_000, lifetime=2
    )
    assert (signed.valid_after, signed.valid_before) == (1_000_000 - 60, 1_000_045)
    assert short.valid_before == 1_000_002


def test_the_lifetime_setting_is_strict() -> None:
    assert EnvReader({}).integer("ACTIVATE_SSH_CERT_LIFETIME", 300, minimum=30) == 300
    with pytest.raises(ConfigurationError):
        EnvReader({"ACTIVATE_SSH_CERT_LIFETIME": "10"}).integer(
            "ACTIVATE_SSH_CERT_LIFETIME", 300, minimum=30
        )


def test_the_ca_key_is_stored_encrypted_and_its_public_line_names_the_cluster(
    authority: certificates.CertificateAuthority,
) -> None:
    assert "PRIVATE KEY" not in authority.private_key_encrypted
    assert "OPENSSH PRIVATE KEY" in decrypt_private_key(authority.private_key_encrypted)
    kind, _, comment = authority.public_key.split(" ")
    assert (kind, comment) == ("ssh-ed25519", "activate-ca:test:campus")


def test_the_operator_is_told_the_ca_line_and_the_sshd_config_lines(
    authority: certificates.CertificateAuthority,
) -> None:
    told = certificates.sshd_instructions(authority.public_key)
    assert authority.public_key in told
    assert "TrustedUserCAKeys /etc/ssh/activate_user_ca_keys" in told
    assert "AuthorizedPrincipalsFile" in told


def test_a_user_disabled_or_deleted_is_seen_as_such_once_the_change_commits(
    transactional_db: None, django_user_model
) -> None:
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    assert revocations.disabled_among([alice.pk, bob.pk]) == set()

    alice.is_active = False
    alice.save()
    bob_id = bob.pk
    bob.delete()
    assert revocations.disabled_among([alice.pk, bob_id]) == {alice.pk, bob_id}

    alice.is_active = True
    alice.save()
    assert not revocations.is_disabled(alice.pk)
