from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.workers.api import fixtures

# The API tests' fixtures, found by pytest under these names.
api_key = fixtures.api_key
cluster = fixtures.cluster
compute_env = fixtures.compute_env
request_worker = fixtures.request_worker
retired_env = fixtures.retired_env

PW = Path(sys.executable).with_name("pw")
TIMEOUT = 30.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "install: installs ./cli from PyPI into a fresh virtual environment"
    )


@dataclass
class Running:
    """A pw process whose stderr lines can be awaited one by one."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line.rstrip("\n"))

    def expect(self, text: str) -> str:
        """Wait for a stderr line containing ``text``."""
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no stderr line with {text!r}; saw {seen}") from None
            seen.append(line)
            if text in line:
                return line

    def finish(self) -> tuple[int, str, list[str]]:
        # Not communicate(): it would also read stderr, racing the reader thread for lines.
        self.process.wait(timeout=TIMEOUT)
        assert self.process.stdout is not None
        stdout = self.process.stdout.read()
        self.reader.join(timeout=TIMEOUT)
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return self.process.returncode, stdout, rest


@dataclass
class Pw:
    env: dict[str, str]
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(PW), *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def start(self, *args: str) -> Running:
        process = subprocess.Popen(
            [str(PW), *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return Running(process)


@pytest.fixture
def pw(live_server: Any, api_key: str, tmp_path: Path) -> Iterator[Pw]:
    """The installed `pw` script, pointed at the live test server, with an empty home."""
    home = tmp_path / "home"
    home.mkdir()
    pw = Pw(
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "PW_PLATFORM_HOST": live_server.url,
            "PW_API_KEY": api_key,
            "PW_POLL_INTERVAL": "0.05",
        }
    )
    yield pw
    for process in pw.started:
        # A failed test must not leave a waiting pw behind.
        if process.poll() is None:
            process.kill()
            process.wait()
