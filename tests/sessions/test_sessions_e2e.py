"""Sessions end to end: a remote desktop and VS Code on a worker's node, opened in headless
Chromium through the platform's proxy, on the real Slurm (and a desktop on each real scheduler)
over real SSH, as the owner's account."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from playwright.sync_api import Error as PlaywrightError
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from harness import REPO
from harness.agents import freeze_agent, thaw
from harness.cells import Cell
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for, wait_until
from sessions_app.models import Session
from tests.browser import launched_chromium
from tests.browser import logged_in_page as browser_page
from tests.e2e.conftest import compute_environment, on_every_scheduler, pw_runner
from tests.platforms import module_platform
from tests.processes import descendants, identities, still_running
from workers_app.models import ApiKey, Environment, Worker
from workers_app.statuses import LIVE

pytestmark = [pytest.mark.slurm, pytest.mark.live]

SCREENSHOTS = REPO / "data" / "screenshots" / "sessions"
PASSWORD = "pw-sessions-123"


@pytest.fixture(scope="module", autouse=True)
def session_tools() -> None:
    """What sessions run on the node (this machine): scripts/session-tools.sh, cached."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "session-tools.sh")], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/session-tools.sh failed:\n{result.stderr[-3000:]}")


shared_session_platform = module_platform()


@pytest.fixture
def session_platform(transactional_db: None, shared_session_platform: Platform) -> Platform:
    return shared_session_platform


@pytest.fixture
def alice(transactional_db: None) -> User:
    return get_user_model().objects.create_user("alice", password=PASSWORD)


@pytest.fixture
def environment(make_cluster: Any, cell: Cell, alice: User) -> Environment:
    cluster = make_cluster(name="sessions", shared=False, scheduler=cell.kind)
    return compute_environment(cluster, cell, walltime="00:15:00")


@pytest.fixture
def pw(
    session_platform: Platform,
    alice: User,
    environment: Environment,
    ssh_target: SshTarget,
    tmp_path: Path,
) -> Iterator[Any]:
    run = pw_runner(session_platform, alice, tmp_path / "alice")
    remote = sorted(ssh_target.accounts)[0]
    key_file = ssh_target.accounts[remote]
    connect_account = run(
        "cluster", "connect", "sessions", "--user", remote, "--key-file", key_file
    )
    assert connect_account.returncode == 0, connect_account.stderr
    yield run
    # No job of the test's outlives it (the platform stops after this), and no program of a
    # session outlives its job: a scheduler that kills only the job's process group leaves
    # programs in sessions of their own running (Grid Engine did, for a desktop).
    programs = set()
    for session in Session.objects.filter(owner=alice, node_pid__isnull=False):
        launcher = session.node_pid or 0
        programs |= identities([launcher, *descendants(launcher)])
    # Deleted all at once, then waited for together: their jobs end side by side.
    doomed = list(Worker.objects.filter(owner=alice, status__in=LIVE))
    for worker in doomed:
        deleted = run("workers", "delete", worker.public_id)
        assert deleted.returncode == 0, deleted.stderr
    ended = Worker.objects.filter(pk__in=[w.pk for w in doomed]).exclude(status__in=LIVE)
    wait_for(lambda: ended.count() == len(doomed), timeout=120)
    wait_until(lambda: not still_running(programs), timeout=30)
    assert not still_running(programs), "programs outlived their job"


@pytest.fixture
def chromium() -> Iterator[Any]:
    with launched_chromium() as browser:
        yield browser


def logged_in_page(chromium: Any, platform: Platform, username: str) -> Any:
    return browser_page(chromium, platform.url, username, PASSWORD)


def shot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def in_squeue(job_id: str) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True, timeout=30
    ).stdout
    return job_id in out.split()


def created(pw: Any, *args: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    result = pw("sessions", "create", *args, "--wait", "-o", "json", timeout=300)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    session = json.loads(result.stdout)
    assert session["status"] == "running", session
    print(f"{args[1]} session running {took:.1f} s after `pw sessions create`")
    return session, took


def novnc(page: Any) -> Any:
    """The frame noVNC runs in, inside the platform's desktop page (None before it loads)."""
    return next((f for f in page.frames if "vnc.html" in f.url), None)


def desktop_connected(page: Any) -> bool:
    # noVNC draws the remote screen into a canvas once the VNC handshake (carried by the proxy
    # through the launcher's gate to the X server's private socket) has succeeded.
    frame = novnc(page)
    if frame is None:
        return False
    try:
        return bool(
            frame.evaluate(
                """() => {
                    const c = document.querySelector('#noVNC_container canvas, canvas');
                    if (!c || c.width < 100) return false;
                    return document.documentElement.classList.contains('noVNC_connected');
                }"""
            )
        )
    except PlaywrightError as exc:
        # The frame loading again (after the web server restarted) is not connected yet.
        if "Execution context was destroyed" in str(exc):
            return False
        raise


def distinct_colours(page: Any) -> int:
    return int(
        novnc(page).evaluate(
            """() => {
                const c = document.querySelector('#noVNC_container canvas, canvas');
                const x = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                const seen = new Set();
                for (let i = 0; i < x.length; i += 4 * 97) {
                    seen.add(x[i] << 16 | x[i + 1] << 8 | x[i + 2]);
                }
                return seen.size;
            }"""
        )
    )


def showing(page: Any, platform: Platform, name: str) -> None:
    """Wait until noVNC shows the remote screen; on failure, what the page showed and the logs."""
    try:
        wait_for(lambda: desktop_connected(page), timeout=60)
        # A tab Chromium does not show paints no frames until something looks at it.
        wait_for(lambda: page.screenshot() and distinct_colours(page) > 1, timeout=30)
    except TimeoutError:
        shot(page, f"{name}-failed")
        frame = novnc(page)
        seen = [f.url for f in page.frames]
        state = frame.evaluate("() => document.documentElement.className") if frame else None
        colours = distinct_colours(page) if frame else None
        pytest.fail(f"no desktop at {page.url}: frames {seen}, {state!r}, {colours} colours")


def test_a_desktop_on_an_environment_opens_in_the_browser_survives_a_web_restart_and_stops(
    session_platform: Platform, pw: Any, chromium: Any, other_user: User
) -> None:
    # Given: alice launches a desktop on an environment (a worker is requested for it alone).
    session, _ = created(pw, "--type", "desktop", "sessions", "--environment", "compute")
    assert session["dedicated_worker"] is True and session["url"].endswith(f"/s/{session['id']}/")
    job_id = session["job_id"]
    assert in_squeue(job_id)

    # When: she opens its URL in the browser.
    page = logged_in_page(chromium, session_platform, "alice")
    vnc_sockets: list[str] = []
    page.on("websocket", lambda ws: "websockify" in ws.url and vnc_sockets.append(ws.url))
    page.goto(session["url"])
    showing(page, session_platform, "desktop-1-open")
    time.sleep(1)
    # Then: the remote desktop (a terminal on the node's X server) is on the screen.
    shot(page, "desktop-1-open")
    assert distinct_colours(page) > 1

    # Another user asking for the same URL gets 404, and nothing reaches the node.
    tunnels = session_platform.log_count("tunnel to")
    _, bobs_key = ApiKey.issue(other_user)
    answer = httpx.get(session["url"] + "vnc.html", headers={"Authorization": f"Bearer {bobs_key}"})
    assert answer.status_code == 404
    ws_url = session["url"].replace("http://", "ws://") + "websockify"
    with _closed_with(4404):
        with connect(ws_url, additional_headers={"Authorization": f"Bearer {bobs_key}"}) as ws:
            ws.recv(timeout=10)
    assert session_platform.log_count("tunnel to") == tunnels

    # When: the web server restarts while the desktop is open.
    pid_before = Session.objects.get(public_id=session["id"]).node_pid
    sockets_before, tunnels_before = len(vnc_sockets), session_platform.log_count("tunnel to")
    assert sockets_before >= 1
    session_platform.stop("web")
    session_platform.start_web()
    # Then: the page opens a new VNC socket by itself (the new server tunnels to the same
    # program) and shows the same desktop.
    # (Playwright hands the page's events over only while it is called: the wait pumps them.)
    wait_for(lambda: page.wait_for_timeout(200) or len(vnc_sockets) > sockets_before, timeout=60)
    wait_for(lambda: session_platform.log_count("tunnel to") > tunnels_before, timeout=60)
    showing(page, session_platform, "desktop-2-after-web-restart")
    shot(page, "desktop-2-after-web-restart")
    after = Session.objects.get(public_id=session["id"])
    assert (after.status, after.node_pid) == ("running", pid_before)

    # When: she stops it. Then: it ends, and its worker's job leaves squeue.
    stopped = pw("sessions", "stop", session["id"], "-o", "json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["status"] == "ended"
    wait_for(lambda: not in_squeue(job_id), timeout=60)


class _closed_with:
    """The socket is refused with this close code."""

    def __init__(self, code: int) -> None:
        self.code = code

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        assert isinstance(exc, ConnectionClosed), exc
        assert exc.rcvd is not None and exc.rcvd.code == self.code, exc
        return True


def test_vscode_on_an_environment_loads_its_workbench_through_the_proxy_without_a_password(
    session_platform: Platform, pw: Any, chromium: Any, alice: User
) -> None:
    # Given: alice launches VS Code on an environment.
    session, _ = created(pw, "--type", "vscode", "sessions", "--environment", "compute")
    job_id = session["job_id"]

    # When: she opens its URL.
    page = logged_in_page(chromium, session_platform, "alice")
    page.goto(session["url"])
    try:
        page.wait_for_selector(".monaco-workbench", timeout=90_000)
        # The explorer lists her home folder on the node: the workbench talks to its server.
        page.wait_for_selector(".explorer-folders-view, .monaco-list", timeout=60_000)
    except Exception:
        shot(page, "vscode-failed")
        raise
    time.sleep(2)
    shot(page, "vscode-1-workbench")
    # The same small file, fetched again and again through the proxy.
    _, key = ApiKey.issue(alice)
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        took = []
        for _ in range(20):
            started = time.monotonic()
            assert client.get(session["url"] + "manifest.json").status_code == 200
            took.append(time.monotonic() - started)
    print(f"proxied GET from code-server: median {sorted(took)[10] * 1000:.0f} ms")
    # Then: the editor's workbench is there, and no password was asked for.
    assert page.locator("input[type=password]").count() == 0
    assert "/login" not in page.url

    stopped = pw("sessions", "stop", session["id"], "-o", "json")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: not in_squeue(job_id), timeout=60)


def worker_of(pw: Any) -> str:
    result = pw("workers", "create", "sessions", "--environment", "compute", "--wait", "-o", "json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["id"])


def session_state(session_id: str) -> Session:
    return Session.objects.select_related("worker").get(public_id=session_id)


def alive(pid: int | None) -> bool:
    try:
        os.kill(pid or 0, 0) if pid else None
    except ProcessLookupError:
        return False
    return bool(pid)


@on_every_scheduler
def test_a_desktop_on_an_existing_worker_opens_in_the_browser_and_leaves_the_worker_running(
    session_platform: Platform, pw: Any, chromium: Any, cell: Cell
) -> None:
    # Given: a connected worker of alice's, and a desktop she launches on it.
    worker_id = worker_of(pw)
    session, _ = created(pw, "--type", "desktop", "sessions", "--worker", worker_id)
    assert session["dedicated_worker"] is False and session["worker"] == worker_id
    # When: she opens it. Then: the node's X server is on her screen.
    page = logged_in_page(chromium, session_platform, "alice")
    page.goto(session["url"])
    showing(page, session_platform, f"desktop-on-{cell.kind}-failed")
    time.sleep(1)
    shot(page, f"desktop-on-a-{cell.kind}-worker")
    assert distinct_colours(page) > 1
    # When: she stops it. Then: it ends, and the worker it ran on stays connected.
    stopped = pw("sessions", "stop", session["id"], "-o", "json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["status"] == "ended"
    assert Worker.objects.get(public_id=worker_id).status == "connected"


def test_sessions_on_an_existing_worker_outlive_a_neighbour_and_end_with_their_worker(
    session_platform: Platform, pw: Any, alice: User
) -> None:
    # Given: two desktops on one connected worker of alice's.
    worker_id = worker_of(pw)
    first, _ = created(pw, "--type", "desktop", "sessions", "--worker", worker_id)
    second, _ = created(pw, "--type", "desktop", "sessions", "--worker", worker_id)
    assert first["dedicated_worker"] is False and first["worker"] == worker_id
    assert first["node"] == second["node"] and first["job_id"] == second["job_id"]
    first_pid = session_state(first["id"]).node_pid

    # When: she stops the first.
    stopped = pw("sessions", "stop", first["id"], "-o", "json")
    assert stopped.returncode == 0, stopped.stderr

    # Then: its program is gone, the second still answers, and the worker stays connected.
    wait_for(lambda: not alive(first_pid), timeout=30)
    _, key = ApiKey.issue(alice)
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(second["url"] + "vnc.html", headers=auth, timeout=30).status_code == 200
    assert session_state(second["id"]).status == "running"
    assert Worker.objects.get(public_id=worker_id).status == "connected"
    listed = json.loads(pw("sessions", "ls", "--worker", worker_id, "-o", "json").stdout)
    assert {s["id"]: s["status"] for s in listed} == {first["id"]: "ended", second["id"]: "running"}

    # When: she deletes the worker. Then: the second session ends with it.
    deleted = pw("workers", "delete", worker_id)
    assert deleted.returncode == 0, deleted.stderr
    after = session_state(second["id"])
    assert (after.status, after.status_reason) == ("ended", "Its worker was deleted")
    assert httpx.get(second["url"] + "vnc.html", headers=auth, timeout=30).status_code == 503


def test_freezing_the_workers_agent_fails_its_session_with_worker_disconnected(
    session_platform: Platform, pw: Any
) -> None:
    worker_id = worker_of(pw)
    session, _ = created(pw, "--type", "desktop", "sessions", "--worker", worker_id)
    frozen = freeze_agent(worker_id)
    assert frozen, "no agent found for the worker"
    try:
        wait_for(lambda: session_state(session["id"]).status != "running", timeout=60)
    finally:
        thaw(frozen)
    after = session_state(session["id"])
    assert (after.status, after.status_reason) == ("failed", "Worker disconnected")
    shown = json.loads(pw("sessions", "get", session["id"], "-o", "json").stdout)
    assert (shown["status"], shown["reason"]) == ("failed", "Worker disconnected")


# Chromium drawing a desktop beside three platforms missed its 60 s wait (CI, parallel).
@pytest.mark.serial
def test_a_user_launches_a_desktop_from_the_sessions_page_and_opens_it(
    session_platform: Platform, pw: Any, chromium: Any
) -> None:
    # Given: alice has a connected worker, and the Sessions page lists it as a target.
    worker_id = worker_of(pw)
    page = logged_in_page(chromium, session_platform, "alice")
    page.click("nav >> text=Sessions")
    page.wait_for_url(session_platform.url + "/sessions/")
    worker_name = Worker.objects.get(public_id=worker_id).name
    assert page.locator(f"#launch-target option:has-text('{worker_name} (connected)')").count()
    shot(page, "pages-1-sessions")

    # When: she launches a remote desktop on it with Quick Launch.
    page.select_option("#quick-worker", f"worker:sessions/{worker_id}")
    page.click("button:has-text('Remote desktop')")
    page.wait_for_url(f"{session_platform.url}/sessions/s*/")
    # Then: its details show where it runs, and it turns running with an Open button.
    page.wait_for_selector("#open-session", timeout=60_000)
    details = page.inner_text("#session-details")
    for label in ("Environment", "Partition", "Node hostname", "Scheduler job ID", "Worker"):
        assert label in details
    assert "running" in page.inner_text("#session-status")
    shot(page, "pages-2-details")
    # Open goes to the session's address in a tab of its own; followed here in this one (a
    # headless tab in the background is not painted).
    href = page.get_attribute("#open-session", "href")
    assert page.get_attribute("#open-session", "target") == "_blank"
    details_url = page.url
    page.goto(session_platform.url + str(href))
    showing(page, session_platform, "pages-3-desktop")
    shot(page, "pages-3-desktop")
    page.goto(details_url)

    # When: she stops it from its page. Then: it ends; the worker stays.
    page.click("button:has-text('Stop session')")
    page.wait_for_selector("#session-status:has-text('ended')")
    assert Worker.objects.get(public_id=worker_id).status == "connected"
    shot(page, "pages-4-stopped")


def test_a_session_whose_program_ends_on_the_node_ends_when_next_reached(
    session_platform: Platform, pw: Any, alice: User
) -> None:
    session, _ = created(pw, "--type", "desktop", "sessions", "--environment", "compute")
    pid = session_state(session["id"]).node_pid
    assert pid is not None
    _, key = ApiKey.issue(alice)
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        took = []
        for _ in range(20):
            started = time.monotonic()
            assert client.get(session["url"] + "app/error-handler.js").status_code == 200
            took.append(time.monotonic() - started)
    print(f"proxied GET of a small file: median {sorted(took)[10] * 1000:.0f} ms")
    os.kill(pid, signal.SIGTERM)  # the launcher ends its programs and itself
    wait_for(lambda: not alive(pid), timeout=30)
    answer = httpx.get(
        session["url"] + "vnc.html", headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    assert answer.status_code == 503, answer.text
    after = session_state(session["id"])
    assert (after.status, after.status_reason) == ("ended", "Its program ended on the node")
    pw("sessions", "stop", session["id"])
