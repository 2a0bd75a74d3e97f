"""A node's clock stepped under a running agent, and what its worker's liveness did meanwhile.

A wall clock step (NTP, an operator) moves the realtime clock and never the monotonic one.
libfaketime (Debian's faketime) cannot keep the monotonic clock real on this Python (its
clock_nanosleep then fails with EINVAL), so a step while the agent runs is made by a bootstrap
whose time.time() adds the offset read from a file at each call: ``STEPPED_CLOCK`` for an agent
started here (``start_agent``), ``JobClocks`` for the agent of a real job on the test cluster's
node (the cluster account's usercustomize, acting only for the agents of one platform). An
agent that starts on a clock already off by a constant runs under libfaketime (``faketime``).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from harness import HarnessError
from harness.agents import SignedAgent
from harness.cluster import SshTarget
from node import AGENT_SOURCE_PATH

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

# time.time() as the node's wall clock with the offset the first of ``paths`` that exists
# says (none: the real one): the monotonic clock (the agent's sleeps, its clock between
# answers) is left alone, as a step leaves it. Python 3.6-compatible, as the agent is.
STEPPED_TIME = """
def step_time(*paths):
    import time
    real = time.time
    def stepped():
        for path in paths:
            try:
                with open(path) as handle:
                    return real() + float(handle.read() or 0)
            except FileNotFoundError:
                continue
        return real()
    time.time = stepped
"""

# python -c STEPPED_CLOCK SCRIPT: SCRIPT run on the clock STEP_FILE steps.
STEPPED_CLOCK = (
    STEPPED_TIME
    + """
import os, runpy, sys
step_time(os.environ["STEP_FILE"])
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
)

# The cluster account's usercustomize while a drill steps its jobs' clocks. It acts only in a
# process of a job whose agent calls URL (one platform's agents' server): its clock is stepped
# by STEPS/<worker id>, or STEPS/start until the drill writes that, and its stderr (the agent's
# log, /dev/null in a job) goes to STEPS/<worker id>.log. Any other process: one lookup.
HOOK_MARK = "# Written by harness/clocks.py for a drill; removed when it ends."
JOB_HOOK = (
    HOOK_MARK
    + "\n"
    + STEPPED_TIME
    + """
def node_clock(steps, url):
    import os
    worker = os.environ.get("ACTIVATE_WORKER_ID", "")
    if not worker or os.environ.get("ACTIVATE_URL") != url or not os.path.isdir(steps):
        return
    own = os.path.join(steps, os.path.basename(worker))
    step_time(own, os.path.join(steps, "start"))
    log = os.open(own + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.close(log)

node_clock(%(steps)r, %(url)r)
"""
)


@dataclass(frozen=True)
class StepFile:
    """The offset (seconds) a stepped clock reads at each call."""

    path: Path

    def step_to(self, offset: float) -> None:
        # Written whole at once: a reader never sees half a number.
        part = self.path.with_name(f".{self.path.name}.part")
        part.write_text(repr(offset))
        part.chmod(0o644)
        part.replace(self.path)


def start_agent(
    url: str,
    agent: SignedAgent,
    log: Path,
    *,
    clock: StepFile | None = None,
    faketime: str = "",
    interval: float = 1,
) -> subprocess.Popen[bytes]:
    """The real node agent (node/activate_agent.py) in its own process, as a job script starts
    it, for ``agent``'s worker: on ``clock`` (steppable while it runs) or under libfaketime's
    ``faketime`` offset (e.g. "+10m"), else on this host's clock."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")},
        "ACTIVATE_URL": url,
        "ACTIVATE_WORKER_ID": agent.public_id,
        "ACTIVATE_AGENT_KEY_ID": agent.key_id,
        "ACTIVATE_AGENT_KEY": agent.key,
        "ACTIVATE_HEARTBEAT_INTERVAL": f"{interval:g}",
    }
    argv = [sys.executable, str(AGENT_SOURCE_PATH)]
    if clock is not None:
        env["STEP_FILE"] = str(clock.path)
        argv = [sys.executable, "-c", STEPPED_CLOCK, str(AGENT_SOURCE_PATH)]
    if faketime:
        env.update({"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": faketime})
    with log.open("wb") as sink:
        return subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)


class JobClocks:
    """Steps the clocks of the agents in real jobs of the test cluster (its node is this
    host): installs ``JOB_HOOK`` as the cluster account's usercustomize for the jobs whose
    agent calls ``agent_url``, and removes it (and what it made) on exit. Use as a context
    manager."""

    def __init__(self, target: SshTarget, agent_url: str) -> None:
        self.target = target
        self.agent_url = agent_url
        self.account = pwd.getpwnam(target.user)
        self.steps = Path(tempfile.mkdtemp(prefix="clock-steps-"))
        self.hook: Path | None = None
        self.made: list[Path] = []

    def __enter__(self) -> JobClocks:
        try:
            self._install()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _install(self) -> None:
        os.chown(self.steps, self.account.pw_uid, self.account.pw_gid)
        self.steps.chmod(0o755)
        site = self._user_site()
        hook = site / "usercustomize.py"
        if hook.exists() and not hook.read_text().startswith(HOOK_MARK):
            raise HarnessError(f"{hook} is someone else's: not replaced")
        for folder in reversed([site, *site.parents]):
            if not folder.exists():
                folder.mkdir(mode=0o755)
                os.chown(folder, self.account.pw_uid, self.account.pw_gid)
                self.made.append(folder)
        self.start_at(0.0)
        hook.write_text(JOB_HOOK % {"steps": str(self.steps), "url": self.agent_url})
        hook.chmod(0o644)
        self.hook = hook

    def _user_site(self) -> Path:
        """Where the account's python3 on the node finds its usercustomize (asked as a job's
        login session would)."""
        asked = subprocess.run(
            self.target.ssh_argv(
                "python3", "-c", "'import site; print(site.ENABLE_USER_SITE, site.USER_SITE)'"
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
        enabled, _, site = asked.stdout.strip().partition(" ")
        if asked.returncode != 0 or enabled != "True":
            raise HarnessError(f"no user site for {self.target.user}'s python3: {asked.stderr}")
        if not site.startswith(self.account.pw_dir + "/"):
            raise HarnessError(f"{self.target.user}'s user site {site} is not under its home")
        return Path(site)

    def start_at(self, offset: float) -> None:
        """The offset of the agents that start from now on, until the drill owns theirs."""
        StepFile(self.steps / "start").step_to(offset)

    def clock(self, public_id: str) -> StepFile:
        """The clock of the agent of worker ``public_id`` (give it a value at once: until then
        the agent follows ``start_at``)."""
        return StepFile(self.steps / public_id)

    def agent_log(self, public_id: str) -> str:
        try:
            return (self.steps / f"{public_id}.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self.hook is not None:
            self.hook.unlink(missing_ok=True)
            shutil.rmtree(self.hook.parent / "__pycache__", ignore_errors=True)
            self.hook = None
        for folder in reversed(self.made):
            try:
                folder.rmdir()
            except OSError:
                break  # something else put files there since: theirs
        self.made = []
        shutil.rmtree(self.steps, ignore_errors=True)


@dataclass
class Hold:
    """What one worker set looked like over a hold, sampled every tenth of a second."""

    seconds: float
    # Per worker pk: samples whose liveness key was missing or whose status was not connected.
    lapses: dict[int, int] = field(default_factory=dict)
    # Per worker pk: beats seen land (its liveness key's TTL went up).
    beats: dict[int, int] = field(default_factory=dict)
    # Statuses seen other than connected, per worker pk.
    left: dict[int, set[str]] = field(default_factory=dict)
    # Heartbeat sweeps that completed meanwhile (core/sweep_lag.py's notes, told apart).
    sweeps: int = 0


def watch(worker_ids: list[int], seconds: float, *, every: float = 0.1) -> Hold:
    """Watch the workers' liveness keys and statuses, and the heartbeat sweep, for
    ``seconds``."""
    from core.redis_connection import redis_client
    from core.sweep_lag import DONE_KEY
    from workers_app.liveness import PREFIX
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    client = redis_client()
    hold = Hold(seconds, dict.fromkeys(worker_ids, 0), dict.fromkeys(worker_ids, 0))
    ttls: dict[int, int | None] = dict.fromkeys(worker_ids)
    sweeps_done: set[bytes] = set()
    first_sweep = client.get(f"{DONE_KEY}heartbeats")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pipe = client.pipeline(transaction=False)
        for pk in worker_ids:
            pipe.pttl(f"{PREFIX}{pk}")
        pipe.get(f"{DONE_KEY}heartbeats")
        *remaining, sweep = pipe.execute()
        statuses = dict(Worker.objects.filter(pk__in=worker_ids).values_list("pk", "status"))
        for pk, ttl in zip(worker_ids, remaining, strict=True):
            before = ttls[pk]
            if before is not None and ttl > before:
                hold.beats[pk] += 1
            ttls[pk] = ttl
            if ttl <= 0 or statuses.get(pk) != WorkerStatus.CONNECTED:
                hold.lapses[pk] += 1
                hold.left.setdefault(pk, set()).add(str(statuses.get(pk)))
        if sweep is not None and sweep != first_sweep:
            sweeps_done.add(sweep)
        time.sleep(every)
    hold.sweeps = len(sweeps_done)
    return hold


@dataclass(frozen=True)
class Answered:
    """The agents' server's own count of the beats it answered, and of those it refused by
    status (all its processes, those that ended included)."""

    received: float
    refused: dict[str, float]

    def __sub__(self, before: Answered) -> Answered:
        return Answered(
            self.received - before.received,
            {
                status: count - before.refused.get(status, 0.0)
                for status, count in self.refused.items()
                if count - before.refused.get(status, 0.0)
            },
        )


def beats_answered(metrics: Path) -> Answered:
    """What the agents' server counted in the metrics directory ``metrics``."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics))
    received = registry.get_sample_value("activate_heartbeats_received_total") or 0.0
    refused = {
        sample.labels["status"]: sample.value
        for metric in registry.collect()
        if metric.name == "activate_heartbeats_refused"
        for sample in metric.samples
        if sample.name.endswith("_total")
    }
    return Answered(received, refused)


ACCESS = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO activate\.agents\.access: (\S+) - "
    r'"POST /agent/v1/(\w+) HTTP/[\d.]+" (\d+)$',
    re.MULTILINE,
)


def rebases(access_log: Path) -> list[tuple[str, float | None]]:
    """Each call the agents' server refused for its time (a signed 425), as (endpoint, seconds
    until the same connection's next call was answered 200; None: never)."""
    calls = [
        (datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f").timestamp(), peer, path, int(status))
        for at, peer, path, status in ACCESS.findall(access_log.read_text(errors="replace"))
    ]
    found: list[tuple[str, float | None]] = []
    for index, (at, peer, path, status) in enumerate(calls):
        if status != 425:
            continue
        later = [t for t, p, _, s in calls[index + 1 :] if p == peer and s == 200]
        found.append((path, round(later[0] - at, 3) if later else None))
    return found
