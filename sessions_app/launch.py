"""Starting and stopping a session's program on its worker's node, as the worker's owner.

The program runs in a job step of its own (``srun --jobid=ID --overlap`` on Slurm) whose client
is started detached on the login host, so it outlives the SSH command that started it and
ends with the session (the launcher is sent SIGTERM) or with the job. Its password goes over
stdin, never in a command line, together with the launcher and the session kind's starter;
the launcher's one line of JSON says where it listens. The kind (``sessions_app.kinds``) says
how its program starts and when it is ready.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial

import h11

from core.transport.channels import http_request
from core.transport.errors import SSHError
from node import session_launcher_source
from sessions_app import kinds
from sessions_app.models import Session
from sessions_app.proxy import gate
from workers_app.cluster_access import adapter_for_worker, connection_for, open_tunnel
from workers_app.models import Worker

LAUNCHER = session_launcher_source()
READY_WITHIN = 150.0
POLL_EVERY = 0.5
STATE_DIR = "~/.activate/sessions"


class LaunchFailed(Exception):
    """The program could not be started; the message says why, in the user's words."""


@dataclass(frozen=True)
class Launched:
    host: str
    port: int
    pid: int
    # What logging in to the program gave (a cookie, a token) for the proxy to send.
    login: str = ""


# What the step runs: its stdin is the password's line, then the launcher's source, a NUL and
# the kind's starter. A short command line (what `ps` shows on the node), the password not in it.
BOOTSTRAP = (
    "import sys; SECRET = sys.stdin.readline().strip(); "
    "LAUNCHER, STARTER = sys.stdin.read().split(chr(0), 1); "
    "exec(compile(LAUNCHER, 'activate_session.py', 'exec'))"
)


def _launcher_argv(session: Session) -> list[str]:
    # The session's id in argv (not a secret) lets the worker's agent on the node tell which
    # session a launcher process is, and report it when it ends.
    argv = [
        "python3",
        "-c",
        BOOTSTRAP,
        session.session_type,
        "--activate-session",
        session.public_id,
    ]
    for option, value in kinds.get(session.session_type).starter_options(session).items():
        argv += [option, value]
    if session.folder:
        argv += ["--folder", session.folder]  # the launcher goes there before its starter
    return argv


def _launcher_input(session: Session) -> str:
    starter = kinds.get(session.session_type).starter
    return session.secret() + "\n" + LAUNCHER + "\0" + starter


def launch(session: Session) -> Launched:
    """Start the session's program and wait until its port answers through the tunnel."""
    worker = session.worker
    # The node the scheduler reports, never what the node's side says about itself.
    if not worker.node_hostname:
        raise LaunchFailed("the scheduler has not reported the worker's node")
    adapter = adapter_for_worker(worker)
    step = adapter.interactive_command(worker.scheduler_job_id, _launcher_argv(session), pty=False)
    base = f"{STATE_DIR}/{session.public_id}"
    # Run from the login host's shell: ~ expands there. The step's client is detached
    # (setsid, every stream redirected), so the SSH command returns at once.
    line = (
        f"umask 077 && mkdir -p {STATE_DIR} && cat > {base}.in && "
        f"{{ setsid nohup {step} < {base}.in > {base}.out 2>&1 & }}"
    )
    connection = connection_for(worker.cluster, worker.account)
    result = connection.run(["sh", "-c", line], stdin=_launcher_input(session))
    if result.exit_status != 0:
        raise LaunchFailed(f"could not start the program: {result.stderr.strip()[:300]}")
    kind = kinds.get(session.session_type)
    try:
        # The launcher reports once the program's socket answers: the kind's time to start.
        report = _wait_for_report(worker, base, max(READY_WITHIN, kind.ready_within + 30))
    finally:
        # The step's client keeps writing to its output file unlinked: nothing is left behind.
        connection.run(["sh", "-c", f"rm -f {base}.in {base}.out"])
    host = worker.node_hostname
    port, pid = int(str(report["port"])), int(str(report["pid"]))
    deadline = time.monotonic() + kind.ready_within
    while True:
        try:
            login = kind.log_in(partial(_request, worker, host, port, session.secret()), session)
            break
        except (SSHError, OSError, h11.ProtocolError) as exc:
            if time.monotonic() > deadline:
                raise LaunchFailed(
                    f"the program does not answer through the tunnel: {exc}"
                ) from exc
            time.sleep(POLL_EVERY)
    return Launched(host=host, port=port, pid=pid, login=login)


def _wait_for_report(worker: Worker, base: str, within: float) -> dict[str, object]:
    connection = connection_for(worker.cluster, worker.account)
    adapter = adapter_for_worker(worker)
    deadline = time.monotonic() + within
    output = ""
    while time.monotonic() < deadline:
        output = connection.run(["sh", "-c", f"cat {base}.out 2>/dev/null"]).stdout
        for text in output.splitlines():
            try:
                report = json.loads(text)
            except ValueError:
                continue
            if isinstance(report, dict) and report.get("ready"):
                return report
            if isinstance(report, dict) and "error" in report:
                raise LaunchFailed(_shortened(str(report["error"])))
        failure = adapter.interactive_failure(output)
        if failure:
            raise LaunchFailed(failure[:300])
        time.sleep(POLL_EVERY)
    tail = output.strip().splitlines()[-1:] or ["no output"]
    raise LaunchFailed(f"the program did not start within {within:g} s ({tail[0][:200]})")


def _shortened(error: str, room: int = 480) -> str:
    """An app's starter ends its error with the program's last lines: the start and the end are
    kept, the middle gives way."""
    if len(error) <= room:
        return error
    return error[: room // 3] + " ... " + error[-(room - room // 3 - 5) :]


def end_earlier_launchers(session: Session) -> None:
    """An earlier start of this session broke off (its SSH connection dropped, say): whatever
    launcher it left on the node ends before another starts."""
    worker = session.worker
    # "[-]-": the pattern matches the launcher's command line but not pkill's own.
    pattern = f"[-]-activate-session {session.public_id}( |$)"
    adapter_for_worker(worker).run_in_job(
        worker.scheduler_job_id, ["pkill", "-TERM", "-f", "--", pattern], timeout=30
    )


def stop(session: Session) -> None:
    """Send the launcher SIGTERM: it ends its programs, and its job step ends with it."""
    worker = session.worker
    if session.node_pid is None or not worker.scheduler_job_id:
        return
    adapter_for_worker(worker).run_in_job(
        worker.scheduler_job_id, ["kill", "-TERM", str(session.node_pid)], timeout=30
    )


def is_running(session: Session) -> bool:
    """Whether the session's launcher still runs on the node (False: it has ended)."""
    worker = session.worker
    if session.node_pid is None or not worker.scheduler_job_id:
        return False
    result = adapter_for_worker(worker).run_in_job(
        worker.scheduler_job_id, ["kill", "-0", str(session.node_pid)], timeout=30
    )
    return result.exit_status == 0


def _request(
    worker: Worker,
    host: str,
    port: int,
    secret: str,
    method: str,
    target: str,
    body: bytes,
    extra: list[tuple[str, str]],
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    connection, channel = open_tunnel(worker, host, port)
    try:
        gate.open_blocking(channel, secret, "http")
        headers = [("Host", f"{host}:{port}"), ("Connection", "close"), *extra]
        if body:
            headers.append(("Content-Length", str(len(body))))
        return http_request(channel, method, target, headers, body)
    finally:
        channel.close()
        connection.tunnel_closed()
