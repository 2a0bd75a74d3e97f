# ruff: noqa: F811 - pytest fixtures imported by name are parameters of the tests
"""An idle worker in the browser: the dialog offers the site's idle policy, the warning comes
as a banner with Keep (and a browser notification in the background), Keep takes it back, and
the worker is then deleted with its reason in its row. Debian's Chromium against the whole
platform and the real Slurm, the idle knobs in seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.platform import Platform
from harness.waiting import wait_for
from tests.workers.pages.test_browser import (  # noqa: F401 - fixtures, found by pytest here
    NOTIFICATIONS_RECORDED,
    SCREENSHOTS,
    Browser,
    chromium,
    chromium_installed,
    status_of_row,
    world,
)
from workers_app.models import Environment, Worker

pytestmark = [pytest.mark.slurm, pytest.mark.live]

IDLE_KNOBS = {
    "ACTIVATE_ACTIVITY_INTERVAL": "1",
    "ACTIVATE_IDLE_SHORTEST": "1",
    "ACTIVATE_IDLE_WARNING": "6",
    "ACTIVATE_IDLE_SWEEP_INTERVAL": "1",
    "ACTIVATE_PURGE_AFTER": "600",
}


@pytest.fixture
def idle_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    running = Platform(workdir=tmp_path, knobs=IDLE_KNOBS)
    running.start_all()
    try:
        yield running
    finally:
        running.stop_all()


def test_an_idle_worker_is_warned_on_the_page_kept_then_deleted_with_its_reason(
    idle_platform: Platform,
    world: dict[str, Any],
    chromium: Any,
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    base = idle_platform.url
    compute = Environment.objects.get(name="compute", cluster__name="test-slurm")
    compute.idle_minutes = 0.3  # the site's default here: 18 s, warned 6 s ahead
    compute.save()
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    context.grant_permissions(["notifications"], origin=base)
    context.add_init_script(NOTIFICATIONS_RECORDED)
    ui = Browser(context.new_page(), base, SCREENSHOTS)
    page = ui.page
    ui.log_in("alice")

    # The dialog offers the site's default, which she keeps.
    page.click("a.button:has-text('Create')")
    dialog = page.locator("dialog#dialog")
    dialog.wait_for(state="visible")
    dialog.locator("#id_param_purpose").fill("idle test")
    field = dialog.locator("#id_idle_minutes")
    assert field.input_value() == "0.3"
    dialog.locator("#id_name").fill("sits-idle")
    ui.shot("10-request-idle-policy", full_page=False)
    dialog.locator("button:has-text('Request worker')").click()
    dialog.wait_for(state="hidden")
    worker = wait_for(lambda: Worker.objects.filter(name="sits-idle").first(), timeout=30)
    assert worker.idle_minutes == 0.3

    # Connected, with nothing running: the warning comes as a banner with Keep, and as a
    # browser notification (the tab counts as in the background).
    wait_for(lambda: status_of_row(page, worker.public_id) == "connected", timeout=120)
    banner = page.locator("#notices .message-notice", has_text="is idle")
    banner.wait_for(timeout=60_000)
    told = page.evaluate("window.notified")
    assert any(title.startswith("Worker sits-idle is idle: it is deleted at") for title in told)
    row = page.locator(f"#worker-{worker.public_id}")
    row.locator(".idle").wait_for(timeout=10_000)
    assert "of 0.3 min" in row.locator(".idle").inner_text()
    ui.shot("11-idle-warning", full_page=False)

    # Keep: the banner goes, the warning is taken back, the clock starts again.
    banner.get_by_role("button", name="Keep").click()
    banner.wait_for(state="detached", timeout=10_000)
    worker.refresh_from_db()
    assert worker.idle_warned_at is None and worker.idle_kept_at is not None

    # Still idle: warned again, then deleted, the reason in its row.
    reason = "Deleted after 0.3 minutes idle"
    page.reload()
    deadline = time.monotonic() + 90
    while reason not in row.inner_text():
        assert time.monotonic() < deadline, row.inner_text()
        time.sleep(0.5)
    worker.refresh_from_db()
    assert worker.status_reason == reason
    assert worker.idle_warned_at is not None and worker.idle_kept_at is not None
    assert (worker.idle_warned_at - worker.idle_kept_at).total_seconds() >= 18 - 6
    ui.shot("12-idle-deleted", full_page=False)
    assert ui.errors == [] and ui.outside == []
