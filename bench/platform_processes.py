"""The platform as real processes (tests/e2e/platform.py), with what benchmarks and drills add:
their own Redis, the web server exactly as scripts/start.sh runs it, and readiness from logs."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.harness import REPO, HarnessError
from tests.e2e.platform import Platform

# The reconcile sweep is the safety net that cancels this installation's orphaned jobs; it is
# pushed out of the way so that a drill shows the direct paths (cancel on delete, adoption on
# retry) holding on their own, not the net catching what they dropped.
NO_RECONCILE = {"ACTIVATE_RECONCILE_INTERVAL": "86400"}

# The README's defaults: what a deployment runs with.
PRODUCTION_KNOBS = {
    "ACTIVATE_HEARTBEAT_INTERVAL": "30",
    "ACTIVATE_HEARTBEAT_TIMEOUT": "120",
    "ACTIVATE_SWEEP_INTERVAL": "10",
    "ACTIVATE_POLL_INTERVAL": "30",
    "ACTIVATE_PROBE_INTERVAL": "300",
    "ACTIVATE_SUBMIT_LEASE": "60",
    "ACTIVATE_TASK_VISIBILITY_TIMEOUT": "600",
}


@dataclass
class BenchPlatform(Platform):
    redis_url: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        environ = super().env()
        environ.update(NO_RECONCILE)
        environ.update(self.knobs)
        if self.redis_url:
            environ["REDIS_URL"] = self.redis_url
        environ.update(self.extra_env)
        return environ

    def start_deployed_web(
        self, *, workers: int, threads: int, name: str = "web"
    ) -> subprocess.Popen[bytes]:
        """gunicorn exactly as `scripts/start.sh web` runs it, with production settings."""
        environ = self.env()
        environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "activate.settings.prod",
                "ACTIVATE_SECRET_KEY": secrets.token_urlsafe(40),
                "ACTIVATE_WEB_WORKERS": str(workers),
                "ACTIVATE_WEB_THREADS": str(threads),
            }
        )
        log = (self.workdir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "start.sh"), "web"],
            cwd=REPO,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        if not self._wait(self._web_answers, 90):
            raise HarnessError(f"the web server did not answer\n{self.logs()}")
        return process

    def start_worker(self, name: str = "worker") -> subprocess.Popen[bytes]:
        """A Celery worker, returned once it consumes tasks."""
        log_path = self.workdir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        process = self._start_with("worker", name, {})
        if not self._wait(lambda: b" ready." in _tail(log_path, offset), 90):
            raise HarnessError(f"the Celery worker did not get ready\n{self.logs()}")
        return process

    def start_web(self, name: str = "web") -> subprocess.Popen[bytes]:
        return self.start("web", name)

    def start_beat(self, name: str = "beat") -> subprocess.Popen[bytes]:
        # Each beat process keeps its own schedule file, as two separate deployments would.
        schedule = self.workdir / f"{name}-schedule"
        return self._start_with("beat", name, {"ACTIVATE_BEAT_SCHEDULE_FILE": str(schedule)})

    def _start_with(self, role: str, name: str, environ: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        full = self.env()
        full.update(environ)
        process = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "start.sh"), role],
            cwd=REPO,
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def start_everything(self) -> None:
        self.start_web()
        self.start_worker()
        self.start_beat()

    def kill(self, name: str) -> None:
        """SIGKILL a process and all its children at once (no chance to clean up)."""
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

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

    def api(self, key: str, timeout: float = 30) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout
        )

    @staticmethod
    def _wait(predicate: object, timeout: float) -> bool:
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.2)
        return False


def _tail(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()
    except OSError:
        return b""
