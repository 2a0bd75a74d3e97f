"""The extra connection a login gets while its channels are all taken, against a neighbour: an
ordinary Unix user (pwbob, never root) who takes the login host's SSH port once its server has
died is refused by the pinned host key before any login is tried, and the live session is
unharmed."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from core.transport.commands import CommandResult
from core.transport.errors import HostKeyMismatch
from harness.platform import free_port
from harness.waiting import wait_until
from workers_app.cluster_access import close_all_connections, connection_for

pytestmark = pytest.mark.slurm

# Written by scripts/testcluster.sh: the test cluster's sshd, its pinned host key included.
SSHD_CONFIG = "/etc/ssh/sshd_activate_test_config"
AS_BOB = ["runuser", "-u", "pwbob", "--"]
BOB_LOGS = ["-o", "PidFile=none", "-o", "LogLevel=DEBUG", "-E"]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def test_a_neighbours_server_on_a_dead_login_port_gets_no_login(make_cluster, settings) -> None:
    if shutil.which("runuser") is None or subprocess.run(["id", "pwbob"]).returncode != 0:
        pytest.fail("the test cluster's users (pwalice, pwbob) are missing: make cluster")
    port = free_port()
    # The login host's sshd, on a port of this test's own (so that it may die).
    login = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", SSHD_CONFIG, "-p", str(port), "-o", "PidFile=none"],
        stderr=subprocess.DEVNULL,
    )
    bob_dir = Path(tempfile.mkdtemp(prefix="bob-sshd-"))
    shutil.chown(bob_dir, "pwbob")
    bob: subprocess.Popen[bytes] | None = None
    try:
        assert wait_until(lambda: _answers(port), timeout=10)
        settings.ACTIVATE_SSH_MAX_CHANNELS = 1
        cluster = make_cluster(port=port)
        first = connection_for(cluster)
        results: list[CommandResult] = []
        long = threading.Thread(target=lambda: results.append(first.run(["sleep", "3"])))
        long.start()
        # Running (not only asking for its channel) before the server goes.
        assert wait_until(lambda: first.commands_run == 1, timeout=5)
        assert first.channels_taken
        # The server dies (its live session stays); bob takes its port with a server of his own.
        login.terminate()
        login.wait(timeout=10)
        assert not _answers(port)
        key = bob_dir / "host_key"
        subprocess.run(
            [*AS_BOB, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
            check=True,
        )
        bob_log = bob_dir / "sshd.log"
        bob = subprocess.Popen(
            [
                *AS_BOB,
                "/usr/sbin/sshd",
                "-D",
                "-f",
                "/dev/null",
                "-p",
                str(port),
                "-h",
                str(key),
                *BOB_LOGS,
                str(bob_log),
            ]
        )
        assert wait_until(lambda: _answers(port), timeout=10), "bob's server did not start"
        started = time.monotonic()
        # The first connection is busy: the platform opens another, to bob's server.
        with pytest.raises(HostKeyMismatch):
            connection_for(cluster).run(["true"])
        assert time.monotonic() - started < 10
        long.join(timeout=10)
        assert results and results[0].exit_status == 0  # the live session was unharmed
        log = bob_log.read_text(errors="replace")
        assert "Connection from 127.0.0.1" in log  # the platform did reach bob's server
        # ...and never offered a user or a key: it left at the host key.
        assert "userauth" not in log and "publickey" not in log, log[-2000:]
    finally:
        close_all_connections()
        if login.poll() is None:
            login.kill()
        # runuser does not pass a kill on: end bob's server as bob's own processes.
        subprocess.run(["pkill", "-u", "pwbob", "-f", f"sshd -D -f /dev/null -p {port}"])
        if bob is not None:
            bob.wait(timeout=10)
        shutil.rmtree(bob_dir, ignore_errors=True)
