"""Session kinds come from one registry: the API, the pages and the launcher ask it, and a
kind's node starter runs inside the common launcher exactly as the platform sends them."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from typing import Any

import pytest
from rest_framework.test import APIClient

from sessions_app import kinds
from sessions_app.kinds.base import STARTERS
from sessions_app.launch import BOOTSTRAP, LAUNCHER
from tests.sessions.test_session_rules import api, connected_worker

pytestmark = pytest.mark.django_db


def test_the_api_lists_every_registered_kind_and_only_to_a_known_user(user: Any) -> None:
    listed = api(user).get("/api/sessions/kinds/")
    assert listed.status_code == 200
    assert [k["name"] for k in listed.json()] == kinds.names()
    assert {"desktop", "vscode"} <= set(kinds.names())
    for kind in listed.json():
        assert set(kind) == {"name", "label", "description"} and all(kind.values())
    assert APIClient().get("/api/sessions/kinds/").status_code == 401


def test_a_type_the_registry_does_not_know_is_refused_naming_the_known_ones(user: Any) -> None:
    answer = api(user).post(
        "/api/sessions/", {"type": "emacs", "cluster": "c", "worker": "w"}, format="json"
    )
    assert answer.status_code == 400
    assert answer.json()["field"] == "type"


def test_the_sessions_page_offers_a_launch_button_per_kind(user: Any, client: Any) -> None:
    connected_worker(user)
    client.force_login(user)
    page = client.get("/sessions/").content.decode()
    for kind in kinds.all_kinds():
        assert f'name="type" value="{kind.name}"' in page
        assert f'<option value="{kind.name}"' in page
        assert kind.label in page


def test_every_kind_has_a_node_starter_with_a_start_function() -> None:
    for kind in kinds.all_kinds():
        tree = ast.parse((STARTERS / f"{kind.name}.py").read_text())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert [a.arg for a in functions["start"].args.args] == [
            "launcher",
            "secret",
            "port",
            "options",
        ], kind.name
        assert 0 < kind.secret_length <= 32


# A starter as small as one can be: a web server in its own process, told where to serve from.
ECHO_STARTER = textwrap.dedent(
    """
    import sys

    def start(launcher, secret, port, options):
        with open(launcher.workdir + "/index.html", "w") as page:
            page.write(options["--greeting"] + " " + secret)
        launcher.start([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                        "--directory", launcher.workdir, str(port)])
        launcher.wait_for(port, "http.server")
    """
)


def test_the_launcher_runs_a_starter_sent_after_it_and_ends_its_program_on_sigterm() -> None:
    # Given: the launcher started as the platform starts it (password, launcher, NUL, starter).
    launcher = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, "echo", "--greeting", "hello"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdin is not None and launcher.stdout is not None
    launcher.stdin.write("s3cret\n" + LAUNCHER + "\0" + ECHO_STARTER)
    launcher.stdin.close()
    try:
        # When: it reports ready. Then: the starter's program answers on the reported port.
        report = json.loads(launcher.stdout.readline())
        assert report["ready"] is True and report["pid"] == launcher.pid
        url = f"http://127.0.0.1:{report['port']}/index.html"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.read().decode() == "hello s3cret"
        # And: SIGTERM to the launcher ends the program with it.
        os.kill(launcher.pid, signal.SIGTERM)
        assert launcher.wait(timeout=15) == 0
        time.sleep(0.2)
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_a_launch_without_a_starter_says_so_in_its_report() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP, "nothing"],
        input="s3cret\n" + LAUNCHER + "\0",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert json.loads(done.stdout) == {"error": "no starter came for session type 'nothing'"}
