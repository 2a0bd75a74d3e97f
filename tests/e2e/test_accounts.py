"""Each user acts on the cluster as their own account, and the cluster (its scheduler and the
OS), not the platform, keeps them apart. Live platform, each real scheduler, real SSH, two real
Unix users."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from harness.cells import Cell
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from tests.e2e.conftest import compute_environment, on_every_scheduler, pw_runner
from workers_app.actions import cluster_accounts as accounts
from workers_app.models import Cluster, Environment, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
pytestmark = [pytest.mark.slurm, pytest.mark.live]


@pytest.fixture
def per_user_environment(transactional_db: None, make_cluster, cell: Cell) -> Environment:
    cluster: Cluster = make_cluster(name="per-user", shared=False, scheduler=cell.kind)
    return compute_environment(cluster, cell)


def connected(worker: Worker, platform: Platform) -> Worker:
    def is_connected() -> bool:
        worker.refresh_from_db()
        assert worker.status in {S.PENDING, S.QUEUED, S.STARTING, S.CONNECTED}, (
            f"{worker.status}: {worker.status_reason}\n{platform.logs()}"
        )
        return worker.status == S.CONNECTED

    wait_for(is_connected, timeout=90)
    return worker


# Read as the job's owner, from inside the job: the key its agent was started with.
AGENT_KEY = (
    'for p in $(pgrep -u "$(id -u)" python3); do tr "\\0" "\\n" < /proc/$p/environ; done'
    " 2>/dev/null | sed -n 's/^ACTIVATE_AGENT_KEY=//p' | head -n 1"
)


@on_every_scheduler
def test_each_users_job_runs_as_their_own_account_and_the_cluster_refuses_the_other(
    platform: Platform,
    per_user_environment: Environment,
    user: User,
    other_user: User,
    ssh_target: SshTarget,
    cell: Cell,
    tmp_path: Path,
) -> None:
    cluster = per_user_environment.cluster.name
    alice_remote, bob_remote = sorted(ssh_target.accounts)
    alice_pw = pw_runner(platform, user, tmp_path / "alice")
    bob_pw = pw_runner(platform, other_user, tmp_path / "bob")
    for pw, remote in ((alice_pw, alice_remote), (bob_pw, bob_remote)):
        done = pw(
            "cluster",
            "connect",
            cluster,
            "--user",
            remote,
            "--key-file",
            ssh_target.accounts[remote],
        )
        assert done.returncode == 0, done.stderr
    created = [
        pw("workers", "create", cluster, "--environment", "compute", "-o", "json")
        for pw in (alice_pw, bob_pw)
    ]
    assert all(c.returncode == 0 for c in created), [c.stderr for c in created]
    alice_worker = connected(Worker.objects.get(owner=user), platform)
    bob_worker = connected(Worker.objects.get(owner=other_user), platform)
    alice_job = alice_worker.scheduler_job_id

    # Given: alice's job runs as her own Unix user, on the scheduler's word and the node's.
    assert cell.owner(alice_job) == alice_remote
    whoami = alice_pw("ssh", alice_worker.public_id, "id", "-un")
    assert (whoami.returncode, whoami.stdout.strip()) == (0, alice_remote)

    # When bob, from his own connected worker, goes for alice's job, the cluster refuses.
    def as_bob(*argv: str) -> subprocess.CompletedProcess[str]:
        return bob_pw("ssh", bob_worker.public_id, *argv)

    own = alice_pw("ssh", alice_worker.public_id, "sh", "-c", AGENT_KEY)
    secret = own.stdout.strip()
    assert own.returncode == 0 and len(secret) >= 32, own.stderr  # what bob must never see
    node = alice_worker.node_hostname
    entered = as_bob(*cell.enter_argv(alice_job, node, ["id", "-un"]))
    assert entered.returncode != 0 and alice_remote not in entered.stdout
    cancelled = as_bob(*cell.cancel_argv(alice_job))
    assert cancelled.returncode != 0 or "denied" in (cancelled.stdout + cancelled.stderr).lower()
    # What the scheduler shows bob of her job (its name, state and node, by default) and what
    # the node's files let him read of it never hold the secret her agent signs with.
    shown = [as_bob(*argv) for argv in cell.shown_argv(alice_remote, alice_job)]
    assert alice_job in shown[0].stdout  # the checks below read what bob can see
    for seen in shown:
        assert secret not in seen.stdout + seen.stderr
    # ...and the platform does not even let him name her worker.
    assert as_bob_api_404(bob_pw, alice_worker.public_id)

    # Then alice's worker is untouched: still connected, its job still running as her.
    assert cell.owner(alice_job) == alice_remote
    alice_worker.refresh_from_db()
    assert alice_worker.status == S.CONNECTED


def as_bob_api_404(bob_pw, public_id: str) -> bool:
    answer = bob_pw("ssh", public_id, "true")
    return answer.returncode != 0 and "not found" in answer.stderr.lower()


def test_a_generated_key_is_installed_by_the_user_then_verified_and_requests_work(
    platform: Platform,
    per_user_environment: Environment,
    user: User,
    ssh_target: SshTarget,
    cell: Cell,
    tmp_path: Path,
) -> None:
    cluster = per_user_environment.cluster.name
    remote = sorted(ssh_target.accounts)[0]
    pw = pw_runner(platform, user, tmp_path)

    refused = pw("workers", "create", cluster, "--environment", "compute")
    assert refused.returncode != 0
    assert f"pw cluster connect {cluster} --user" in refused.stderr

    connect = pw("cluster", "connect", cluster, "--user", remote)
    assert connect.returncode == 0, connect.stderr
    public_line = connect.stdout.strip().splitlines()[-1]
    assert public_line.startswith("ssh-ed25519 ")
    assert pw("cluster", "verify", cluster).returncode != 0  # not installed yet

    authorized = Path(f"~{remote}").expanduser() / ".ssh" / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + public_line + "\n")
    try:
        verified = pw("cluster", "verify", cluster)
        assert verified.returncode == 0, verified.stderr
        assert remote in verified.stdout
        listed = pw("cluster", "ls")
        assert f"{remote} (verified)" in listed.stdout
        created = pw("workers", "create", cluster, "--environment", "compute", "--wait")
        assert created.returncode == 0, created.stderr + platform.logs()
        worker = Worker.objects.get(owner=user)
        assert worker.account is not None and worker.account.remote_username == remote
        assert cell.owner(worker.scheduler_job_id) == remote
        deleted = pw("workers", "delete", worker.public_id, "--wait")
        assert deleted.returncode == 0, deleted.stderr
    finally:
        authorized.write_text(before)
    assert accounts.account_of(user, per_user_environment.cluster) is not None
