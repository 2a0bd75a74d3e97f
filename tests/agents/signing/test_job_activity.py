"""The node agent's measure of its job's activity: CPU time and I/O of the job's own processes
between samples, in all and per session launcher with its descendants, read from /proc (a fake
tree, then the real one with real processes), and how heartbeats carry it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from node import activate_agent

TICK = os.sysconf("SC_CLK_TCK")
ME = os.getuid()
JOB = {"ACTIVATE_JOB_ID": "j1"}


def fake(
    proc: Path,
    pid: int,
    *,
    ppid: int = 1,
    start: int = 1000,
    cpu: tuple[float, float, float, float] = (0, 0, 0, 0),
    io: tuple[int, int] | None = (0, 0),
    env: dict[str, str] | None = None,
    argv: tuple[str, ...] = ("python3", "work.py"),
    comm: str = "python3",
) -> None:
    """/proc/<pid> of a process: cpu is utime, stime, cutime, cstime in seconds."""
    where = proc / str(pid)
    where.mkdir(exist_ok=True)
    ticks = [str(round(seconds * TICK)) for seconds in cpu]
    # Fields 3 (state) to 44: ppid is 4, the times 14 to 17, starttime 22.
    fields = ["S", str(ppid), *["0"] * 9, *ticks, *["0"] * 4, str(start), *["0"] * 22]
    (where / "stat").write_bytes(f"{pid} ({comm}) {' '.join(fields)}\n".encode())
    if io is not None:
        (where / "io").write_bytes(
            f"rchar: {io[0]}\nwchar: {io[1]}\nsyscr: 7\nsyscw: 9\nread_bytes: 4096\n".encode()
        )
    environ = JOB if env is None else env
    (where / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    (where / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def end(proc: Path, pid: int) -> None:
    shutil.rmtree(proc / str(pid))


def activity(proc: Path, job_id: str = "j1", job_variable: str = "", own_pid: int = 1):
    return activate_agent.JobActivity(ME, job_id, job_variable, str(proc), own_pid=own_pid)


def test_the_first_sample_is_the_baseline_then_each_reports_what_was_used_since(
    tmp_path: Path,
) -> None:
    fake(tmp_path, 10, cpu=(1, 0.5, 0, 0), io=(1000, 2000))
    watch = activity(tmp_path)
    assert watch.sample() is None

    fake(tmp_path, 10, cpu=(3, 1, 0.25, 0.25), io=(1500, 6000))
    report = watch.sample()
    assert report is not None
    assert report.cpu == pytest.approx(3.0) and report.io == 4500
    assert 0 < report.span < 5 and report.sessions == {}

    report = watch.sample()  # nothing since
    assert report is not None and (report.cpu, report.io) == (0, 0)


def test_a_new_process_counts_whole_an_ended_one_drops_out_and_a_reused_pid_is_new(
    tmp_path: Path,
) -> None:
    fake(tmp_path, 10, cpu=(5, 0, 0, 0), io=(100, 0))
    fake(tmp_path, 11, cpu=(7, 0, 0, 0), io=(0, 100), start=2000)
    watch = activity(tmp_path)
    watch.sample()

    fake(tmp_path, 12, cpu=(2, 1, 0, 0), io=(300, 400))  # started within the span
    end(tmp_path, 10)
    fake(tmp_path, 11, cpu=(0.5, 0, 0, 0), io=(0, 50), start=2500)  # pid 11 again, another one
    report = watch.sample()
    assert report is not None
    assert report.cpu == pytest.approx(3.5) and report.io == 750


def test_a_process_without_io_accounting_counts_its_cpu(tmp_path: Path) -> None:
    fake(tmp_path, 10, io=None)
    watch = activity(tmp_path)
    watch.sample()
    fake(tmp_path, 10, cpu=(2, 0, 0, 0), io=None)
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(2) and report.io == 0


def test_only_the_jobs_processes_count_and_never_the_agent(tmp_path: Path) -> None:
    environments = {
        10: {"HOME": "/h", "ACTIVATE_JOB_ID": "j1", "TERM": "dumb"},
        11: {"ACTIVATE_JOB_ID": "j2"},  # another job of the same user
        12: {"SLURM_JOB_ID": "j1"},  # a step the scheduler started
        13: {"SLURM_JOB_ID": "j2"},
        14: {"ACTIVATE_JOB_ID": "j10"},  # a prefix is not a match
        15: {"X": "ACTIVATE_JOB_ID=j1"},  # nor is a value holding it
        16: {},
        99: {"ACTIVATE_JOB_ID": "j1"},  # the agent itself
    }
    for pid, env in environments.items():
        fake(tmp_path, pid, env=env)
    watches = {
        "plain": activity(tmp_path, own_pid=99),
        "slurm": activity(tmp_path, job_variable="SLURM_JOB_ID", own_pid=99),
        "any": activity(tmp_path, job_id="", job_variable="SLURM_JOB_ID", own_pid=99),
    }
    for watch in watches.values():
        watch.sample()
    for pid, env in environments.items():
        fake(tmp_path, pid, env=env, cpu=(pid, 0, 0, 0))
    cpu = {}
    for name, watch in watches.items():
        report = watch.sample()
        assert report is not None
        cpu[name] = report.cpu
    assert cpu["plain"] == pytest.approx(10)
    assert cpu["slurm"] == pytest.approx(10 + 12)
    assert cpu["any"] == pytest.approx(sum(environments) - 99)


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path: Path) -> None:
    fake(tmp_path, 10, comm="a) (b 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", ppid=7)
    watch = activity(tmp_path)
    watch.sample()
    fake(tmp_path, 10, comm="a) (b 1 2 3", ppid=7, cpu=(1, 2, 3, 4))
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(10)
    assert watch.processes()[10][:3] == (7, 1000, 10 * TICK)


def test_an_unreadable_process_is_skipped_and_the_others_count(tmp_path: Path) -> None:
    fake(tmp_path, 10)
    fake(tmp_path, 11)
    fake(tmp_path, 12)
    (tmp_path / "12" / "stat").write_bytes(b"12 (no closing paren S 1 2 3")
    (tmp_path / "13").mkdir()  # gone while being read: nothing in it
    (tmp_path / "not-a-pid").mkdir()
    watch = activity(tmp_path)
    watch.sample()
    fake(tmp_path, 10, cpu=(1, 0, 0, 0))
    (tmp_path / "11" / "stat").write_bytes(b"11 (short) S 1 0 0\n")
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(1)
    assert set(watch.processes()) == {10}


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a directory to another user")
def test_another_users_process_never_counts(tmp_path: Path) -> None:
    fake(tmp_path, 10)
    fake(tmp_path, 11)
    os.chown(tmp_path / "11", ME + 1000, -1)
    watch = activity(tmp_path, job_id="")
    watch.sample()
    fake(tmp_path, 10, cpu=(1, 0, 0, 0))
    fake(tmp_path, 11, cpu=(50, 0, 0, 0))
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(1)


def test_a_child_its_parent_reaped_is_not_counted_twice(tmp_path: Path) -> None:
    fake(tmp_path, 10, cpu=(1, 0, 0, 0))  # the job script
    fake(tmp_path, 11, ppid=10, cpu=(50, 0, 0, 0), io=(0, 9000))  # its program
    watch = activity(tmp_path)
    watch.sample()
    fake(tmp_path, 11, ppid=10, cpu=(80, 0, 0, 0), io=(0, 10000))
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(30) and report.io == 1000

    # The program used 5 s more and ended; the script waited for it (85 s in its cutime).
    end(tmp_path, 11)
    fake(tmp_path, 10, cpu=(1.5, 0, 80 + 5, 0), io=(0, 10500))
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(5 + 0.5) and report.io == 500


def test_a_child_reaped_after_a_sample_is_owed_until_its_parent_waits(tmp_path: Path) -> None:
    fake(tmp_path, 10, cpu=(1, 0, 0, 0))
    fake(tmp_path, 11, ppid=10, cpu=(50, 0, 0, 0))
    watch = activity(tmp_path)
    watch.sample()
    end(tmp_path, 11)  # a zombie: no environment, so not the job's any more
    fake(tmp_path, 10, cpu=(2, 0, 0, 0))
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(0)  # its own 1 s against the 50
    fake(tmp_path, 10, cpu=(3, 0, 50, 0))  # now reaped
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(2)  # its own 2 s since, late
    fake(tmp_path, 10, cpu=(5, 0, 50, 0))
    report = watch.sample()
    assert report is not None and report.cpu == pytest.approx(2)


def launcher(session: str) -> tuple[str, ...]:
    return ("python3", "-c", "...", "desktop", "--activate-session", session, "--port", "0")


def test_a_session_counts_its_launcher_and_all_its_descendants(tmp_path: Path) -> None:
    tree = {
        # pid: (ppid, argv)
        10: (1, ("bash", "job.sh")),  # the job script: the job's, no session's
        20: (1, launcher("saaaa")),
        21: (20, ("jupyter", "lab")),
        22: (21, ("python3", "-m", "ipykernel")),  # a grandchild
        23: (22, ("sh", "-c", "make")),  # and further down
        30: (1, launcher("sbbbb")),
        31: (30, ("sleep", "9")),
        40: (1, ("bash", "--activate-session")),  # no id: no session
        41: (40, ("cat",)),
    }
    for pid, (ppid, argv) in tree.items():
        fake(tmp_path, pid, ppid=ppid, argv=argv)
    watch = activity(tmp_path)
    watch.sample()
    for pid, (ppid, argv) in tree.items():
        fake(tmp_path, pid, ppid=ppid, argv=argv, cpu=(pid / 10, 0, 0, 0), io=(pid, 0))
    fake(tmp_path, 24, ppid=21, cpu=(1, 0, 0, 0), io=(5, 0))  # a child new since, whole
    fake(tmp_path, 25, ppid=20, argv=launcher("saaaa"), io=(1, 0))  # a fork of the launcher
    report = watch.sample()
    assert report is not None
    assert report.sessions == {
        "saaaa": (pytest.approx(2 + 2.1 + 2.2 + 2.3 + 1), 20 + 21 + 22 + 23 + 5 + 1),
        "sbbbb": (pytest.approx(3 + 3.1), 30 + 31),
    }
    assert report.cpu == pytest.approx(sum(pid / 10 for pid in tree) + 1)
    assert report.io == sum(tree) + 5 + 1
    assert activate_agent.launcher_sessions(ME, str(tmp_path)) == {"saaaa", "sbbbb"}


def test_the_report_is_strings_only_with_the_busiest_30_sessions_first() -> None:
    sessions = {f"s{n:03d}": (n % 7 + n / 1000, n * 1000) for n in range(40)}
    sessions["stie"] = (sessions["s006"][0], 10**9)  # as busy as s006, more I/O
    report = activate_agent.Report(59.96, 12.345, 123456789, sessions)
    fields = activate_agent.report_fields(report)
    assert set(fields) == {"span", "cpu", "io", "sessions"}
    assert (fields["span"], fields["cpu"], fields["io"]) == ("60.0", "12.35", "123456789")
    entries = [entry.split(":") for entry in fields["sessions"].split(",")]
    assert len(entries) == 30
    busiest = sorted(sessions.items(), key=lambda item: (-item[1][0], -item[1][1]))[:30]
    assert [e[0] for e in entries] == [session for session, _ in busiest]
    assert entries[0] == ["s034", "6.03", "34000"]
    assert [e[0] for e in entries].index("stie") < [e[0] for e in entries].index("s006")
    assert "s000" not in fields["sessions"]

    quiet = activate_agent.report_fields(activate_agent.Report(1.0, 0.0, 0, {}))
    assert quiet == {"span": "1.0", "cpu": "0.00", "io": "0", "sessions": ""}


# -- heartbeats --------------------------------------------------------------------------------


class FakePlatform:
    base = "http://platform"

    def __init__(self, activity_interval: object) -> None:
        self.activity_interval = activity_interval
        self.down = False
        self.calls: list[tuple[str, dict]] = []

    def post(self, path: str, payload: dict) -> dict:
        self.calls.append((path, dict(payload)))
        if self.down:
            raise OSError("no route to host")
        if path.endswith("/connect"):
            answer: dict[str, object] = {"heartbeat_interval": 30}
            if self.activity_interval is not None:
                answer["activity_interval"] = self.activity_interval
            return answer
        return {"status": "ok"}


class FakeActivity:
    def __init__(self, reports: list[activate_agent.Report | None]) -> None:
        self.reports = reports

    def sample(self) -> activate_agent.Report | None:
        return self.reports.pop(0)


def agent_with(platform: FakePlatform, activity: FakeActivity) -> activate_agent.Agent:
    identity = {"worker": "wabc", "hostname": "n1", "job_id": "1"}
    return activate_agent.Agent(platform, identity, 30.0, activity)


def beats(platform: FakePlatform) -> list[dict]:
    return [payload for path, payload in platform.calls if path == "/agent/v1/heartbeat"]


@pytest.mark.parametrize("interval", [None, 0, "soon"])
def test_without_an_activity_interval_the_beat_stays_lean(interval: object) -> None:
    platform = FakePlatform(interval)
    activity = FakeActivity([])  # a sample would fail: there is none
    agent = agent_with(platform, activity)
    for _ in range(3):
        agent.beat()
    assert beats(platform) == [{"worker": "wabc"}, {"worker": "wabc"}]


def test_reports_ride_on_heartbeats_once_per_interval_and_survive_a_failed_beat() -> None:
    one = activate_agent.Report(60.0, 1.5, 100, {"saaaa": (1.0, 50)})
    two = activate_agent.Report(61.0, 2.0, 10, {"saaaa": (0.5, 5), "sbbbb": (1.0, 1)})
    three = activate_agent.Report(59.0, 0.25, 1, {})
    platform = FakePlatform(0.05)
    agent = agent_with(platform, FakeActivity([None, one, two, three]))
    agent.beat()  # connects
    agent.beat()  # the baseline
    agent.beat()  # too soon after it
    time.sleep(0.06)
    platform.down = True
    agent.beat()  # carries `one`, lost on the way
    time.sleep(0.06)
    platform.down = False
    agent.beat()  # `one` and `two` together
    agent.beat()
    time.sleep(0.06)
    agent.beat()  # `three` alone
    assert beats(platform) == [
        {"worker": "wabc"},
        {"worker": "wabc"},
        {"worker": "wabc", "span": "60.0", "cpu": "1.50", "io": "100", "sessions": "saaaa:1.00:50"},
        {
            "worker": "wabc",
            "span": "121.0",
            "cpu": "3.50",
            "io": "110",
            "sessions": "saaaa:1.50:55,sbbbb:1.00:1",
        },
        {"worker": "wabc"},
        {"worker": "wabc", "span": "59.0", "cpu": "0.25", "io": "1", "sessions": ""},
    ]


# -- real processes ----------------------------------------------------------------------------


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


WRITER = """
import sys
block = bytes(1 << 20)
with open(sys.argv[1], "wb") as out:
    while True:
        out.seek(0)
        for _ in range(16):
            out.write(block)
        out.flush()
"""


# A busy loop's share of a CPU is what it measures: not beside other tests' load.
@pytest.mark.serial
def test_real_processes_of_three_jobs(started: list[subprocess.Popen], tmp_path: Path) -> None:
    jobs = {name: f"t-{name}-{uuid.uuid4().hex[:12]}" for name in ("busy", "sleep", "writer")}
    commands = {
        "busy": [sys.executable, "-c", "while True: pass"],
        "sleep": ["sleep", "30"],
        "writer": [sys.executable, "-c", WRITER, str(tmp_path / "out")],
    }
    for name, command in commands.items():
        env = {**os.environ, "ACTIVATE_JOB_ID": jobs[name]}
        started.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL))
    watches = {name: activate_agent.JobActivity(ME, job, "") for name, job in jobs.items()}
    time.sleep(0.3)  # past their start, so that the span measures their work only
    for watch in watches.values():
        assert watch.sample() is None
    time.sleep(1.5)
    reports = {name: watch.sample() for name, watch in watches.items()}
    assert all(process.poll() is None for process in started)
    busy, sleep, writer = reports["busy"], reports["sleep"], reports["writer"]
    assert busy is not None and sleep is not None and writer is not None
    assert 1.4 < busy.span < 3
    assert busy.cpu >= 0.5, busy
    assert sleep.cpu < 0.05 and sleep.io < 64 * 1024, sleep
    assert writer.io >= 100 * 10**6, writer
    pids = {name: set(watch.processes()) for name, watch in watches.items()}
    assert pids == {name: {process.pid} for name, process in zip(commands, started, strict=True)}
