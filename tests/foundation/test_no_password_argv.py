"""`make run` and `make demo` set their accounts' passwords on no command line: another ordinary
Unix user of the platform's host (the test cluster's pwbob, through `runuser`, never root),
watching every process's command line and environment while the step runs, finds no password.
The step itself (scripts/run.py's ensure_operator, scripts/demo.py's ensure_demo_user) is called
on the test's database, with a throwaway data directory."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from harness.platform import database_url

REPO = Path(__file__).resolve().parents[2]
NEIGHBOUR = "pwbob"
# The neighbour's watch: every command line and every environment it may read, each new one
# printed once, until its stdin closes. A process lives a second at least (Django starts up),
# so a scan every few milliseconds sees it.
WATCH = r"""
import json, os, sys, threading, time
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
seen = set()
def scan():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as handle:
                    text = handle.read()
            except OSError:
                continue
            if text and (pid, part, text) not in seen:
                seen.add((pid, part, text))
                said = text.replace(b"\0", b" ").decode("utf-8", "replace")
                print(json.dumps({"pid": int(pid), "part": part, "text": said}), flush=True)
scan()
print(json.dumps({"ready": True}), flush=True)
while not done.is_set():
    scan()
    time.sleep(0.005)
"""


@contextmanager
def neighbour_watching(log: Path) -> Iterator[list[dict[str, object]]]:
    """What the neighbour read while the block ran: one dict a command line or environment."""
    if (
        shutil.which("runuser") is None
        or subprocess.run(["id", NEIGHBOUR], capture_output=True).returncode != 0
    ):
        pytest.fail(f"the test cluster's user {NEIGHBOUR} is missing: make cluster")
    seen: list[dict[str, object]] = []
    with log.open("wb") as out:
        watcher = subprocess.Popen(
            ["runuser", "-u", NEIGHBOUR, "--", "python3", "-I", "-c", WATCH],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
    try:
        deadline = time.monotonic() + 30
        while '"ready"' not in log.read_text() and time.monotonic() < deadline:
            assert watcher.poll() is None, log.read_text()
            time.sleep(0.05)
        yield seen
    finally:
        assert watcher.stdin is not None
        watcher.stdin.close()
        watcher.wait(timeout=30)
        seen += [json.loads(line) for line in log.read_text().splitlines()]
    assert watcher.returncode == 0, log.read_text()


def step(code: str, data: Path, stdin: str = "") -> None:
    """Runs ``code`` in a Python of the scripts' own (scripts/ importable), as `make run` runs
    them, on the test's database; ``stdin`` is given on its standard input."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(data.parent),
        "DJANGO_SETTINGS_MODULE": "activate.settings.test",
        "DATABASE_URL": database_url(),
        "ACTIVATE_DATA_DIR": str(data),
    }
    subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, 'scripts'); {code}"],
        cwd=REPO,
        env=env,
        input=stdin,
        text=True,
        check=True,
        timeout=120,
    )


def command_lines(seen: list[dict[str, object]]) -> list[str]:
    return [str(item["text"]) for item in seen if item.get("part") == "cmdline"]


def assert_seen_and_not_found(seen: list[dict[str, object]], password: str) -> None:
    # The watch was quick enough: it saw the step's `manage.py shell` running ...
    shells = [c for c in command_lines(seen) if "manage.py" in c and " shell " in f"{c} "]
    assert shells, f"the neighbour never saw the step run: {command_lines(seen)[-20:]}"
    print("the neighbour saw:", *shells, sep="\n  ")
    # ... and found the password nowhere it could read.
    found = [item for item in seen if password in str(item.get("text", ""))]
    assert not found, f"the neighbour read the password: {found}"


@pytest.mark.django_db(transaction=True)
def test_make_runs_operator_password_is_on_no_command_line_a_neighbour_can_read(
    tmp_path: Path,
) -> None:
    # Given: a fresh data directory, and pwbob watching every process of the host.
    data = tmp_path / "data"
    # When: `make run`'s step makes the operator account.
    with neighbour_watching(tmp_path / "seen") as seen:
        step("import run; run.ensure_operator()", data)
    password = (data / "admin-password.txt").read_text().strip()
    # Then: the account has the password, and pwbob read it nowhere.
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    assert_seen_and_not_found(seen, password)


@pytest.mark.django_db(transaction=True)
def test_make_demos_user_password_is_on_no_command_line_a_neighbour_can_read(
    tmp_path: Path,
) -> None:
    password = secrets.token_urlsafe(12)
    with neighbour_watching(tmp_path / "seen") as seen:
        step("import demo; demo.ensure_demo_user(sys.stdin.read())", tmp_path / "data", password)
    demo = get_user_model().objects.get(username="demo")
    assert not demo.is_staff and demo.check_password(password)
    assert_seen_and_not_found(seen, password)
