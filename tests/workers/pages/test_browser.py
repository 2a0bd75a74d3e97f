"""The browser UI as a person uses it: headless Chromium (Debian's, driven by Playwright) against
the whole platform as real processes (web server, Celery worker and beat) and the real Slurm.

Screenshots of every page go to data/screenshots/ (the run prints where); look at them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model

from harness import REPO
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from tests.browser import CHROMIUM, launched_chromium, log_in
from tests.factories import ClusterFactory, WorkerFactory
from tests.platforms import sharing
from tests.workers.pages.conftest import SCREENSHOTS_TAKEN
from workers_app.models import Environment, EnvironmentField, Worker

pytestmark = [pytest.mark.slurm, pytest.mark.live]

SCREENSHOTS = REPO / "data" / "screenshots"
PASSWORD = "pw-browser-123"


@pytest.fixture(scope="module")
def chromium_installed() -> str:
    """Debian's chromium, installed by scripts/browser.sh when missing: never a download."""
    if not Path(CHROMIUM).exists():
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / "browser.sh")], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.fail(f"scripts/browser.sh could not install chromium:\n{result.stderr}")
    return CHROMIUM


@pytest.fixture(scope="module")
def screenshots(request: pytest.FixtureRequest) -> Path:
    """A fresh folder; the run's summary names it (tests/workers/pages/conftest.py)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    request.config.stash[SCREENSHOTS_TAKEN] = SCREENSHOTS
    return SCREENSHOTS


@pytest.fixture(scope="module")
def shared_browser_platform(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    # Finished workers leave the list after 5 s, so the test sees a deleted one go.
    workdir = tmp_path_factory.mktemp("platform")
    with sharing(Platform(workdir=workdir, knobs={"ACTIVATE_PURGE_AFTER": "5"})) as running:
        yield running


@pytest.fixture
def browser_platform(transactional_db: None, shared_browser_platform: Platform) -> Platform:
    return shared_browser_platform


@pytest.fixture
def world(transactional_db: None, make_cluster, ssh_target: SshTarget) -> dict[str, Any]:
    """Alice, the real Slurm as a shared cluster, an offline cluster, and Bob's worker."""
    users = get_user_model().objects
    alice = users.create_user("alice", password=PASSWORD)
    bob = users.create_user("bob", password=PASSWORD)
    users.create_user("operator", password=PASSWORD, is_staff=True, is_superuser=True)
    cluster = make_cluster("test-slurm", shared=True, reachability="online")
    compute = Environment.objects.create(
        cluster=cluster,
        name="compute",
        partition=ssh_target.partition,
        nodes_total=1,
        nodes_available=1,
    )
    EnvironmentField.objects.create(
        environment=compute,
        name="purpose",
        label="Purpose",
        required=True,
        example="analysis",
        position=0,
    )
    EnvironmentField.objects.create(
        environment=compute,
        name="walltime",
        label="Wall time",
        default="00:10:00",
        example="04:00:00",
        pattern=r"\d{1,2}:\d{2}:\d{2}",
        directive="--time={value}",
        position=1,
    )
    Environment.objects.create(cluster=cluster, name="retired", is_active=False)
    campus = ClusterFactory(name="campus", reachability="offline", last_error="connection refused")
    gpu = Environment.objects.create(cluster=campus, name="gpu", nodes_total=8, nodes_available=2)
    # Never dispatched (no attempt is due): it only has to stay out of Alice's pages.
    WorkerFactory(
        owner=bob, cluster=campus, environment=gpu, name="bobs-worker", next_attempt_at=None
    )
    return {"alice": alice, "bob": bob}


class Browser:
    """One Chromium page with what it logged: console errors and requests leaving the site."""

    def __init__(self, page: Any, base: str, shots: Path) -> None:
        self.page, self.base, self.shots = page, base, shots
        self.errors: list[str] = []
        self.outside: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", self._request)
        page.on("response", self._response)

    def _response(self, response: Any) -> None:
        if response.status >= 400:
            self.errors.append(f"{response.status} {response.url}")

    def _request(self, request: Any) -> None:
        if not request.url.startswith((self.base, "data:")):
            self.outside.append(request.url)

    def shot(self, name: str, *, full_page: bool = True) -> None:
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=full_page)

    def log_in(self, username: str) -> None:
        log_in(self.page, self.base, username, PASSWORD, start="/")


@pytest.fixture
def chromium(chromium_installed: str) -> Iterator[Any]:
    with launched_chromium() as browser:
        yield browser


def on_screen(screen: Any) -> str:
    # xterm.js draws spaces as no-break spaces.
    return str(screen.inner_text()).replace("\xa0", " ")


def terminal_sizes(page: Any, screen: Any, *, count: int) -> list[tuple[int, int]]:
    """The `stty size` answers on the terminal's screen, once ``count`` of them are there."""
    deadline = time.monotonic() + 30
    while True:
        answers = re.findall(r"^(\d+) (\d+)\s*$", on_screen(screen), re.MULTILINE)
        if len(answers) >= count or time.monotonic() > deadline:
            return [(int(r), int(c)) for r, c in answers]
        page.wait_for_timeout(200)


NOTIFICATIONS_RECORDED = """
Object.defineProperty(document, "hidden", { get: () => true });
const RealNotification = window.Notification;
window.notified = [];
function Recorded(title, options) {
  window.notified.push(title);
  return new RealNotification(title, options);
}
Object.defineProperty(Recorded, "permission", { get: () => RealNotification.permission });
Recorded.requestPermission = (...args) => RealNotification.requestPermission(...args);
window.Notification = Recorded;
"""


def open_terminal(context: Any, row: Any, ui: Browser) -> Any:
    """Open in terminal, from the row's menu: the terminal's tab once it is connected."""
    row.locator("details.menu summary").click()
    with context.expect_page() as opened:
        row.get_by_role("link", name="Open in terminal").click()
    shell = opened.value
    shell.on("pageerror", lambda e: ui.errors.append(str(e)))
    shell.locator("#terminal-state", has_text="Connected").wait_for(timeout=60_000)
    return shell


def status_of_row(page: Any, public_id: str) -> str:
    row = page.locator(f"#worker-{public_id}")
    return row.get_attribute("data-status", timeout=1000) if row.count() else ""


def test_a_user_requests_a_worker_watches_it_connect_copies_ssh_and_deletes_it(
    browser_platform: Platform, world: dict[str, Any], chromium: Any, screenshots: Path
) -> None:
    base = browser_platform.url
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    context.grant_permissions(["clipboard-read", "clipboard-write", "notifications"], origin=base)
    # The tab counts as in the background, where notices come as browser notifications; each
    # one the page makes is recorded (and still made).
    context.add_init_script(NOTIFICATIONS_RECORDED)
    ui = Browser(context.new_page(), base, screenshots)
    page = ui.page

    # Given: an anonymous visitor is sent to the login page, then lands on Workers.
    page.goto(base + "/")
    assert page.url.startswith(base + "/login/")
    ui.shot("01-login")
    ui.log_in("alice")
    assert page.get_by_text("No workers yet").is_visible()
    ui.shot("02-workers-empty")

    # The dialog: environments by cluster, unavailable ones shown but not selectable.
    page.click("a.button:has-text('Create')")
    dialog = page.locator("dialog#dialog")
    dialog.wait_for(state="visible")
    assert dialog.locator("input[name=environment]:checked").count() == 1
    assert dialog.get_by_text("1 of 1 nodes available").is_visible()
    gpu = dialog.locator("label.env-option", has_text="gpu")
    assert gpu.locator("input").is_disabled() and "cluster offline" in gpu.inner_text()
    retired = dialog.locator("label.env-option", has_text="retired")
    assert retired.locator("input").is_disabled() and "inactive" in retired.inner_text()
    advanced = dialog.locator("details.advanced")
    assert advanced.get_attribute("open") is None
    assert dialog.locator("#id_param_purpose").is_visible()  # required, no default: outside
    ui.shot("03-request-dialog", full_page=False)
    advanced.locator("summary").click()
    ui.shot("04-request-advanced", full_page=False)

    # A required field left empty: its error stands next to it, in words.
    dialog.locator("#id_param_purpose").fill("")
    dialog.locator("button:has-text('Request worker')").click()
    purpose_error = dialog.locator(".field.has-error", has=page.locator("#id_param_purpose"))
    purpose_error.wait_for()
    assert "Purpose is required; example: analysis" in purpose_error.inner_text()
    ui.shot("05-request-required-error", full_page=False)

    # A malformed value: the label and an example, never the regular expression.
    dialog.locator("#id_param_purpose").fill("browser test")
    dialog.locator("details.advanced summary").click()
    dialog.locator("#id_param_walltime").fill("abc")
    dialog.locator("button:has-text('Request worker')").click()
    wall_error = dialog.locator(".field.has-error", has=page.locator("#id_param_walltime"))
    wall_error.wait_for()
    assert dialog.locator("details.advanced").get_attribute("open") is not None
    assert "Wall time: 'abc' is not a valid value; example: 04:00:00" in wall_error.inner_text()
    assert "\\d" not in dialog.inner_text()
    ui.shot("06-request-value-error", full_page=False)

    dialog.locator("#id_param_walltime").fill("00:10:00")
    dialog.locator("#id_name").fill("from-the-browser")
    dialog.locator("#id_save_as").fill("short-run")
    dialog.locator("button:has-text('Request worker')").click()
    page.get_by_text("Worker from-the-browser requested.").wait_for()
    worker = Worker.objects.get(name="from-the-browser")
    assert worker.params == {"purpose": "browser test", "walltime": "00:10:00"}

    # Then it moves through pending and queued to connected, with no reload of the page.
    page.evaluate("window.stillTheSamePage = true")
    seen = []
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        status = status_of_row(page, worker.public_id)
        if status and (not seen or seen[-1] != status):
            seen.append(status)
            ui.shot(f"07-workers-{len(seen)}-{status}")
        if status == "connected":
            break
        assert status not in {"error", "stopped"}, f"{seen}\n{browser_platform.logs()}"
        time.sleep(0.3)
    assert seen[-1:] == ["connected"], f"seen {seen}\n{browser_platform.logs()}"
    assert page.evaluate("window.stillTheSamePage") is True
    row = page.locator(f"#worker-{worker.public_id}")
    worker.refresh_from_db()
    assert worker.node_hostname in row.inner_text()
    assert worker.scheduler_job_id in row.inner_text()
    assert "left" in row.locator("td[data-label='Wall time']").inner_text()
    assert "bobs-worker" not in page.content()

    # Its owner was told, as a browser notification and a banner: connected, then (its wall
    # time of 10 minutes is within ACTIVATE_WALLTIME_WARNING) that its wall time runs out.
    told = wait_for(
        lambda: page.evaluate("window.notified.length >= 2 && window.notified"), timeout=30
    )
    assert told[0] == "Worker from-the-browser is connected", told
    assert told[1].startswith("Worker from-the-browser: wall time ends in "), told
    banners = page.locator("#notices .message-notice")
    assert banners.count() == 2 and "is ready for you" in banners.first.inner_text()
    ui.shot("07b-notices", full_page=False)

    # Copy the SSH command from the row's menu.
    row.locator("details.menu summary").click()
    ui.shot("08-row-menu", full_page=False)
    row.get_by_role("button", name="Copy SSH command").click()
    row.get_by_role("button", name="Copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == f"pw ssh {worker.public_id}"

    # Open in terminal: a shell on the node in a tab of its own; it follows the window's size.
    row.locator("details.menu:not([open])").wait_for()
    shell = open_terminal(context, row, ui)
    screen = shell.locator(".xterm-rows")
    shell.keyboard.type("echo node-is-$(hostname)\n")
    shell.get_by_text(f"node-is-{worker.node_hostname}").wait_for(timeout=30_000)
    shell.keyboard.type("stty size\n")
    sizes = terminal_sizes(shell, screen, count=1)
    shell.set_viewport_size({"width": 900, "height": 500})
    shell.keyboard.type("stty size\n")
    resized = terminal_sizes(shell, screen, count=2)
    assert resized[0] == sizes[0] and resized[1] != sizes[0], resized
    rows, cols = resized[1]
    assert rows < sizes[0][0] and cols < sizes[0][1]
    assert shell.locator("#terminal-reconnect").is_hidden()
    # Copy a word (double-click selects it) and paste it back, with the keys the page names.
    shell.get_by_text(f"node-is-{worker.node_hostname}", exact=True).dblclick()
    shell.keyboard.press("Control+Shift+C")
    assert shell.evaluate("navigator.clipboard.readText()") == f"node-is-{worker.node_hostname}"
    shell.evaluate("navigator.clipboard.writeText('echo pasted-$((2+3))')")
    shell.keyboard.press("Control+Shift+V")
    wait_for(lambda: "echo pasted-$((2+3))" in on_screen(screen), timeout=30)
    shell.keyboard.press("Enter")
    try:
        wait_for(lambda: re.search(r"^pasted-5\s*$", on_screen(screen), re.M), timeout=30)
    except TimeoutError:
        shell.screenshot(path=str(screenshots / "08x-terminal-paste-missing.png"))
        raise AssertionError(on_screen(screen)) from None
    shell.screenshot(path=str(screenshots / "08b-terminal.png"))
    # The terminal is kept on the node (tmux): its tab closed, it is listed on the worker's row,
    # and opening it again goes on in the same shell.
    # Closed once the shell has run the line: a tab closed at once can take the Enter with it.
    shell.keyboard.type("export KEPT=kept-$((6*7)); echo set-$KEPT\n")
    wait_for(lambda: "set-kept-42" in on_screen(shell.locator(".xterm-rows")), timeout=30)
    shell.close()
    row.locator("a", has_text="terminal main").wait_for(timeout=30_000)
    shell = open_terminal(context, row, ui)
    screen = shell.locator(".xterm-rows")
    # Typed once tmux has redrawn the kept window (its status line), so nothing typed is lost
    # in the redraw; the value comes only from the kept shell (the command line says $KEPT).
    wait_for(lambda: "[main]" in on_screen(screen), timeout=30)
    shell.keyboard.type("echo again-$KEPT\n")
    try:
        wait_for(lambda: "again-kept-42" in on_screen(screen), timeout=30)
    except TimeoutError:
        shell.screenshot(path=str(screenshots / "08x-terminal-not-kept.png"))
        raise AssertionError(on_screen(screen)) from None
    # The shell ends: the page says so and offers a new one.
    shell.keyboard.type("exit 4\n")
    try:
        wait_for(lambda: "[the shell exited with status " in on_screen(screen), timeout=30)
    except TimeoutError:
        shell.screenshot(path=str(screenshots / "08x-terminal-exit-missing.png"))
        raise AssertionError(on_screen(screen)) from None
    shell.locator("#terminal-reconnect").click()
    shell.locator("#terminal-state", has_text="Connected").wait_for(timeout=60_000)
    shell.screenshot(path=str(screenshots / "08c-terminal-reconnected.png"))
    shell.close()

    # From the Files page, a folder opened in a terminal on this worker: a window of its own in
    # the kept terminal, in that folder.
    folder = Path(tempfile.mkdtemp(prefix="activate files 'here' "))
    folder.chmod(0o755)
    try:
        page.goto(f"{base}/clusters/test-slurm/files/?{urlencode({'path': str(folder)})}")
        page.locator("#files-listing[data-readable]").wait_for()
        ui.shot("08d-files-open-here", full_page=False)
        with context.expect_page() as opened:
            page.get_by_role("link", name=f"Terminal on {worker.name}").click()
        shell = opened.value
        shell.locator("#terminal-state", has_text="Connected").wait_for(timeout=60_000)
        screen = shell.locator(".xterm-rows")
        wait_for(lambda: "[main]" in on_screen(screen), timeout=30)
        shell.keyboard.type("echo in-$(pwd)-end\n")
        try:
            wait_for(lambda: f"in-{folder}-end" in on_screen(screen), timeout=30)
        except TimeoutError:
            shell.screenshot(path=str(screenshots / "08x-terminal-not-in-folder.png"))
            raise AssertionError(on_screen(screen)) from None
        shell.screenshot(path=str(screenshots / "08e-terminal-in-folder.png"))
        shell.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    page.goto(base + "/")

    # Delete it: the confirmation says its sessions go too; then it leaves the list.
    row.locator("details.menu:not([open])").wait_for()  # closes itself after copying
    row.locator("details.menu summary").click()
    row.get_by_role("link", name="Delete worker").click()
    dialog.wait_for(state="visible")
    assert "deletes every session running on it" in dialog.inner_text()
    ui.shot("09-delete-confirm", full_page=False)
    dialog.get_by_role("button", name="Delete worker").click()
    page.get_by_text("is being deleted").wait_for()
    page.evaluate("window.stillTheSamePage = true")
    page.locator(f"#worker-{worker.public_id}").wait_for(state="detached", timeout=90_000)
    assert page.evaluate("window.stillTheSamePage") is True
    assert page.get_by_text("No workers yet").is_visible()
    worker.refresh_from_db()
    assert worker.status in {"stopped", "error"}

    # The settings saved with that request come back filled in from the dialog's list.
    page.click("a.button:has-text('Create')")
    dialog.wait_for(state="visible")
    dialog.get_by_role("link", name="short-run").click()
    dialog.locator("#id_save_as[value='short-run']").wait_for()
    assert dialog.locator("#id_param_purpose").input_value() == "browser test"
    assert dialog.locator("#id_param_walltime").input_value() == "00:10:00"
    ui.shot("09b-request-saved-settings", full_page=False)
    dialog.get_by_role("link", name="Cancel").click()
    dialog.wait_for(state="hidden")

    # Its node-hours, from connected to stopped, are on the Usage page.
    page.click("nav >> text=Usage")
    worker.refresh_from_db()
    assert worker.connected_at and worker.finished_at
    held = int((worker.finished_at - worker.connected_at).total_seconds())
    assert page.inner_text("#usage-total") == f"0:{held // 60:02d}:{held % 60:02d}"
    ui.shot("09c-usage")

    # Clusters, connecting an account on a cluster that is not shared, API keys.
    page.click("nav >> text=Clusters")
    assert "you need no account of your own" in page.inner_text("#cluster-test-slurm")
    assert "offline" in page.inner_text("#cluster-campus")
    ui.shot("10-clusters")
    page.locator("#cluster-campus").get_by_role("link", name="Connect").click()
    page.fill("#id_remote_username", "alice")
    page.click("button:has-text('Connect account')")
    public_key = page.locator("#public-key").inner_text()
    assert public_key.startswith("ssh-ed25519 ")
    page.get_by_role("button", name="Copy public key").click()
    assert page.evaluate("navigator.clipboard.readText()") == public_key
    ui.shot("11-account-generated-key")
    page.get_by_role("button", name="Verify").click()
    page.get_by_text("Could not log in to campus").wait_for()
    ui.shot("12-account-verify-failed")

    page.click("nav >> text=API keys")
    ui.shot("13-api-keys-empty")
    page.fill("#id_name", "laptop")
    page.click("button:has-text('Create key')")
    secret = page.locator("#new-api-key").inner_text()
    assert secret.startswith("pwk_")
    ui.shot("14-api-key-created")
    page.reload()
    assert secret not in page.content() and "laptop" in page.content()

    assert "bobs-worker" not in page.content()
    assert ui.errors == [], ui.errors
    assert ui.outside == [], ui.outside
    context.close()


def test_a_row_menu_opened_as_the_table_refreshes_stays_open_and_its_items_work(
    browser_platform: Platform, world: dict[str, Any], chromium: Any, screenshots: Path
) -> None:
    """The Workers table is refreshed every two seconds; a refresh already on its way when a row's
    menu opens must not close it under the pointer ("Delete worker" was never clickable)."""
    bobs = Worker.objects.get(name="bobs-worker")
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    ui = Browser(context.new_page(), browser_platform.url, screenshots)
    page = ui.page
    ui.log_in("operator")
    row = page.locator(f"#worker-{bobs.public_id}")
    summary = row.locator("details.menu summary")
    refreshes: list[str] = []

    def count_refresh(request: Any) -> None:
        if "/workers/table/" in request.url:
            refreshes.append(request.url)

    page.on("request", count_refresh)

    def swapped() -> None:
        """Wait until a refresh has replaced the table (the element marked here is gone)."""
        page.evaluate("document.getElementById('workers-table').dataset.old = '1'")
        page.locator("#workers-table:not([data-old])").wait_for(state="attached", timeout=10_000)

    # Given: a refresh held on its way (as on a slow network) ...
    held: list[Any] = []
    page.route("**/workers/table/**", lambda route: held.append(route))
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert held, "the table was not refreshed within 10 s"
    # ... when the row's menu is opened, then the refresh arrives.
    summary.click()
    with page.expect_response(lambda r: "/workers/table/" in r.url):
        held[0].continue_()
    page.unroute("**/workers/table/**")
    # When: more than two refresh periods go by.
    asked = len(refreshes)
    page.wait_for_timeout(5000)
    # Then: the menu is still open and its items work; no refresh was asked for meanwhile.
    assert row.locator("details.menu[open]").count() == 1
    assert len(refreshes) == asked, refreshes
    ui.shot("15-row-menu-across-refreshes", full_page=False)
    assert "{#" not in page.inner_text("main")  # a template comment left on the page
    row.get_by_role("link", name="Delete worker").click(timeout=2000)
    dialog = page.locator("dialog#dialog")
    dialog.wait_for(state="visible")
    # The dialog it opened stays open while the table behind it refreshes.
    swapped()
    assert dialog.is_visible() and "deletes every session running on it" in dialog.inner_text()
    page.keyboard.press("Escape")
    dialog.wait_for(state="hidden")
    # Focus on a row's control stays there across a refresh (the keyboard user is not thrown out).
    summary.focus()
    swapped()
    focused = page.evaluate("document.activeElement.getAttribute('aria-label')")
    assert focused == "Actions for bobs-worker"
    page.keyboard.press("Enter")
    assert row.locator("details.menu[open]").count() == 1
    assert ui.errors == [] and ui.outside == []
    context.close()


def test_staff_see_everyones_workers_and_the_admin_is_named_activate(
    browser_platform: Platform, world: dict[str, Any], chromium: Any, screenshots: Path
) -> None:
    base = browser_platform.url
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    ui = Browser(context.new_page(), base, screenshots)
    ui.log_in("operator")
    assert "bobs-worker" in ui.page.content()
    ui.shot("20-staff-workers")

    # Keyboard only: the row menu and the dialog open with Enter and close with Escape.
    page = ui.page
    page.locator("details.menu summary").focus()
    page.keyboard.press("Enter")
    assert page.locator("details.menu[open]").count() == 1
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Copy SSH command"
    page.keyboard.press("Escape")
    assert page.locator("details.menu[open]").count() == 0
    page.locator("a.button:has-text('Create')").focus()
    page.keyboard.press("Enter")
    page.locator("dialog#dialog").wait_for(state="visible")
    page.keyboard.press("Escape")
    page.locator("dialog#dialog").wait_for(state="hidden")
    ui.page.click("nav >> text=Admin")
    assert "ACTIVATE administration" in ui.page.content()
    assert "Django administration" not in ui.page.content()
    ui.shot("21-admin")
    ui.page.get_by_role("link", name="View site").click()
    ui.page.wait_for_url(base + "/workers/")
    assert ui.errors == [] and ui.outside == []
    context.close()

    # A phone: the same pages, readable in one column; the dialog fits the screen.
    phone = chromium.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    ui = Browser(phone.new_page(), base, screenshots)
    ui.log_in("operator")
    ui.shot("30-phone-workers")
    ui.page.click("a.button:has-text('Create')")
    ui.page.locator("dialog#dialog").wait_for(state="visible")
    ui.shot("31-phone-request-dialog", full_page=False)
    ui.page.keyboard.press("Escape")
    ui.page.click("nav >> text=Clusters")
    ui.shot("32-phone-clusters")
    assert ui.errors == [] and ui.outside == []
    phone.close()


def test_another_users_worker_is_never_in_alices_pages(
    browser_platform: Platform, world: dict[str, Any], chromium: Any, screenshots: Path
) -> None:
    bobs = Worker.objects.get(name="bobs-worker")
    context = chromium.new_context()
    ui = Browser(context.new_page(), browser_platform.url, screenshots)
    ui.log_in("alice")
    for path in ("/workers/", "/workers/table/", "/clusters/", "/workers/new/"):
        ui.page.goto(browser_platform.url + path)
        assert "bobs-worker" not in ui.page.content() and bobs.public_id not in ui.page.content()
    # Without the dialog (a link opened in a new tab), the request form is a page of its own.
    ui.page.goto(browser_platform.url + "/workers/new/")
    ui.shot("40-request-as-a-page")
    for action in ("delete", "terminal"):
        response = ui.page.goto(f"{browser_platform.url}/workers/{bobs.public_id}/{action}/")
        assert response is not None and response.status == 404
    # Her browser's session opening Bob's terminal socket: closed as not found.
    code = ui.page.evaluate(
        """(id) => new Promise((resolve) => {
            const ws = new WebSocket(`ws://${location.host}/ws/workers/${id}/terminal/`);
            ws.onclose = (event) => resolve(event.code);
        })""",
        bobs.public_id,
    )
    assert code == 4404
    context.close()
