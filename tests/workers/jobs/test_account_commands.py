"""Operators map accounts and mark shared clusters from the command line and the admin; the
login is tried on the real cluster over real SSH."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from harness.cluster import SshTarget
from workers_app.models import AccountOrigin, Cluster, ClusterAccount

pytestmark = pytest.mark.slurm


def test_an_operator_maps_a_users_account_and_the_login_is_verified(
    make_cluster, user, ssh_target: SshTarget
) -> None:
    cluster = make_cluster(shared=False)
    remote, key = sorted(ssh_target.accounts.items())[0]

    call_command(
        "add_cluster_account",
        user.username,
        cluster.name,
        "--remote-user",
        remote,
        "--key-file",
        key,
    )

    account = ClusterAccount.objects.get(user=user, cluster=cluster)
    assert (account.remote_username, account.origin) == (remote, AccountOrigin.OPERATOR)
    assert account.is_verified and account.public_key.startswith("ssh-ed25519 ")


def test_a_key_that_belongs_to_another_remote_user_fails_verification_clearly(
    make_cluster, user, ssh_target: SshTarget
) -> None:
    cluster = make_cluster(shared=False)
    (_, alice_key), (bob, _) = sorted(ssh_target.accounts.items())[:2]

    with pytest.raises(CommandError, match=r"authentication as .* failed"):
        call_command(
            "add_cluster_account", user.username, cluster.name, "--remote-user", bob,
            "--key-file", alice_key,
        )  # fmt: skip

    account = ClusterAccount.objects.get(user=user, cluster=cluster)
    assert not account.is_verified and "authorized_keys" in account.last_error


def test_add_cluster_without_an_account_of_its_own_then_shared_with_one(
    db: None, ssh_target: SshTarget, tmp_path: Path
) -> None:
    call_command(
        "add_cluster", "lab", "--host", ssh_target.host, "--port", str(ssh_target.port),
        "--scheduler", "slurm", "--host-key", ssh_target.host_key,
    )  # fmt: skip
    cluster = Cluster.objects.get(name="lab")
    assert not cluster.shared and not cluster.username and not cluster.has_private_key
    with pytest.raises(CommandError, match="--shared: A shared cluster needs its own account"):
        call_command(
            "add_cluster", "lab", "--host", ssh_target.host, "--scheduler", "slurm",
            "--host-key", ssh_target.host_key, "--shared",
        )  # fmt: skip

    call_command(
        "add_cluster", "lab", "--host", ssh_target.host, "--port", str(ssh_target.port),
        "--scheduler", "slurm", "--host-key", ssh_target.host_key, "--shared",
        "--user", ssh_target.user, "--key-file", ssh_target.key_path,
    )  # fmt: skip
    cluster.refresh_from_db()
    assert cluster.shared and cluster.username == ssh_target.user
    assert cluster.environments.filter(name=ssh_target.partition).exists()  # probed


def test_add_cluster_with_agents_via_the_login_host_needs_the_clusters_own_account(
    db: None, ssh_target: SshTarget
) -> None:
    where = ["--host", ssh_target.host, "--port", str(ssh_target.port), "--scheduler", "slurm"]
    where += ["--host-key", ssh_target.host_key]
    with pytest.raises(CommandError, match="cluster's own account"):
        call_command("add_cluster", "far", *where, "--agent-route", "via_login_host")
    assert not Cluster.objects.filter(name="far").exists()

    call_command(
        "add_cluster", "far", *where, "--agent-route", "via_login_host",
        "--relay-host", "10.1.0.1", "--relay-port", "47001",
        "--user", ssh_target.user, "--key-file", ssh_target.key_path,
    )  # fmt: skip
    cluster = Cluster.objects.get(name="far")
    assert (cluster.agent_route, cluster.relay_host, cluster.relay_port) == (
        "via_login_host",
        "10.1.0.1",
        47001,
    )


def test_the_admin_says_plainly_which_clusters_are_shared(
    admin_client: Client, make_cluster
) -> None:
    make_cluster(name="lab")
    make_cluster(name="campus", shared=False)

    page = admin_client.get("/admin/workers_app/cluster/").content.decode()

    assert "SHARED: everyone acts as" in page and "per user" in page
