"""The apps of docs/apps/, as an operator imports them, run on the test node by the app starter
(installed by scripts/session-tools.sh): TensorBoard shows the runs of the folder chosen in its
form (given as "~/...", as its default is), and marimo lets in only the login its YAML has the
proxy send. Both listen on TCP only: in the node's tables their processes hold the gate and
nothing else, and the neighbour finds nothing on their ports."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.waiting import wait_for
from tests.processes import args_of
from tests.sessions.apps.conftest import APPS, AppRunner, Launched, spec_from_yaml
from tests.sessions.listener_audit import tcp_listeners

BASE_URL = "/s/apptest/"
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


def only_the_gate(apps: AppRunner, run: Launched) -> None:
    """In the node's tables the app's processes listen on the gate alone, and the neighbour
    finds nothing on the ports they listen on in their own network."""
    processes = set(run.processes())
    mine = [found for found in tcp_listeners(apps.owner_uid) if found.pid in processes]
    assert [listener.port for listener in mine] == [run.report["port"]], mine
    inside = {int(args_of(pid)[4]) for pid in processes if "--private-network" in args_of(pid)}
    for port in inside:
        done = apps.as_neighbour(
            "import socket, sys\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__)\n",
            str(port),
        )
        assert done.stdout.strip() == "ConnectionRefusedError", (port, done)


@pytest.fixture
def owners_folder(apps: AppRunner) -> Iterator[str]:
    """A folder in the owner's home, named as a field's value is given: "~/..."."""
    name = f"activate-app-test-{secrets.token_hex(4)}"
    home = Path(pwd.getpwnam(apps.owner).pw_dir)
    subprocess.run(["runuser", "-u", apps.owner, "--", "mkdir", str(home / name)], check=True)
    yield f"~/{name}"
    shutil.rmtree(home / name)


def test_tensorboard_from_its_yaml_shows_the_runs_of_the_folder_chosen_in_its_form(
    session_tools: None, apps: AppRunner, owners_folder: str
) -> None:
    # Given: a training run's events in a folder of alice's.
    home = pwd.getpwnam(apps.owner).pw_dir
    python = Path(os.path.realpath(shutil.which("tensorboard") or "tensorboard")).with_name(
        "python"
    )
    run_folder = owners_folder.replace("~", home, 1) + "/first"
    written = subprocess.run(
        ["runuser", "-u", apps.owner, "--", str(python), "-c", EVENTS, run_folder],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert written.returncode == 0, written.stderr
    # When: TensorBoard is launched on it as the YAML says.
    run = apps.launch(spec_from_yaml("tensorboard", {"logdir": owners_folder}, BASE_URL))
    assert run.report.get("ready"), run.report
    print(f"TensorBoard ready {run.took:.2f} s after its launcher started")
    # Then: its page under the session's path, and the run in its data.
    status, page = run.request(BASE_URL)
    assert status == 200 and b"<tb-webapp>" in page
    wait_for(lambda: json.loads(run.request(f"{BASE_URL}data/runs")[1]) == ["first"], timeout=60)
    status, tags = run.request(f"{BASE_URL}data/plugin/scalars/tags")
    assert status == 200 and "loss" in json.loads(tags)["first"]
    only_the_gate(apps, run)


def test_marimo_from_its_yaml_lets_in_only_the_login_its_yaml_has_the_proxy_send(
    session_tools: None, apps: AppRunner, owners_folder: str
) -> None:
    login = yaml.safe_load((APPS / "marimo.yaml").read_text())["login"]
    assert login["kind"] == "header"
    run = apps.launch(spec_from_yaml("marimo", {"folder": owners_folder}, BASE_URL))
    assert run.report.get("ready"), run.report
    print(f"marimo ready {run.took:.2f} s after its launcher started")
    # Without the login, or with another token: its login page.
    for headers in ({}, {login["name"]: "Bearer not-the-token"}):
        status, _ = run.request(BASE_URL, headers)
        assert status == 303, headers
    # With the header the proxy sends: its page.
    began = time.monotonic()
    sent = {login["name"]: login["value"].replace("{secret}", run.secret)}
    status, page = run.request(BASE_URL, sent)
    print(f"its page in {time.monotonic() - began:.3f} s through the gate")
    assert status == 200 and b"marimo" in page
    only_the_gate(apps, run)


@pytest.mark.parametrize("path", sorted(APPS.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_documented_app_starts_from_its_yaml_alone_and_answers_ready_behind_the_gate(
    session_tools: None, apps: AppRunner, path: Path
) -> None:
    """An operator's next app is its YAML and nothing else: each one in docs/apps/ starts with
    its fields' defaults, answers its readiness request (with the login its YAML has the proxy
    send) and, on TCP, holds nothing but the gate in the node's tables."""
    data = yaml.safe_load(path.read_text())
    defaults = {field["name"]: str(field.get("default", "")) for field in data["fields"]}
    run = apps.launch(spec_from_yaml(data["name"], defaults, BASE_URL))
    assert run.report.get("ready"), run.report
    login = data["login"]
    headers = {}
    if login["kind"] == "header":
        headers[login["name"]] = login["value"].replace("{secret}", run.secret)
    elif login["kind"] == "cookie":
        headers["Cookie"] = f"{login['name']}={login['value'].replace('{secret}', run.secret)}"
    prefix = BASE_URL if data["keeps_prefix"] else "/"
    status, _ = run.request(prefix + data["ready"]["path"], headers)
    assert status in data["ready"]["statuses"], (status, data["ready"])
    if data["reach"] == "tcp":
        only_the_gate(apps, run)
