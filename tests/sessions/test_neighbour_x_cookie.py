"""A neighbour watching every new process's command line while the owner's desktop starts finds
no X cookie that opens her display. The neighbour is the test cluster's second account (pwbob),
an ordinary Unix user: woken by inotify whenever a program or library under /usr is opened (as
pspy does), it reads /proc/<pid>/cmdline of every process started since, then tries every
cookie-shaped value it read against her X server with an authority file of its own. The X
server refuses, not the platform's code. Real Slurm over real SSH."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from harness.watcher import x_cookies
from tests.processes import args_of, descendants
from tests.sessions.test_jupyter_neighbour import NODE_PYTHON
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    created,
    environment,
    pw,
    session_platform,
    session_state,
    session_tools,
    shared_session_platform,
    worker_of,
)

pytestmark = [pytest.mark.slurm, pytest.mark.live]
COOKIE_SHAPED = re.compile(r"\b[0-9a-f]{32}\b")

# The neighbour's watcher: no privilege, only what any user of the node may read. It prints
# "watching" once set up, then, when its stdin closes, one JSON line per command line it read:
# {"uid", "argv"}.
WATCH = r"""
import ctypes, glob, json, os, select, sys, threading, time

IN_ACCESS, IN_OPEN = 0x01, 0x20
libc = ctypes.CDLL(None, use_errno=True)
events = libc.inotify_init1(os.O_NONBLOCK)
# A program's start opens its file and its libraries: each wakes the watch.
for folder in ["/usr/bin", "/usr/sbin"] + glob.glob("/usr/lib/*-linux-gnu"):
    libc.inotify_add_watch(events, folder.encode(), IN_OPEN | IN_ACCESS)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
last = os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY)


def newest():
    return int(os.pread(last, 32, 0))


def read(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return os.stat("/proc/%d" % pid).st_uid, handle.read()
    except OSError:
        return None


seen, watching, found = newest(), {}, set()
print("watching", flush=True)
while not done.is_set():
    select.select([events], [], [], 0.05)
    try:
        while os.read(events, 65536):
            pass
    except BlockingIOError:
        pass
    now, latest = time.monotonic(), newest()
    if latest != seen:
        # A process is read until it has lived 2 s: it may exec after its fork.
        for pid in range(seen + 1, latest + 1) if latest > seen else range(1, latest + 1):
            watching[pid] = now
        seen = latest
    for pid, since in list(watching.items()):
        got = read(pid)
        if got is None or now - since > 2:
            del watching[pid]
        elif got[1]:
            found.add(got)
for uid, argv in sorted(found):
    print(json.dumps({"uid": uid, "argv": argv.decode("utf-8", "replace").split("\0")}))
"""


TRY = r"""
import json, os, subprocess, sys, tempfile

display, cookies = json.loads(sys.stdin.read())
for cookie in cookies:
    authority = os.path.join(tempfile.mkdtemp(), "Xauthority")
    line = "add :%d MIT-MAGIC-COOKIE-1 %s\n" % (display, cookie)
    subprocess.run(["xauth", "-q", "-f", authority, "source", "-"], input=line.encode(), check=True)
    info = subprocess.run(
        ["xdpyinfo", "-display", ":%d" % display],
        env=dict(os.environ, XAUTHORITY=authority),
        capture_output=True,
        timeout=20,
    )
    print(cookie, "opened" if info.returncode == 0 else "refused")
"""


def tried_against(user: str, display: int, cookies: list[str]) -> dict[str, str]:
    """What ``user`` gets from the X server on ``display`` with each cookie (given on stdin) in
    an authority file of its own: "opened" (xdpyinfo read the display) or "refused"."""
    probe = subprocess.run(
        ["runuser", "-u", user, "--", NODE_PYTHON, "-c", TRY],
        input=json.dumps([display, cookies]),
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert probe.returncode == 0, probe.stderr
    return dict(line.split() for line in probe.stdout.splitlines())


# The neighbour polls /proc as an ordinary user can: on a busy node it may wake after xauth's few
# milliseconds are over, and a start it missed proves nothing. So the desktop is started again
# (up to this many times) until one start's xauth was read; that start is the one checked.
STARTS = 4


def watched_start(
    run_pw: Any, worker_id: str, neighbour: str, owner_uid: int
) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Start a desktop on the worker while the neighbour watches, until the watch reads its
    xauth: the session, the command lines the neighbour read, and the starts it took."""
    for start in range(1, STARTS + 1):
        watcher = subprocess.Popen(
            ["runuser", "-u", neighbour, "--", NODE_PYTHON, "-c", textwrap.dedent(WATCH)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        assert watcher.stdout is not None and watcher.stdout.readline().strip() == "watching"
        try:
            session, _ = created(run_pw, "--type", "desktop", "sessions", "--worker", worker_id)
        finally:
            out, _ = watcher.communicate("", timeout=60)
        read = [json.loads(line) for line in out.splitlines()]
        if xauths_of(read, owner_uid) or start == STARTS:
            return session, read, start
        stopped = run_pw("sessions", "stop", session["id"])
        assert stopped.returncode == 0, stopped.stderr
    raise AssertionError("unreachable")


def xauths_of(read: list[dict[str, Any]], owner_uid: int) -> list[list[str]]:
    return [r["argv"] for r in read if r["uid"] == owner_uid and r["argv"][0].endswith("xauth")]


@pytest.mark.serial
def test_a_neighbour_watching_command_lines_gets_no_cookie_that_opens_the_desktop(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    owner, neighbour = sorted(ssh_target.accounts)[:2]
    owner_uid = int(subprocess.run(["id", "-u", owner], capture_output=True, text=True).stdout)
    # Given: a connected worker of alice's, and the neighbour watching every new process.
    worker_id = worker_of(pw)
    # When: she starts a desktop on it.
    session, read, starts = watched_start(pw, worker_id, neighbour, owner_uid)
    state = session_state(session["id"])
    programs = descendants(state.node_pid or 0)
    xvnc = next(pid for pid in programs if re.search("X(tiger)?vnc", args_of(pid)[0]))
    args = args_of(xvnc)
    display = int(args[1].lstrip(":"))
    cookie = next(x_cookies([Path(args[args.index("-auth") + 1])]))

    # Then: the neighbour read her xauth's command line (the watch sees a process that lives a
    # few milliseconds) ...
    xauths = xauths_of(read, owner_uid)
    print(f"start {starts}: the neighbour read {len(read)} command lines; her xauth's: {xauths}")
    assert xauths, f"the neighbour's watch missed her xauth in {starts} starts: it proves nothing"
    # ... and no cookie-shaped value in any command line it read opens her display.
    found = sorted({c for r in read for c in COOKIE_SHAPED.findall(" ".join(r["argv"]))})
    answers = tried_against(neighbour, display, found)
    print(f"the neighbour tried {len(found)} cookie-shaped values on :{display}: {answers}")
    assert "opened" not in answers.values(), answers
    assert not [r for r in read if cookie in " ".join(r["argv"])]
    # And: the same try with her real cookie opens the display (the try would have told).
    assert tried_against(neighbour, display, [cookie]) == {cookie: "opened"}
    pw("sessions", "stop", session["id"])
