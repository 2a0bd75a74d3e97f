"""Per-user cluster accounts on the real test cluster, over real SSH: each logs in with its own
key only, and Slurm and the OS keep one user's jobs and files from the other."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from core.transport.connection import SSHConnection
from core.transport.errors import AuthenticationFailed
from harness.cluster import SshTarget
from tests.core.transport.conftest import connection_to

pytestmark = pytest.mark.slurm


@pytest.fixture
def alice_and_bob(
    ssh_target: SshTarget, cluster_accounts: list[tuple[str, str]]
) -> Iterator[tuple[SSHConnection, SSHConnection]]:
    (alice_name, alice_key), (bob_name, bob_key) = cluster_accounts[:2]
    alice = connection_to(ssh_target, username=alice_name, private_key=alice_key)
    bob = connection_to(ssh_target, username=bob_name, private_key=bob_key)
    yield alice, bob
    alice.close()
    bob.close()


@pytest.fixture
def held_job_of_alice(
    alice_and_bob: tuple[SSHConnection, SSHConnection], ssh_target: SshTarget, unique: str
) -> Iterator[str]:
    alice, _ = alice_and_bob
    argv = ["sbatch", "--parsable", "--hold", f"--job-name={unique}held"]
    argv += [f"--partition={ssh_target.partition}", "--output=/dev/null", "--wrap=sleep 600"]
    submitted = alice.run(argv)
    assert submitted.exit_status == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    yield job_id
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)


def job_state(job_id: str) -> str:
    result = subprocess.run(
        ["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


def test_each_account_logs_in_as_itself_and_only_with_its_own_key(
    ssh_target: SshTarget,
    cluster_accounts: list[tuple[str, str]],
    alice_and_bob: tuple[SSHConnection, SSHConnection],
) -> None:
    (alice_name, _), (bob_name, bob_key) = cluster_accounts[:2]
    alice, bob = alice_and_bob

    assert alice.run(["id", "-un"]).stdout.strip() == alice_name
    assert bob.run(["id", "-un"]).stdout.strip() == bob_name
    with pytest.raises(AuthenticationFailed):
        connection_to(ssh_target, username=alice_name, private_key=bob_key).run(["true"])


def test_another_account_can_neither_cancel_nor_read_a_held_job(
    alice_and_bob: tuple[SSHConnection, SSHConnection], held_job_of_alice: str
) -> None:
    alice, bob = alice_and_bob
    job_id = held_job_of_alice

    cancel = bob.run(["scancel", job_id])
    script = bob.run(["scontrol", "write", "batch_script", job_id, "-"])

    assert cancel.exit_status != 0
    assert "Access/permission denied" in cancel.stderr
    # Slurm 22.05's scontrol exits 0 here: the refusal is in its words and its empty output.
    assert script.stdout == ""
    assert "Invalid user id" in script.stderr
    assert job_state(job_id) == "PENDING"

    own = alice.run(["scontrol", "write", "batch_script", job_id, "-"])
    assert own.exit_status == 0 and "sleep 600" in own.stdout
    cancelled = alice.run(["scancel", job_id])
    assert cancelled.exit_status == 0, cancelled.stderr
    assert job_state(job_id) == "CANCELLED"


def test_another_account_cannot_look_into_a_home_directory(
    alice_and_bob: tuple[SSHConnection, SSHConnection],
) -> None:
    alice, bob = alice_and_bob
    home = alice.run(["pwd"]).stdout.strip()

    listing = bob.run(["ls", home])

    assert listing.exit_status != 0
    assert "Permission denied" in listing.stderr
