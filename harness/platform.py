"""The whole platform as real processes (web and agents' servers, Celery worker, the sweeper,
Celery beat), each started the way scripts/start.sh starts it, with its timing knobs, logging to
a work directory.

The processes share the database and Redis of the calling process (Django's settings), unless
``redis_url`` names another Redis.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from django.conf import settings

from harness import REPO, HarnessError
from harness.waiting import wait_until

BIN = Path(sys.executable).parent
START = REPO / "scripts" / "start.sh"

# Seconds, not minutes: a whole life (submit, connect, beat, time out) fits in a test.
FAST_KNOBS = {
    "ACTIVATE_HEARTBEAT_INTERVAL": "1",
    "ACTIVATE_HEARTBEAT_TIMEOUT": "6",
    "ACTIVATE_SWEEP_INTERVAL": "1",
    "ACTIVATE_POLL_INTERVAL": "2",
    "ACTIVATE_PROBE_INTERVAL": "30",
    "ACTIVATE_RECONCILE_INTERVAL": "30",
    "ACTIVATE_SUBMIT_LEASE": "15",
    "ACTIVATE_TASK_VISIBILITY_TIMEOUT": "30",
}

# The README's defaults: what a deployment runs with.
PRODUCTION_KNOBS = {
    "ACTIVATE_HEARTBEAT_INTERVAL": "30",
    "ACTIVATE_HEARTBEAT_TIMEOUT": "120",
    "ACTIVATE_SWEEP_INTERVAL": "10",
    "ACTIVATE_POLL_INTERVAL": "30",
    "ACTIVATE_PROBE_INTERVAL": "300",
    "ACTIVATE_RECONCILE_INTERVAL": "300",
    "ACTIVATE_SUBMIT_LEASE": "60",
    "ACTIVATE_TASK_VISIBILITY_TIMEOUT": "600",
}

# The reconcile sweep is the safety net that cancels this installation's orphaned jobs; benchmarks
# and drills push it out of the way so that they show the direct paths (cancel on delete,
# adoption on retry) holding on their own, not the net catching what they dropped.
NO_RECONCILE = {"ACTIVATE_RECONCILE_INTERVAL": "86400"}


@dataclass(frozen=True)
class Shape:
    """How many processes each server runs and how many tasks each Celery worker takes at once."""

    web_workers: int
    agent_workers: int
    celery_concurrency: int
    sweeper_concurrency: int

    def knobs(self) -> dict[str, str]:
        return {
            "ACTIVATE_WEB_WORKERS": str(self.web_workers),
            "ACTIVATE_AGENT_WORKERS": str(self.agent_workers),
            "ACTIVATE_CELERY_CONCURRENCY": str(self.celery_concurrency),
            "ACTIVATE_SWEEPER_CONCURRENCY": str(self.sweeper_concurrency),
        }


# scripts/start.sh's numbers: benchmarks, drills and the tests that are about them.
SHIPPED = Shape(web_workers=2, agent_workers=2, celery_concurrency=4, sweeper_concurrency=2)
# One process a server and a smaller Celery pool: the same code paths at about half a start's
# CPU (a platform started about 14 CPU-seconds shipped, 6.6 slim), which the tests' many
# platforms on two cores wait on. The sweeper keeps its shipped two (with one, beside four test
# processes, an idle worker went unwarned for a minute). tests/conftest.py makes it the tests'
# default.
SLIM = Shape(web_workers=1, agent_workers=1, celery_concurrency=2, sweeper_concurrency=2)
DEFAULT_SHAPE = SHIPPED
READY_WITHIN = 90.0


# What each run started, by process name, as said after it ended (harness/runner.py): the
# processes `make run` runs or not, and the settings that differ from the shipped ones.
_started: dict[str, tuple[str, str]] = {}


def started_processes() -> list[str]:
    """What was started since the last call, a line a process and one for the settings when
    they all share them; forgotten once read."""
    shared = len({said for _, said in _started.values()}) == 1
    lines = [
        f"ran {name}: {how}" + ("" if shared else f"; {said}")
        for name, (how, said) in _started.items()
    ]
    if shared:
        lines.append(f"all on {next(iter(_started.values()))[1]}")
    _started.clear()
    return lines


def settings_said(environ: dict[str, str]) -> str:
    """The settings module, and each knob that differs from the README's defaults."""
    module = environ.get("DJANGO_SETTINGS_MODULE", "activate.settings.dev").rsplit(".", 1)[-1]
    shipped = {**PRODUCTION_KNOBS, **SHIPPED.knobs()}
    changed = [
        (f"{name} set" if SECRET_NAME.search(name) else f"{name}={environ[name]}")
        + (f" (shipped {shipped[name]})" if name in shipped else "")
        for name in sorted(environ)
        if name.startswith("ACTIVATE_")
        and name not in PLACES
        and environ[name] != shipped.get(name)
    ]
    said = f"{module} settings{MODULES.get(module, '')}"
    return said + (f", {', '.join(changed)}" if changed else "")


MODULES = {
    "test": " (the shipped ones but for a fixed secret key, MD5 password hashing and no hearing "
    "probe unless set)",
}


# Said as set, never with their value: records and logs are read by others.
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|_KEY$")
# Where things are, not how they behave: not worth saying.
PLACES = {
    "ACTIVATE_INSTALLATION_ID",
    "ACTIVATE_PUBLIC_URL",
    "ACTIVATE_BIND",
    "ACTIVATE_AGENT_URL",
    "ACTIVATE_AGENT_BIND",
    "ACTIVATE_LOG_LEVEL",
    "ACTIVATE_BEAT_SCHEDULE_FILE",
    "ACTIVATE_ALLOWED_HOSTS",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url() -> str:
    """This process's database as the platform's DATABASE_URL (several hosts as libpq's list,
    with what picks the one that takes writes)."""
    db = settings.DATABASES["default"]
    hosts = str(db["HOST"]).split(",")
    ports = str(db["PORT"] or "").split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports  # one port for every host
    where = ",".join(f"{h}:{p}" if p else h for h, p in zip(hosts, ports, strict=True))
    url = f"postgres://{db['USER']}@{where}/{db['NAME']}"
    attrs = (db.get("OPTIONS") or {}).get("target_session_attrs")
    return f"{url}?target_session_attrs={attrs}" if attrs and len(hosts) > 1 else url


@dataclass
class Platform:
    workdir: Path
    # On top of FAST_KNOBS.
    knobs: dict[str, str] = field(default_factory=dict)
    redis_url: str = ""
    port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)
    # Where the agents' server listens: another loopback address (127.0.0.7) proves that agents
    # of a via-login-host cluster, told only the relay's address, never needed this one.
    agent_host: str = "127.0.0.1"
    # Where the web server listens (a host cut off: its namespace's address).
    web_host: str = "127.0.0.1"
    # Before every process's argv: e.g. ``ip netns exec NAME`` for a host that can be cut off.
    wrap: list[str] = field(default_factory=list)
    # Also run `scripts/start.sh relays` (clusters whose agents go via the login host).
    relays: bool = False
    # The web server as `scripts/start.sh web` runs it, with its shipped processes and threads
    # (drills), instead of uvicorn started directly (tests: no migrate or collectstatic).
    web_as_shipped: bool = False
    # What users and agents are told, when not this platform's own servers: a load balancer's
    # addresses in front of several hosts (harness/balancer.py).
    public_url: str = ""
    agents_url: str = ""
    shape: Shape = field(default_factory=lambda: DEFAULT_SHAPE)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # While start_all spawns: the readiness checks it then waits for together.
    _pending_ready: list[tuple[Callable[[], object], str]] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.web_host}:{self.port}"

    @property
    def agent_url(self) -> str:
        """The agents' own server, which job scripts call back on."""
        return f"http://{self.agent_host}:{self.agent_port}"

    def env(self) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")}
        environ.update(FAST_KNOBS)
        environ.update(self.shape.knobs())
        # The processes' metrics meet in the run's own directory, not the checkout's data/.
        environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.workdir / "metrics")
        environ.update(self.knobs)
        environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "activate.settings.test",
                "DATABASE_URL": database_url(),
                "REDIS_URL": self.redis_url or settings.REDIS_URL,
                "ACTIVATE_INSTALLATION_ID": settings.ACTIVATE_INSTALLATION_ID,
                "ACTIVATE_PUBLIC_URL": self.public_url or self.url,
                "ACTIVATE_BIND": f"{self.web_host}:{self.port}",
                "ACTIVATE_AGENT_URL": self.agents_url or self.agent_url,
                "ACTIVATE_AGENT_BIND": f"{self.agent_host}:{self.agent_port}",
                "ACTIVATE_LOG_LEVEL": "INFO",
                "PYTHON": sys.executable,
            }
        )
        hosts = {self.agent_host, self.web_host} - {"127.0.0.1"}
        if hosts:
            environ["ACTIVATE_ALLOWED_HOSTS"] = ",".join(["127.0.0.1", "localhost", *sorted(hosts)])
        return environ

    # -- starting ---------------------------------------------------------------------------

    def start_web(
        self, name: str = "web", *, workers: int | None = None
    ) -> subprocess.Popen[bytes]:
        """The ASGI web server on the test settings (``workers`` processes, None: as shipped),
        returned once /health/ answers.

        Not through start.sh unless ``web_as_shipped``: that migrates and collects static
        files, which the test database does not need.
        """
        if self.web_as_shipped:
            return self.start_deployed_web(name=name, workers=workers, production=False)
        workers = workers or self.shape.web_workers
        argv = [str(BIN / "uvicorn"), "activate.asgi:application", "--host", self.web_host]
        argv += ["--port", str(self.port), "--workers", str(workers), "--lifespan", "off"]
        how = (
            f"uvicorn activate.asgi:application, {workers} processes, not through start.sh "
            "(no migrate, collectstatic, proxy headers or WebSocket pings)"
        )
        process = self._spawn(name, argv, self.env(), how)
        self._ready(self._web_answers, "the web server did not answer")
        return process

    def start_deployed_web(
        self,
        *,
        workers: int | None = None,
        threads: int | None = None,
        name: str = "web",
        production: bool = True,
    ) -> subprocess.Popen[bytes]:
        """The web server exactly as `scripts/start.sh web` runs it (its shipped numbers of
        processes and threads unless given), with production settings unless not
        ``production``: then the test settings, whose secret key decrypts the clusters' keys
        the tests stored."""
        environ = self.env()
        if production:
            environ.update(
                {
                    "DJANGO_SETTINGS_MODULE": "activate.settings.prod",
                    "ACTIVATE_SECRET_KEY": secrets.token_urlsafe(40),
                    "ACTIVATE_AGENT_PLAIN_HTTP": "true",
                }
            )
        if workers is not None:
            environ["ACTIVATE_WEB_WORKERS"] = str(workers)
        if threads is not None:
            environ["ACTIVATE_WEB_THREADS"] = str(threads)
        how = (
            "scripts/start.sh web"
            + (f", {workers} process(es)" if workers is not None else ", its shipped processes")
            + (f" of {threads} threads" if threads is not None else " and threads")
        )
        process = self._spawn(name, ["bash", str(START), "web"], environ, how)
        self._ready(self._web_answers, "the web server did not answer")
        return process

    def start_agents(self, name: str = "agents") -> subprocess.Popen[bytes]:
        """The agents' server as `scripts/start.sh agents` runs it, once its ping answers."""
        process = self._spawn(name, ["bash", str(START), "agents"], self.env(), "start.sh agents")
        self._ready(self._agents_answer, "the agents' server did not answer")
        return process

    def start_worker(
        self, name: str = "worker", *, role: str = "worker"
    ) -> subprocess.Popen[bytes]:
        """A Celery worker (``role`` "sweeper": the one for the sweeps alone), returned once it
        consumes tasks."""
        log_path = self.workdir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        process = self._spawn(name, ["bash", str(START), role], self.env(), f"start.sh {role}")
        self._ready(
            lambda: b" ready." in _tail(log_path, offset), f"the Celery {role} did not get ready"
        )
        return process

    def start_sweeper(self, name: str = "sweeper") -> subprocess.Popen[bytes]:
        """`scripts/start.sh sweeper`: the Celery worker of the sweeps queue."""
        return self.start_worker(name, role="sweeper")

    def start_beat(self, name: str = "beat") -> subprocess.Popen[bytes]:
        # Each beat process keeps its own schedule file, as two separate deployments would.
        environ = self.env()
        environ["ACTIVATE_BEAT_SCHEDULE_FILE"] = str(self.workdir / f"{name}-schedule")
        return self._spawn(name, ["bash", str(START), "beat"], environ, "start.sh beat")

    def start_relays(self, name: str = "relays") -> subprocess.Popen[bytes]:
        """`scripts/start.sh relays`: keeps the relays of via-login-host clusters."""
        return self._spawn(name, ["bash", str(START), "relays"], self.env(), "start.sh relays")

    def start_all(self) -> None:
        """Web server, agents' server, Celery worker, sweeper and beat (and the relays' keeper
        if asked), started together and waited for together; if one does not start, none is
        left running."""
        self._pending_ready = []
        try:
            self.start_web()
            self.start_agents()
            self.start_worker()
            self.start_sweeper()
            self.start_beat()
            if self.relays:
                self.start_relays()
            waiting, self._pending_ready = self._pending_ready, None
            deadline = time.monotonic() + READY_WITHIN
            while waiting:
                waiting = [(ready, failure) for ready, failure in waiting if not ready()]
                if waiting and time.monotonic() > deadline:
                    raise HarnessError(f"{waiting[0][1]}\n{self.logs()}")
                time.sleep(0.05)
        except BaseException:
            self._pending_ready = None
            self.stop_all()
            raise

    @contextmanager
    def running(self) -> Iterator[Platform]:
        """The whole platform for the length of a ``with`` block."""
        self.start_all()
        try:
            yield self
        finally:
            self.stop_all()

    def _spawn(
        self, name: str, argv: list[str], environ: dict[str, str], how: str
    ) -> subprocess.Popen[bytes]:
        _started[name] = (how, settings_said(environ))
        with (self.workdir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [*self.wrap, *argv],
                cwd=REPO,
                env=environ,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        return process

    def _ready(self, predicate: Callable[[], object], failure: str) -> None:
        if self._pending_ready is not None:
            self._pending_ready.append((predicate, failure))
        elif not wait_until(predicate, timeout=READY_WITHIN):
            raise HarnessError(f"{failure}\n{self.logs()}")

    def _web_answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _agents_answer(self) -> bool:
        try:
            return httpx.get(f"{self.agent_url}/agent/v1/ping", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    # -- stopping ---------------------------------------------------------------------------

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def kill(self, name: str) -> None:
        """SIGKILL a process and all its children at once (no chance to clean up)."""
        self.stop(name, signal.SIGKILL)

    def stop_all(self) -> None:
        """SIGTERM to every process at once, each waited for (SIGKILL after 20 s)."""
        running = {n: p for n, p in self.processes.items() if p.poll() is None}
        self.processes.clear()
        for process in running.values():
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in running.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def kill_all(self) -> list[str]:
        """SIGKILL every process (and its children) at once, as when the host is lost: the names
        of those that were running."""
        running = {n: p for n, p in self.processes.items() if p.poll() is None}
        for process in running.values():
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in running.values():
            process.wait(timeout=10)
        self.processes.clear()
        return sorted(running)

    # -- looking in -------------------------------------------------------------------------

    def child_pids(self, name: str) -> list[int]:
        """Processes of the group (e.g. Celery's prefork children), leader excluded."""
        process = self.processes.get(name)
        if process is None:
            return []
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == process.pid:
                continue
            try:
                if os.getpgid(int(proc.name)) == process.pid:
                    pids.append(int(proc.name))
            except OSError:
                continue
        return pids

    def redis_client(self) -> redis.Redis:
        """A client of the Redis the processes use."""
        return redis.Redis.from_url(self.redis_url or settings.REDIS_URL, socket_timeout=5)

    def api(self, key: str, timeout: float = 30) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )

    def log_count(self, text: str) -> int:
        """Occurrences of ``text`` in every process's log (all restarts)."""
        return sum(p.read_text(errors="replace").count(text) for p in self.workdir.glob("*.log"))


def _tail(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()
    except OSError:
        return b""
