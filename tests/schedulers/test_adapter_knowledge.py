"""What only a scheduler knows, asked of its adapter: how it writes a wall time, where a running
job finds its own id (handed to the node agent by the job script), and what its interactive
step's failure looks like. Command outputs are recorded from the real programs (data/)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from node import activate_agent, agent_source
from schedulers import adapter_class, names
from schedulers.base import JobSpec, SchedulerAdapter
from schedulers.host import HostAdapter
from schedulers.pbs import PbsAdapter
from schedulers.slurm import SlurmAdapter
from tests.schedulers.conftest import FakeRunner, data, ok

# -- wall time ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "value", "seconds"),
    [
        (SlurmAdapter, "04:00:00", 4 * 3600),
        (SlurmAdapter, "30", 30 * 60),  # sbatch --time: bare minutes
        (SlurmAdapter, "30:15", 30 * 60 + 15),
        (SlurmAdapter, "1-12", 36 * 3600),
        (SlurmAdapter, "2-03:30", (51 * 60 + 30) * 60),
        (SlurmAdapter, "1-00:00:10", 86410),
        (SlurmAdapter, "4 hours", None),
        (SlurmAdapter, "UNLIMITED", None),
        (SlurmAdapter, "", None),
        (PbsAdapter, "04:00:00", 4 * 3600),
        (PbsAdapter, "100:00:00", 100 * 3600),
        (PbsAdapter, "90", 90),  # pbs_resources(7B): bare seconds
        (PbsAdapter, "30:15", 30 * 60 + 15),
        (PbsAdapter, "00:00:10.500", 10),
        (PbsAdapter, "1-12", None),
        (PbsAdapter, "", None),
        (HostAdapter, "04:00:00", 4 * 3600),
        (HostAdapter, "30", None),  # the host takes HH:MM:SS only
        (HostAdapter, "00:00:00", None),  # no limit is not a wall time
        (HostAdapter, "721:00:00", None),  # past the host's 30 days
        (HostAdapter, "", None),
    ],
)
def test_each_scheduler_reads_wall_times_in_its_own_format(
    adapter: type[SchedulerAdapter], value: str, seconds: int | None
) -> None:
    assert adapter.parse_walltime(value) == seconds


@pytest.mark.parametrize(
    ("adapter", "seconds", "written"),
    [
        (SlurmAdapter, 3600, "01:00:00"),
        (SlurmAdapter, 4 * 3600 + 5 * 60 + 6, "04:05:06"),
        (SlurmAdapter, 86410, "1-00:00:10"),
        (SlurmAdapter, 36 * 3600, "1-12:00:00"),
        (PbsAdapter, 3600, "01:00:00"),
        (PbsAdapter, 100 * 3600 + 1, "100:00:01"),
        (HostAdapter, 36 * 3600, "36:00:00"),
    ],
)
def test_each_scheduler_writes_wall_times_in_its_own_format(
    adapter: type[SchedulerAdapter], seconds: int, written: str
) -> None:
    assert adapter.format_walltime(seconds) == written


@pytest.mark.parametrize("scheduler", names())
@pytest.mark.parametrize("seconds", [1, 59, 3600, 4 * 3600 + 61, 86400, 29 * 86400 + 7])
def test_a_written_wall_time_passes_the_field_and_reads_back_the_same(
    scheduler: str, seconds: int
) -> None:
    adapter = adapter_class(scheduler)(FakeRunner())
    [walltime] = [f for f in adapter.default_fields() if f.name == "walltime"]
    written = adapter.format_walltime(seconds)
    assert re.fullmatch(walltime.pattern, written)
    assert adapter.parse_walltime(written) == seconds


@pytest.mark.parametrize("scheduler", names())
def test_the_wall_time_field_proposes_one_hour_in_the_schedulers_words(scheduler: str) -> None:
    adapter = adapter_class(scheduler)(FakeRunner())
    [walltime] = [f for f in adapter.default_fields() if f.name == "walltime"]
    assert (walltime.default, walltime.example) == ("01:00:00", "04:00:00")


# -- the job's id, handed to the agent ------------------------------------------------------


@pytest.fixture
def platform() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An agents' server that records each connect and ends the worker (410, signed)."""
    connects: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            connects.append(json.loads(body))
            nonce = self.headers["Authorization"].split("nonce=")[1].split(",")[0]
            signature = activate_agent.answer_signature(AGENT_KEY, 410, nonce, b"")
            self.send_response(410)
            self.send_header("Content-Length", "0")
            self.send_header(activate_agent.SIGNATURE_HEADER, signature)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", connects
    server.shutdown()
    server.server_close()


AGENT_KEY = "s3cret"


def agent_job(url: str) -> JobSpec:
    # The agent as the platform's job scripts run it (workers_app.actions.jobs.job_spec).
    return JobSpec(
        name="pw-worker-w1",
        partition="",
        directives=[],
        environment={
            "ACTIVATE_URL": url,
            "ACTIVATE_WORKER_ID": "w1",
            "ACTIVATE_AGENT_KEY_ID": "k" * 24,
            "ACTIVATE_AGENT_KEY": AGENT_KEY,
            "ACTIVATE_HEARTBEAT_INTERVAL": "1",
        },
        command=f"exec python3 - <<'AGENT_EOF'\n{agent_source()}\nAGENT_EOF",
    )


# Both schedulers' variables are set, as on no real node: only the adapter's own may count.
NODE_ENVIRONMENT = {"SLURM_JOB_ID": "4242", "PBS_JOBID": "1003.pbs01"}


def run_job_script(script: str) -> None:
    environment = {**os.environ, **NODE_ENVIRONMENT}
    environment.pop("ACTIVATE_JOB_ID", None)
    done = subprocess.run(
        ["bash", "-c", script], env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("adapter", "job_id"), [(SlurmAdapter, "4242"), (PbsAdapter, "1003.pbs01")]
)
def test_the_job_script_hands_the_agent_the_id_its_scheduler_gives_the_job(
    adapter: type[SchedulerAdapter],
    job_id: str,
    platform: tuple[str, list[dict[str, str]]],
) -> None:
    url, connects = platform
    run_job_script(adapter(FakeRunner()).render_script(agent_job(url)))
    assert [c["job_id"] for c in connects] == [job_id]


def test_a_host_job_script_carries_its_own_id_to_the_agent(
    platform: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, connects = platform
    monkeypatch.setattr("schedulers.host.new_job_id", lambda: "20261203120000-0a1b2c3d")
    runner = FakeRunner().on("sh", ok("submitted 20261203120000-0a1b2c3d\n"))
    assert HostAdapter(runner).submit(agent_job(url)) == "20261203120000-0a1b2c3d"
    [(_, script)] = runner.calls
    assert script is not None
    run_job_script(script)
    assert [c["job_id"] for c in connects] == ["20261203120000-0a1b2c3d"]


def test_a_job_without_a_scheduler_id_has_the_agent_report_none(
    platform: tuple[str, list[dict[str, str]]],
) -> None:
    url, connects = platform
    script = SlurmAdapter(FakeRunner()).render_script(agent_job(url))
    environment = {k: v for k, v in os.environ.items() if k not in NODE_ENVIRONMENT}
    subprocess.run(["bash", "-c", script], env=environment, check=True, timeout=60)
    assert [c["job_id"] for c in connects] == [""]


# -- an interactive step that did not start -------------------------------------------------


@pytest.mark.parametrize(
    ("recorded", "why"),
    [
        (
            "srun_job_unknown.txt",
            "srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 99999",
        ),
        (
            "srun_job_expired.txt",
            "srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 2",
        ),
        ("srun_execve_failed.txt", "srun: error: vm: task 0: Exited with exit code 2"),
    ],
)
def test_slurm_says_why_its_step_failed_in_sruns_last_words(recorded: str, why: str) -> None:
    assert SlurmAdapter.interactive_failure(data(recorded)) == why


@pytest.mark.parametrize(
    ("recorded", "why"),
    [
        (
            "ssh_unresolved.txt",
            "ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known",
        ),
        ("ssh_refused.txt", "ssh: connect to host 127.0.0.1 port 1: Connection refused"),
        ("ssh_host_key.txt", "Host key verification failed."),
        ("ssh_permission_denied.txt", "nobodyhere@127.0.0.1: Permission denied (publickey)."),
    ],
)
def test_pbs_says_why_ssh_to_the_node_failed(recorded: str, why: str) -> None:
    assert PbsAdapter.interactive_failure(data(recorded)) == why


@pytest.mark.parametrize(
    "output",
    [
        "",
        '{"ready": true, "host": "cn017", "port": 41234, "pid": 777}\n',
        "Warning: Permanently added 'cn017' (ED25519) to the list of known hosts.\n",
        # The program's own words about ssh or srun are not the step failing.
        "the program ran: ssh: fine, srun: error is a phrase here\n",
    ],
)
@pytest.mark.parametrize("adapter", [PbsAdapter, HostAdapter])
def test_output_of_a_step_that_started_is_no_failure(
    adapter: type[SchedulerAdapter], output: str
) -> None:
    assert adapter.interactive_failure(output) is None


def test_a_started_slurm_step_is_no_failure() -> None:
    assert SlurmAdapter.interactive_failure("") is None
    assert SlurmAdapter.interactive_failure('{"ready": true, "port": 41234, "pid": 7}\n') is None


@pytest.mark.parametrize("recorded", ["srun_job_unknown.txt", "ssh_refused.txt"])
def test_a_plain_host_has_no_step_to_fail(recorded: str) -> None:
    assert HostAdapter.interactive_failure(data(recorded)) is None
