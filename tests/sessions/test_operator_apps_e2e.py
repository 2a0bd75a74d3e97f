# ruff: noqa: F811 - pytest fixtures imported by name are parameters of the tests
"""Apps defined by operators, end to end (issue 37's acceptance): TensorBoard and marimo, each
imported from its YAML in docs/apps/ with no Python of its own, launched from the Sessions
page's dialog in Debian's Chromium on the real Slurm over real SSH, showing its own page on its
session's origin, 404 to another user, and ended by the idle policy once left alone (the knobs
in seconds; only the proxy's traffic counts as use, as an idle browser tab is what is left)."""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from playwright.sync_api import Error as PlaywrightError

from harness import REPO
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from sessions_app.catalog import store
from sessions_app.models import Session
from sessions_app.statuses import SessionStatus
from tests.browser import logged_in_page as browser_page
from tests.e2e.test_idle import NODE_NEVER_BUSY
from tests.platforms import module_platform
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    chromium,
    environment,
    in_squeue,
    logged_in_page,
    pw,
    session_tools,
)
from workers_app.models import ApiKey, Environment, Worker
from workers_app.statuses import LIVE

pytestmark = [pytest.mark.slurm, pytest.mark.live]

SCREENSHOTS = REPO / "data" / "screenshots" / "apps"
APPS = REPO / "docs" / "apps"
POLICY_MINUTES = 0.25  # 15 s quiet: warned at 11 s (the 4 s warning's lead), ended at 15 s

shared_apps_platform = module_platform(knobs=NODE_NEVER_BUSY)


@pytest.fixture
def session_platform(transactional_db: None, shared_apps_platform: Platform) -> Platform:
    return shared_apps_platform


def shot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


# A training run's event file, written with TensorBoard's own writer (its environment's Python).
EVENTS = textwrap.dedent(
    """
    import sys, time
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(sys.argv[1])
    for step in range(3):
        value = Summary.Value(tag="loss", simple_value=1.0 / (step + 1))
        writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
    writer.close()
    """
)
# A marimo notebook for marimo's list of the folder's notebooks.
NOTEBOOK = textwrap.dedent(
    """
    import marimo

    app = marimo.App()


    @app.cell
    def _():
        return


    if __name__ == "__main__":
        app.run()
    """
)
# What each app's own page shows once it has loaded, from the folder chosen in its form:
# TensorBoard the run's scalar, marimo the folder's notebook (Playwright's text selectors look
# into shadow roots too).
SHOWN = {
    "tensorboard": ["text=TensorBoard", "text=loss"],
    "marimo": ["text=Create a new notebook", "text=hello.py"],
}


@pytest.fixture
def owners_folder(ssh_target: SshTarget) -> Iterator[tuple[str, Path]]:
    """A folder in the home of alice's Unix account: a training run's events and a notebook."""
    owner = sorted(ssh_target.accounts)[0]
    home = Path(pwd.getpwnam(owner).pw_dir)
    name = f"activate-apps-e2e-{secrets.token_hex(4)}"
    python = Path(os.path.realpath(shutil.which("tensorboard") or "tensorboard")).with_name(
        "python"
    )
    written = subprocess.run(
        ["runuser", "-u", owner, "--", str(python), "-c", EVENTS, str(home / name / "first")],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert written.returncode == 0, written.stderr
    notebook = subprocess.run(
        [
            "runuser",
            "-u",
            owner,
            "--",
            "sh",
            "-c",
            'cat > "$1"',
            "sh",
            str(home / name / "hello.py"),
        ],
        input=NOTEBOOK,
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert notebook.returncode == 0, notebook.stderr
    yield f"~/{name}", home / name
    shutil.rmtree(home / name, ignore_errors=True)


def shows(page: Any, selector: str) -> bool:
    try:
        return bool(page.locator(selector).count())
    except PlaywrightError:  # between two pages of a navigation
        return False


@pytest.mark.serial
@pytest.mark.parametrize("name", sorted(SHOWN))
def test_an_operators_app_launches_from_the_dialog_shows_its_page_and_ends_when_idle(
    name: str,
    session_platform: Platform,
    pw: Any,
    chromium: Any,
    alice: User,
    environment: Environment,
    other_user: User,
    owners_folder: tuple[str, Path],
) -> None:
    # Given: the operator imported the app's YAML (no Python of its own), and the environment
    # ends sessions quiet for 15 s.
    call_command("import_apps", str(APPS / f"{name}.yaml"))
    app = store.all_specs([name])[0]
    environment.idle_minutes = POLICY_MINUTES
    environment.save(update_fields=["idle_minutes"])
    [field] = app.fields  # TensorBoard's log folder, marimo's notebook folder
    folder, _ = owners_folder

    # When: alice launches it from the Sessions page's dialog, its fields filled in.
    page = logged_in_page(chromium, session_platform, "alice")
    page.goto(session_platform.url + "/sessions/")
    page.select_option("#launch-type", name)
    page.fill(f"#value-{name}-{field.name}", folder)
    page.select_option("#launch-target", f"env:{environment.cluster.name}/{environment.name}")
    shot(page, f"{name}-1-dialog")
    page.click("section.launch button[type=submit]")
    page.wait_for_url(f"{session_platform.url}/sessions/s*/")
    public_id = page.url.rstrip("/").rsplit("/", 1)[1]
    session = Session.objects.get(public_id=public_id)
    assert session.session_type == name
    assert session.values == {field.name: folder}
    started = time.monotonic()
    wait_for(lambda: state(session).status != SessionStatus.PENDING or None, timeout=240)
    wait_for(
        lambda: (
            state(session).status
            in (SessionStatus.RUNNING, SessionStatus.FAILED, SessionStatus.ENDED)
        ),
        timeout=240,
    )
    assert session.status == SessionStatus.RUNNING, session.status_reason
    print(f"\n{name} running {time.monotonic() - started:.1f} s after the dialog's Launch")

    # Then: Open shows the app's own page, on the session's own origin.
    page.wait_for_selector("#open-session", timeout=60_000)
    href = page.get_attribute("#open-session", "href")
    answers: list[str] = []
    page.on("response", lambda r: answers.append(f"{r.request.method} {r.url} {r.status}"))
    page.on("console", lambda m: answers.append(f"console {m.type}: {m.text[:200]}"))
    page.goto(session_platform.url + str(href))
    for selector in SHOWN[name]:
        try:
            wait_for(lambda selector=selector: shows(page, selector), timeout=40)
        except TimeoutError:
            shot(page, f"{name}-failed")
            pytest.fail(f"{selector} not shown; {chr(10).join(answers)}")
    host = urlsplit(page.url).hostname or ""
    assert host.startswith(f"{public_id}."), page.url
    path = shot(page, f"{name}-2-page")
    print(f"{name}: its page at {page.url} ({path})")

    # And: another user gets 404 there, by the API's address and by the browser's.
    _, bob_key = ApiKey.issue(other_user)
    theirs = httpx.get(
        f"{session_platform.url}/s/{public_id}/",
        headers={"Authorization": f"Bearer {bob_key}"},
        timeout=30,
    )
    assert theirs.status_code == 404
    bobs_page = browser_page(chromium, session_platform.url, "bob", "pw-bob-123")
    bobs = bobs_page.goto(f"{session_platform.url}/s/{public_id}/")
    assert bobs is not None and bobs.status == 404, bobs_page.url
    bobs_page.context.close()
    mine = ApiKey.issue(alice)[1]
    own = httpx.get(
        f"{session_platform.url}/s/{public_id}/{app.landing_path}",
        headers={"Authorization": f"Bearer {mine}"},
        timeout=30,
        follow_redirects=True,
    )
    assert own.status_code == 200, own.text[:300]
    if name == "tensorboard":  # the folder chosen in the form, its run read
        runs = httpx.get(
            f"{session_platform.url}/s/{public_id}/data/runs",
            headers={"Authorization": f"Bearer {mine}"},
            timeout=30,
        )
        assert runs.json() == ["first"]

    # When: she leaves it alone (the tab closed).
    page.context.close()
    quiet_from = time.monotonic()
    # Then: the idle policy ends it, and the worker launched for it goes with its job.
    wait_for(lambda: state(session).status == SessionStatus.ENDED or None, timeout=120)
    ended_after = time.monotonic() - quiet_from
    print(f"{name}: ended {ended_after:.1f} s after it was left alone: {session.status_reason}")
    assert "idle" in session.status_reason
    worker = Worker.objects.get(pk=session.worker_id)
    wait_for(lambda: state(worker).status not in LIVE or None, timeout=120)
    wait_for(lambda: not in_squeue(worker.scheduler_job_id), timeout=120)


def state(row: Any) -> Any:
    row.refresh_from_db()
    return row


# An app whose program gives up at once, saying why (its command is a template like any other).
BROKEN = """\
name: broken
label: Broken
command:
  - python3
  - -c
  - "import sys; print('starting up'); sys.exit('no folder ' + sys.argv[1])"
  - "{folder}"
env: {SOCKET_PATH: "{socket}"}
reach: unix
fields:
  - {name: folder, label: Folder, default: "~/nope", required: true}
"""


@pytest.mark.serial
def test_an_app_that_fails_to_start_fails_its_session_with_the_programs_last_lines(
    session_platform: Platform, pw: Any, alice: User, environment: Environment, tmp_path: Path
) -> None:
    source = tmp_path / "broken.yaml"
    source.write_text(BROKEN)
    call_command("import_apps", str(source))
    result = pw(
        "sessions", "create", "--type", "broken", environment.cluster.name, "-e",
        environment.name, "--value", "folder=~/a b;$(id)", "--wait", "-o", "json", timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    session = Session.objects.get(owner=alice, session_type="broken")
    print(f"\nits reason: {session.status_reason}")
    assert session.status == SessionStatus.FAILED
    assert session.status_reason.startswith("Could not start: ")
    assert "starting up" in session.status_reason
    # The value reached the program as one argument (its home's "~" filled in), and ran nothing.
    lines = session.status_reason.splitlines()
    assert any(re.fullmatch(r"no folder /\S+/a b;\$\(id\)", line) for line in lines), lines
    assert "no folder" in result.stderr
