"""Operators' apps on this machine (the test cluster's node), each started as the platform starts
it: the real launcher (node/activate_session.py) with the app starter (node/starters/app.py)
sent after it on stdin, run as the test cluster's first account (pwalice) by `runuser`; the
second account (pwbob) is the neighbour. No platform and no scheduler: what is tested is what
happens on the node. The neighbour watcher (tests/watched.py) is told each run's password."""

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from harness import REPO
from harness.cluster import SshTarget
from harness.watcher import Watcher
from node import session_launcher_source, starter_source
from sessions_app.launch import BOOTSTRAP
from sessions_app.proxy import gate
from tests.processes import args_of, descendants, identities, still_running

NODE_PYTHON = "/usr/bin/python3"
APPS = REPO / "docs" / "apps"
SESSION_ID = "apptest"


def encoded(spec: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(spec).encode()).decode()


def spec_from_yaml(name: str, values: dict[str, str], base_url: str) -> dict[str, Any]:
    """What the platform tells the starter of an app in docs/apps/ (the contract's shape)."""
    data = yaml.safe_load((APPS / f"{name}.yaml").read_text())
    return {
        "name": data["name"],
        "command": [str(token) for token in data["command"]],
        "env": {str(k): str(v) for k, v in (data.get("env") or {}).items()},
        "reach": data["reach"],
        "values": values,
        "base_url": base_url,
        "start_timeout": data["ready"]["timeout"],
    }


@dataclass
class Launched:
    """One launcher run: its report (ready, or the error it failed with) and its processes."""

    spec: dict[str, Any]
    secret: str
    report: dict[str, Any]
    launcher: subprocess.Popen[str]
    took: float
    known: set[tuple[int, int]] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return int(self.report["pid"])

    def processes(self) -> list[int]:
        return [self.pid, *descendants(self.pid)]

    def program(self) -> int:
        """The app's own program: the newest process under the launcher, not the helper."""
        helpers = [p for p in self.processes() if "--private-network" in args_of(p)]
        candidates = [p for p in self.processes() if p != self.pid and p not in helpers]
        return candidates[0] if candidates else helpers[0]

    def request(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """One HTTP/1.0 request through the gate, as the platform's proxy sends it."""
        with socket.create_connection(("127.0.0.1", self.report["port"]), timeout=30) as channel:
            gate.open_blocking(channel, self.secret, "http")  # type: ignore[arg-type]
            lines = [f"GET {path} HTTP/1.0", "Host: node"]
            lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
            channel.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            answer = b"".join(iter(lambda: channel.recv(65536), b""))
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split()[1]), body


@dataclass
class AppRunner:
    owner: str
    neighbour: str
    watcher: Watcher
    runs: list[Launched] = field(default_factory=list)

    @property
    def owner_uid(self) -> int:
        return pwd.getpwnam(self.owner).pw_uid

    def launch(
        self, spec: dict[str, Any], *, prefix: tuple[str, ...] = (), folder: str = ""
    ) -> Launched:
        """Start the app as the owner (in ``folder``, as the platform says it) and wait for
        the launcher's one line."""
        secret = secrets.token_urlsafe(24)
        self.watcher.book.add(secret, "an app session's password")
        argv = [NODE_PYTHON, "-c", BOOTSTRAP, "app", "--activate-session", SESSION_ID]
        argv += ["--spec-b64", encoded(spec)]
        argv += ["--folder", folder] if folder else []
        began = time.monotonic()
        launcher = subprocess.Popen(
            ["runuser", "-u", self.owner, "--", *prefix, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
            start_new_session=True,
        )
        assert launcher.stdin is not None and launcher.stdout is not None
        launcher.stdin.write(
            secret + "\n" + session_launcher_source() + "\0" + starter_source("app")
        )
        launcher.stdin.close()
        line = launcher.stdout.readline()
        took = time.monotonic() - began
        report = json.loads(line) if line else {"error": "the launcher said nothing"}
        run = Launched(spec, secret, report, launcher, took)
        if report.get("ready"):
            run.known = identities(run.processes())
        self.runs.append(run)
        return run

    def as_neighbour(self, code: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runuser", "-u", self.neighbour, "--", NODE_PYTHON, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )

    def stop_all(self) -> list[str]:
        """Each launcher ended as the platform ends it (SIGTERM); what outlived them."""
        left: list[str] = []
        for run in self.runs:
            if run.report.get("ready"):
                try:
                    os.kill(run.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                run.launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(run.launcher.pid, signal.SIGKILL)
                run.launcher.wait()
                left.append(f"launcher {run.pid} ignored SIGTERM")
            deadline = time.monotonic() + 10
            while still_running(run.known) and time.monotonic() < deadline:
                time.sleep(0.1)
            left += still_running(run.known)
        return left


@pytest.fixture(scope="session")
def session_tools() -> None:
    """What sessions run on the node (this machine), the apps of docs/apps/ among them:
    scripts/session-tools.sh, cached."""
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "session-tools.sh")], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(f"scripts/session-tools.sh failed:\n{done.stderr[-3000:]}")


@pytest.fixture
def apps(ssh_target: SshTarget, neighbour_watcher: Watcher) -> Iterator[AppRunner]:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    runner = AppRunner(owner, neighbour, neighbour_watcher)
    yield runner
    left = runner.stop_all()
    assert left == [], f"outlived their launcher: {left}"
