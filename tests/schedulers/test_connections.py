"""Which SSH connection serves whom: one per (cluster, account) and process, another while its
channels are all taken."""

from __future__ import annotations

import ast
import threading
import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from core.transport.errors import HostKeyMismatch
from schedulers.slurm import SlurmAdapter
from tests.core.transport.test_connection import CLOSED_PORT, public_line
from tests.foundation.test_structure import modules
from workers_app import cluster_access as connections
from workers_app.actions.cluster_accounts import connect_account
from workers_app.cluster_access import (
    adapter_for,
    close_idle_connections,
    connection_for,
    new_connection,
)

pytestmark = pytest.mark.slurm


def test_connection_for_reuses_until_the_cluster_changes(make_cluster, ssh_target) -> None:
    cluster = make_cluster()
    first = connection_for(cluster)
    assert connection_for(cluster) is first
    assert first.run(["true"]).exit_status == 0
    assert isinstance(adapter_for(cluster), SlurmAdapter)
    assert adapter_for(cluster).runner is first

    cluster.port = CLOSED_PORT
    cluster.save()
    second = connection_for(cluster)
    assert second is not first and second.port == CLOSED_PORT
    assert not first.is_connected  # the superseded connection is closed

    other = make_cluster(name="other-slurm")
    assert connection_for(other) is not second


def test_connection_for_a_new_host_key_is_a_new_connection(make_cluster) -> None:
    cluster = make_cluster()
    first = connection_for(cluster)
    cluster.host_key = public_line(ed25519.Ed25519PrivateKey.generate())
    cluster.save()
    second = connection_for(cluster)
    assert second is not first
    with pytest.raises(HostKeyMismatch):
        second.run(["true"])


def test_a_forked_child_starts_without_the_parents_connections(make_cluster) -> None:
    cluster = make_cluster()
    parent = connection_for(cluster)
    parent.run(["true"])
    connections._forget_connections_after_fork()
    child = connection_for(cluster)
    assert child is not parent
    # Forgetting must not close the parent's session (it belongs to the parent process).
    assert parent.is_connected
    parent.close()


def test_each_account_gets_its_own_connection_as_its_own_user(
    make_cluster, user, ssh_target
) -> None:
    cluster = make_cluster(shared=False)
    account = connect_account(
        user, cluster, remote_username=ssh_target.user, private_key=ssh_target.private_key
    )
    own = connection_for(cluster)
    as_user = connection_for(cluster, account)
    assert as_user is not own and connection_for(cluster, account) is as_user
    assert as_user.run(["id", "-un"]).stdout.strip() == ssh_target.user


def test_idle_connections_close_and_the_cap_holds(make_cluster, settings) -> None:
    settings.ACTIVATE_SSH_MAX_CONNECTIONS = 2
    first = connection_for(make_cluster(name="c1"))
    first.run(["true"])
    second = connection_for(make_cluster(name="c2"))
    second.run(["true"])
    third = connection_for(make_cluster(name="c3"))
    # Over the cap, the least recently used idle connection went.
    assert not first.is_connected and second.is_connected
    assert connections.open_connection_count() == 1
    third.run(["true"])
    settings.ACTIVATE_SSH_IDLE_TIMEOUT = 0.05
    time.sleep(0.1)
    assert connections.connections_held_everywhere() == 2
    assert close_idle_connections() == 2
    assert connections.open_connection_count() == 0
    assert connections.connections_held_everywhere() == 0


def test_every_ssh_connection_of_the_platform_is_built_by_connections() -> None:
    builders = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id == "SSHConnection")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "SSHConnection")
            ):
                builders.add(name)
    assert builders == {"workers_app.cluster_access"}


def test_a_connection_of_its_own_is_not_the_shared_one(make_cluster, user, ssh_target) -> None:
    cluster = make_cluster(shared=False)
    account = connect_account(
        user, cluster, remote_username=ssh_target.user, private_key=ssh_target.private_key
    )
    shared = connection_for(cluster, account)
    own = new_connection(cluster, account, max_channels=1, command_timeout=5)
    try:
        assert (own.username, own.max_channels, own.command_timeout) == (ssh_target.user, 1, 5)
        assert own.run(["id", "-un"]).stdout.strip() == ssh_target.user
    finally:
        own.close()
    assert own is not shared and shared.connects == 0


def test_a_login_whose_channels_are_all_taken_gets_another_connection(
    make_cluster, settings
) -> None:
    # Commands of many users over a shared account: one user's long ones never make another's
    # wait for a channel.
    settings.ACTIVATE_SSH_MAX_CHANNELS = 1
    cluster = make_cluster()
    first = connection_for(cluster)
    long = threading.Thread(target=first.run, args=(["sleep", "3"],))
    long.start()
    try:
        deadline = time.monotonic() + 5
        while not first.channels_taken and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first.channels_taken
        second = connection_for(cluster)
        assert second is not first
        started = time.monotonic()
        assert second.run(["true"]).exit_status == 0
        assert time.monotonic() - started < 2  # not behind the sleep
        assert long.is_alive()
    finally:
        long.join()
    # Both free again: the first is the one handed out, the other closes when idle.
    assert not first.channels_taken
    assert connection_for(cluster) is first
    settings.ACTIVATE_SSH_IDLE_TIMEOUT = 0.05
    time.sleep(0.1)
    assert close_idle_connections() == 2
