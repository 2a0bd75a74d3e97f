"""A session opened in a folder (the platform's --folder, from the Files page or `pw sessions
create --folder`): its program starts there, as the owner, whatever the folder's name holds; a
folder the OS does not let the owner enter, or that is not there, ends the session saying so
before anything of it starts."""

from __future__ import annotations

import pwd
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sessions.apps.conftest import NODE_PYTHON, AppRunner

# Python's own web server on the port it is told, serving the folder it started in.
SERVES_ITS_FOLDER = {
    "name": "here",
    "command": [NODE_PYTHON, "-m", "http.server", "--bind", "127.0.0.1", "{port}"],
    "env": {},
    "reach": "tcp",
    "values": {},
    "base_url": "/s/apptest/",
    "start_timeout": 30,
}


@pytest.fixture
def odd_folder(apps: AppRunner) -> Iterator[Path]:
    """A folder of the owner's whose name a shell would read as commands, holding a marker."""
    home = Path(pwd.getpwnam(apps.owner).pw_dir)
    folder = home / f"activate folder $(touch ran) 'q' ; x-{secrets.token_hex(4)}"
    as_owner = ["runuser", "-u", apps.owner, "--"]
    subprocess.run([*as_owner, "mkdir", "--", str(folder)], check=True)
    subprocess.run([*as_owner, "touch", "--", str(folder / "marker-here.txt")], check=True)
    yield folder
    shutil.rmtree(folder)


def test_a_session_in_a_folder_runs_its_program_there_whatever_the_name_holds(
    apps: AppRunner, odd_folder: Path
) -> None:
    home = Path(pwd.getpwnam(apps.owner).pw_dir)
    run = apps.launch(SERVES_ITS_FOLDER, folder=f"~/{odd_folder.name}")
    assert run.report.get("ready"), run.report
    status, body = run.request("/")
    assert status == 200
    assert b"marker-here.txt" in body
    assert not list(home.glob("ran")) and not Path("/ran").exists()


def test_without_a_folder_the_program_starts_in_the_home(apps: AppRunner) -> None:
    run = apps.launch(SERVES_ITS_FOLDER)
    assert run.report.get("ready"), run.report
    home = Path(pwd.getpwnam(apps.owner).pw_dir)
    listed = {entry.name for entry in home.iterdir()}
    status, body = run.request("/")
    assert status == 200
    assert any(f">{name}" in body.decode(errors="replace") for name in listed), body[:500]


def test_a_folder_the_os_keeps_from_the_owner_ends_the_session_saying_so(
    apps: AppRunner,
) -> None:
    neighbours = Path(pwd.getpwnam(apps.neighbour).pw_dir)
    run = apps.launch(SERVES_ITS_FOLDER, folder=str(neighbours))
    assert run.report == {"error": f"cannot open the folder {neighbours}: Permission denied"}
    gone = f"/nonexistent-{secrets.token_hex(4)}"
    run = apps.launch(SERVES_ITS_FOLDER, folder=gone)
    assert run.report == {"error": f"cannot open the folder {gone}: No such file or directory"}
