"""A connection to the test cluster's sshd (127.0.0.1:2222), as the transport's tests and the
scheduler adapters' tests use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.transport.connection import SSHConnection
from tests.conftest import SshTarget


def connection_to(target: SshTarget, **overrides: object) -> SSHConnection:
    options: dict[str, object] = {
        "host": target.host,
        "port": target.port,
        "username": target.user,
        "private_key": target.private_key,
        "host_key": target.host_key,
        "connect_timeout": 5.0,
        "command_timeout": 30.0,
        "max_channels": 8,
    }
    options.update(overrides)
    return SSHConnection(**options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ssh(ssh_target: SshTarget) -> Iterator[SSHConnection]:
    """One kept connection to the test cluster for a whole test module (no database needed)."""
    connection = connection_to(ssh_target)
    yield connection
    connection.close()
