"""The test cluster's sshd trusts the user certificate authorities listed in its
TrustedUserCAKeys file (scripts/testcluster.sh), read at each login: a certificate logs in only
as the principal it names, only while valid, and only while its CA is listed. Made here with
ssh-keygen, for the test set-up itself; the platform signs its own with `cryptography`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.cluster import KNOWN_HOSTS, SshTarget
from harness.identity import trusted_user_ca, user_ca_keys_path

pytestmark = pytest.mark.slurm


def keypair(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def certify(ca: Path, key: Path, principal: str, validity: str = "-1m:+5m") -> Path:
    argv = ["ssh-keygen", "-q", "-s", str(ca), "-I", f"test-{principal}", "-n", principal]
    subprocess.run(
        [*argv, "-V", validity, f"{key}.pub"],
        check=True,
        capture_output=True,
    )
    return Path(f"{key}-cert.pub")


def logs_in(ssh_target: SshTarget, user: str, key: Path, certificate: Path) -> str | None:
    """The remote `id -un` when ``user`` logs in with ``certificate`` (and its key), else None."""
    options = {
        "CertificateFile": str(certificate),
        "UserKnownHostsFile": str(KNOWN_HOSTS),
        "GlobalKnownHostsFile": "/dev/null",
        "StrictHostKeyChecking": "yes",
        "BatchMode": "yes",
        "IdentitiesOnly": "yes",
        "IdentityAgent": "none",
    }
    argv = ["ssh", "-i", str(key), "-p", str(ssh_target.port)]
    for name, value in options.items():
        argv += ["-o", f"{name}={value}"]
    result = subprocess.run(
        [*argv, f"{user}@{ssh_target.host}", "id", "-un"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else None


def test_the_ca_file_is_roots_and_world_readable() -> None:
    mode = user_ca_keys_path().stat()
    assert (mode.st_uid, oct(mode.st_mode & 0o777)) == (0, "0o644")


def test_a_certificate_logs_in_as_its_principal_only_while_its_ca_is_trusted(
    ssh_target: SshTarget, tmp_path: Path
) -> None:
    # Given a CA of our own and a key that no authorized_keys lists, certified for pwcarol
    ca = keypair(tmp_path / "ca")
    key = keypair(tmp_path / "carol")
    certificate = certify(ca, key, "pwcarol")
    # When the sshd does not trust the CA, the certificate is worth nothing
    assert logs_in(ssh_target, "pwcarol", key, certificate) is None
    # Then, once the CA is listed (no reload), it logs in as pwcarol and not as pwbob
    with trusted_user_ca(Path(f"{ca}.pub").read_text()):
        assert logs_in(ssh_target, "pwcarol", key, certificate) == "pwcarol"
        assert logs_in(ssh_target, "pwbob", key, certificate) is None
    # And once the line is gone it is refused again, the file as it was
    assert Path(f"{ca}.pub").read_text().strip() not in user_ca_keys_path().read_text()
    assert logs_in(ssh_target, "pwcarol", key, certificate) is None


def test_an_expired_certificate_is_refused(ssh_target: SshTarget, tmp_path: Path) -> None:
    ca = keypair(tmp_path / "ca")
    key = keypair(tmp_path / "carol")
    expired = certify(ca, key, "pwcarol", validity="20200101:20200102")
    with trusted_user_ca(Path(f"{ca}.pub").read_text()):
        assert logs_in(ssh_target, "pwcarol", key, expired) is None
