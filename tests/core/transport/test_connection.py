"""SSHConnection and its commands against the real sshd of the test cluster (127.0.0.1:2222)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from core.transport.connection import SSHConnection, commands_run_total
from core.transport.errors import AuthenticationFailed, CommandTimeout, HostKeyMismatch, SSHError
from core.transport.hostkeys import HostKeyUnreadable, fetch_host_key, fingerprint
from tests.conftest import SshTarget
from tests.core.transport.conftest import connection_to

pytestmark = pytest.mark.slurm

CLOSED_PORT = 2299


def public_line(private_key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return (
        private_key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def private_text(private_key: ed25519.Ed25519PrivateKey) -> str:
    return private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()


# -- commands -------------------------------------------------------------------------------


def test_arguments_reach_the_remote_program_verbatim(ssh: SSHConnection) -> None:
    words = ["a b", "$(id)", "`id`", "it's", '"q"', ";|&<>", "*", "~", "$HOME", "new\nline", ""]
    result = ssh.run(["printf", "%s\\n", *words])
    assert result.exit_status == 0
    assert result.stdout == "".join(f"{word}\n" for word in words)


def test_stdin_is_delivered_and_closed(ssh: SSHConnection) -> None:
    text = "".join(f"line {n} with 'quotes' and $vars\n" for n in range(20000))
    result = ssh.run(["sh", "-c", "cat; echo done"], stdin=text)
    assert result.stdout == text + "done\n"


def test_large_stdout_and_stderr_together_do_not_deadlock(ssh: SSHConnection) -> None:
    script = "for i in $(seq 1 60000); do echo out$i; echo err$i >&2; done; exit 3"
    result = ssh.run(["sh", "-c", script], timeout=60)
    assert result.exit_status == 3
    assert result.stdout.count("\n") == 60000 and result.stderr.count("\n") == 60000
    assert result.stdout.endswith("out60000\n") and result.stderr.endswith("err60000\n")


def test_non_zero_exit_is_a_result_not_an_error(ssh: SSHConnection) -> None:
    result = ssh.run(["sh", "-c", "echo oops >&2; exit 42"])
    assert (result.exit_status, result.stderr) == (42, "oops\n")


def test_command_timeout_raises_and_the_connection_stays_usable(ssh: SSHConnection) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout):
        ssh.run(["sleep", "10"], timeout=0.5)
    assert time.monotonic() - started < 3
    assert ssh.run(["echo", "still here"]).stdout == "still here\n"


# -- one kept connection --------------------------------------------------------------------


def test_commands_reuse_one_connection_and_are_counted(ssh_target: SshTarget) -> None:
    connection = connection_to(ssh_target)
    total_before = commands_run_total()
    try:
        for _ in range(5):
            assert connection.run(["true"]).exit_status == 0
        assert (connection.connects, connection.commands_run) == (1, 5)
        assert commands_run_total() - total_before == 5
    finally:
        connection.close()


def test_a_dead_transport_is_replaced_once_transparently(ssh_target: SshTarget) -> None:
    connection = connection_to(ssh_target)
    try:
        connection.run(["true"])
        assert connection._client is not None
        transport = connection._client.get_transport()
        assert transport is not None
        transport.close()  # as if the server had dropped us
        assert connection.run(["echo", "back"]).stdout == "back\n"
        assert connection.connects == 2
    finally:
        connection.close()


def test_channels_are_capped_per_connection(ssh_target: SshTarget) -> None:
    connection = connection_to(ssh_target, max_channels=2)
    results: list[int] = []
    try:
        connection.run(["true"])
        threads = [
            threading.Thread(
                target=lambda: results.append(connection.run(["sleep", "0.5"]).exit_status)
            )
            for _ in range(6)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    finally:
        connection.close()
    assert results == [0] * 6
    # Six half-second commands, two at a time: at least three rounds.
    assert elapsed >= 1.45
    assert connection.connects == 1


# -- host keys and failures -----------------------------------------------------------------


def test_wrong_pinned_host_key_is_refused(ssh_target: SshTarget) -> None:
    other = public_line(ed25519.Ed25519PrivateKey.generate())
    connection = connection_to(ssh_target, host_key=other)
    with pytest.raises(HostKeyMismatch):
        connection.run(["true"])
    assert connection.commands_run == 0


def test_pinned_key_of_another_type_is_refused(ssh_target: SshTarget) -> None:
    other = public_line(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(HostKeyMismatch):
        connection_to(ssh_target, host_key=other).run(["true"])


def test_missing_pinned_key_refuses_to_connect(ssh_target: SshTarget) -> None:
    with pytest.raises(SSHError, match="no host key"):
        connection_to(ssh_target, host_key="").run(["true"])


def test_closed_port_is_unreachable_quickly(ssh_target: SshTarget) -> None:
    started = time.monotonic()
    with pytest.raises(SSHError) as raised:
        connection_to(ssh_target, port=CLOSED_PORT).run(["true"])
    assert not isinstance(raised.value, HostKeyMismatch)
    assert time.monotonic() - started < 5
    # The reason users see under a waiting worker says what happened, in words.
    assert str(raised.value) == f"cannot connect to {ssh_target.host}:{CLOSED_PORT}: refused"


def test_unknown_client_key_fails_authentication(ssh_target: SshTarget) -> None:
    stranger = private_text(ed25519.Ed25519PrivateKey.generate())
    with pytest.raises(AuthenticationFailed, match="authentication"):
        connection_to(ssh_target, private_key=stranger).run(["true"])


def test_fetch_host_key_returns_the_key_the_cluster_pins(ssh_target: SshTarget) -> None:
    assert fetch_host_key(ssh_target.host, ssh_target.port, timeout=5) == ssh_target.host_key
    with pytest.raises(HostKeyUnreadable):
        fetch_host_key(ssh_target.host, CLOSED_PORT, timeout=2)


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_fingerprint_matches_ssh_keygen(ssh_target: SshTarget, tmp_path: Path) -> None:
    key_file = tmp_path / "key.pub"
    key_file.write_text(ssh_target.host_key + "\n")
    shown = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(key_file)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    assert fingerprint(ssh_target.host_key) == shown


@pytest.mark.parametrize(
    "line",
    [
        "",
        "ssh-ed25519",
        "ssh-ed25519 not*base64",
        "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIKhpv3Jk1VkZsW4x8tRXBuiZJwyawnaBAEwmpDCXEmKM",
    ],
)
def test_fingerprint_refuses_malformed_keys(line: str) -> None:
    with pytest.raises(ValueError):
        fingerprint(line)


def test_a_command_that_ignores_stdin_still_reports_its_result(ssh: SSHConnection) -> None:
    result = ssh.run(["sh", "-c", "echo refused >&2; exit 5"], stdin="x" * 5_000_000)
    assert (result.exit_status, result.stderr) == (5, "refused\n")
