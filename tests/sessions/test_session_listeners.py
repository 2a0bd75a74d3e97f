"""Every kind of session listens on its launcher's gate and no other TCP port: for each kind in
the registry (a new kind is audited with no new test), a session on one worker of alice's, then
every TCP socket in LISTEN state of her cluster account's uid held by a process of the worker's
Slurm job (tests/sessions/listener_audit.py). A listener planted in the job shows the audit
looks. Real Slurm over real SSH."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from sessions_app import kinds
from tests.sessions.listener_audit import Listener, report, tcp_listeners, unexpected
from tests.sessions.test_neighbour_jupyter_kernels import execute_request, kernel_channel, printed
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    created,
    environment,
    pw,
    session_platform,
    session_state,
    session_tools,
    shared_session_platform,
    worker_of,
)
from workers_app.models import ApiKey

pytestmark = [pytest.mark.slurm, pytest.mark.live]


def with_a_kernel(session: dict[str, Any], key: str, stack: ExitStack) -> None:
    """A kernel started and a cell run through the platform, kept while the audit looks."""
    _, ws = kernel_channel(session, key)
    stack.enter_context(ws)
    msg_id, request = execute_request("print('kernel up')")
    ws.send(request)
    printed(ws, msg_id, "kernel up")


# What a kind's session does, by its name, before the audit (every other kind: nothing).
EXERCISES: dict[str, Callable[[dict[str, Any], str, ExitStack], None]] = {
    "jupyter": with_a_kernel,
}


def test_every_kind_of_session_listens_on_its_gate_alone_and_a_planted_listener_is_named(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner = sorted(ssh_target.accounts)[0]
    uid = int(subprocess.run(["id", "-u", owner], capture_output=True, text=True).stdout)
    worker_id = worker_of(pw)
    _, key = ApiKey.issue(alice)
    found: dict[str, list[Listener]] = {}
    with ExitStack() as last:
        for name in kinds.names():
            with ExitStack() as stack:
                # Given: a session of this kind on her worker (exercised as its kind says).
                session, _ = created(pw, "--type", name, "sessions", "--worker", worker_id)
                job = str(session["job_id"])
                EXERCISES.get(name, lambda *_: None)(session, key, stack)
                gate = session_state(session["id"]).node_port or 0

                # When: the audit lists her uid's listeners held by her job's processes.
                def in_job(listener: Listener, job: str = job) -> bool:
                    return listener.job == job

                listeners = [found for found in tcp_listeners(uid) if in_job(found)]
                print(f"{name}: her job {job} listens on\n{report(listeners)}")
                # Then: the gate (the audit sees it) and nothing else.
                assert gate in {listener.port for listener in listeners}, report(listeners)
                found[name] = unexpected(listeners, gate_port=gate, in_session=in_job)
                if name != kinds.names()[-1]:
                    assert pw("sessions", "stop", session["id"]).returncode == 0
                else:
                    last.push(stack.pop_all())
        assert not any(found.values()), "\n".join(f"{k}:\n{report(v)}" for k, v in found.items())

        # When: she starts a web server of her own in the job, beside the last session.
        step = ["srun", f"--jobid={job}", "--overlap", "--ntasks=1"]
        server_argv = ["python3", "-m", "http.server", "0", "--bind", "127.0.0.1"]
        planted = subprocess.Popen(
            ["runuser", "-u", owner, "--", *step, *server_argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,
        )
        try:
            named: list[Listener] = []

            def audited() -> bool:
                named[:] = unexpected(tcp_listeners(uid), gate_port=gate, in_session=in_job)
                return bool(named)

            wait_for(audited, timeout=60)
            # Then: the audit names it, and only it.
            print(f"planted in job {job}, the audit printed:\n{report(named)}")
            (server,) = named
            assert server.argv[-5:] == ("-m", "http.server", "0", "--bind", "127.0.0.1")
            assert server.job == job and server.address == "127.0.0.1"
        finally:
            os.killpg(planted.pid, signal.SIGTERM)  # srun passes it on to its step
            try:
                planted.wait(timeout=30)
            except subprocess.TimeoutExpired:
                planted.kill()
                planted.wait()
        assert pw("sessions", "stop", session["id"]).returncode == 0
