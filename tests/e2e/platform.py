"""The whole platform as real processes (gunicorn, Celery worker, Celery beat) for end-to-end
tests and drills, sharing the test database and Redis with the test process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def wait_for(predicate: Callable[[], object], *, timeout: float, interval: float = 0.25) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout:g}s")
        time.sleep(interval)


@dataclass
class Platform:
    workdir: Path
    knobs: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")}
        environ.update(FAST_KNOBS)
        environ.update(self.knobs)
        environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "activate.settings.test",
                "DATABASE_URL": database_url(),
                "REDIS_URL": settings.REDIS_URL,
                "ACTIVATE_INSTALLATION_ID": settings.ACTIVATE_INSTALLATION_ID,
                "ACTIVATE_PUBLIC_URL": self.url,
                "ACTIVATE_BIND": f"127.0.0.1:{self.port}",
                "ACTIVATE_BEAT_SCHEDULE_FILE": str(self.workdir / "beat-schedule"),
                "ACTIVATE_LOG_LEVEL": "INFO",
                "PYTHON": sys.executable,
            }
        )
        return environ

    def start(self, role: str, name: str | None = None) -> subprocess.Popen[bytes]:
        name = name or role
        log = (self.workdir / f"{name}.log").open("ab")
        command = ["bash", str(REPO / "scripts" / "start.sh"), role]
        if role == "web":
            # No migrate/collectstatic: the test database is already set up.
            command = [
                str(BIN / "gunicorn"),
                "activate.wsgi:application",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "2",
                "--threads",
                "4",
            ]
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        if role == "web":
            wait_for(self._web_answers, timeout=30)
        return process

    def _web_answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

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

    def start_all(self) -> None:
        for role in ("web", "worker", "beat"):
            self.start(role)

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )
