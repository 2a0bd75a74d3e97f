"""A submit loop the platform has left (its command timed out) submits nothing more: over the
real sshd, the channel closed mid-batch, with a submit command that would make its job late."""

from __future__ import annotations

import time

import pytest

from core.transport.connection import SSHConnection
from core.transport.errors import CommandTimeout
from schedulers.gridengine import SUBMIT_COMMAND as QSUB_LOOP
from schedulers.slurm import SUBMIT_COMMAND as SBATCH_LOOP

# Starts, then makes its job only seconds later (as sbatch does, waiting and retrying, while the
# controller refuses new jobs).
SLOW_SUBMIT = """#!/bin/sh
touch "$KEPT/started.$$"
sleep 4
touch "$KEPT/made.$$"
echo 100
"""


def remote(ssh: SSHConnection, script: str, *args: str, stdin: str | None = None) -> str:
    return ssh.run(["sh", "-c", script, "sh", *args], stdin=stdin, timeout=20).stdout


@pytest.mark.parametrize(
    ("submitter", "loop", "header"),
    [("sbatch", SBATCH_LOOP, "n{i} - {size}"), ("qsub", QSUB_LOOP, "n{i} 0 {size}")],
)
def test_a_loop_whose_command_timed_out_ends_its_submit_command_and_starts_no_other(
    ssh: SSHConnection, submitter: str, loop: list[str], header: str
) -> None:
    # Given a login host whose submit command takes 4 s to make each job
    folder = remote(ssh, "mktemp -d").strip()
    try:
        remote(ssh, 'cat > "$1/$2" && chmod 755 "$1/$2"', folder, submitter, stdin=SLOW_SUBMIT)
        script = "#!/bin/sh\ntrue\n"
        stdin = "".join(header.format(i=i, size=len(script)) + "\n" + script for i in range(3))
        env = [f"PATH={folder}:/usr/bin:/bin", f"KEPT={folder}", f"HOME={folder}"]
        argv = ["env", *env, *loop]
        # When the platform gives up on the command after 1.5 s (its channel closed)
        started = time.monotonic()
        with pytest.raises(CommandTimeout):
            ssh.run(argv, stdin=stdin, timeout=1.5)
        time.sleep(max(0.0, started + 6 - time.monotonic()))
        # Then the first job's submit command was ended before it made the job, and no other
        # job's was started
        kept = remote(ssh, 'ls "$1"', folder).split()
        assert sorted(name.split(".")[0] for name in kept if name != submitter) == ["started"]
    finally:
        remote(ssh, 'rm -rf "$1"', folder)
