from __future__ import annotations

import json
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import PW, Pw
from workers_app.models import Cluster, Environment

pytestmark = pytest.mark.django_db(transaction=True)


def test_cluster_ls_shows_clusters(pw: Pw, cluster: Cluster) -> None:
    result = pw("cluster", "ls")

    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == ["NAME", "SCHEDULER", "STATUS", "AGENTS", "ACCOUNT"]
    # What ACCOUNT shows for each kind of account: test_cluster_accounts.py.
    assert row.split()[:4] == ["test-slurm", "slurm", "unknown", "direct"]


def test_environments_ls_and_get_show_settable_fields(
    pw: Pw, compute_env: Environment, retired_env: Environment
) -> None:
    listed = pw("environments", "ls", "--cluster", "test-slurm")
    assert listed.returncode == 0, listed.stderr
    _, compute, retired = listed.stdout.splitlines()
    assert compute.split() == ["compute", "debug", "yes", "3/4", "walltime,", "account*,", "qos"]
    assert retired.split()[:3] == ["retired", "-", "no"]

    shown = pw("environments", "get", "compute", "--cluster", "test-slurm")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "Nodes free/total  3/4" in lines
    fields = lines[lines.index("") + 1 :]
    assert fields[0].split() == ["FIELD", "LABEL", "DEFAULT", "REQUIRED", "PATTERN", "CHOICES"]
    assert fields[1].split() == [
        "walltime",
        "Wall",
        "time",
        "01:00:00",
        "no",
        r"^\d{1,2}:\d{2}:\d{2}$",
        "-",
    ]
    assert fields[2].split() == ["account", "Account", "-", "yes", "-", "-"]
    assert fields[3].split() == ["qos", "QoS", "-", "no", "-", "normal,", "high"]

    as_json = json.loads(pw("env", "get", "compute", "-c", "test-slurm", "-o", "json").stdout)
    assert [f["name"] for f in as_json["fields"]] == ["walltime", "account", "qos"]


def test_environments_of_an_unknown_cluster_is_one_line(pw: Pw, cluster: Cluster) -> None:
    result = pw("environments", "ls", "--cluster", "nope")

    assert (result.returncode, result.stderr) == (1, "pw: error: cluster nope not found\n")


def test_a_wrong_api_key_is_reported_as_such(pw: Pw, cluster: Cluster) -> None:
    result = pw("cluster", "ls", PW_API_KEY="pwk_wrong")

    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "refused the API key (Invalid API key.)" in line


def test_an_unreachable_platform_is_reported_with_its_url(pw: Pw) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on the port once the socket is closed.

    result = pw("workers", "ls", PW_PLATFORM_HOST=f"http://127.0.0.1:{port}")

    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"pw: error: cannot reach http://127.0.0.1:{port}")


def test_missing_configuration_says_what_to_set(pw: Pw) -> None:
    env = {k: v for k, v in pw.env.items() if not k.startswith("PW_")}

    result = Pw(env)("workers", "ls")

    assert result.returncode == 1
    assert "no platform host: set PW_PLATFORM_HOST" in result.stderr


def test_a_usage_mistake_is_one_line_with_exit_2(pw: Pw) -> None:
    result = pw("workers", "create", "test-slurm")

    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "give CLUSTER and --environment, or --from NAME" in line


def test_auth_login_checks_the_key_and_stores_it_privately(
    pw: Pw, live_server: Any, api_key: str, cluster: Cluster
) -> None:
    bare = Pw({k: v for k, v in pw.env.items() if not k.startswith("PW_")})

    login = bare("auth", "login", "--platform-host", live_server.url, "--api-key", api_key)

    assert login.returncode == 0, login.stderr
    assert f"Logged in to {live_server.url} as alice" in login.stdout
    path = Path(bare.env["HOME"]) / ".config" / "pw" / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"platform_host": live_server.url, "api_key": api_key}
    assert bare("cluster", "ls").returncode == 0

    elsewhere = bare("--platform-host", "http://127.0.0.1:9", "cluster", "ls")
    assert elsewhere.returncode == 1
    assert "no API key for http://127.0.0.1:9" in elsewhere.stderr


def test_auth_login_with_a_wrong_key_stores_nothing(pw: Pw, live_server: Any) -> None:
    bare = Pw({k: v for k, v in pw.env.items() if not k.startswith("PW_")})

    login = bare("auth", "login", "--platform-host", live_server.url, "--api-key", "pwk_wrong")

    assert login.returncode == 1
    assert "refused the API key" in login.stderr
    assert not (Path(bare.env["HOME"]) / ".config" / "pw").exists()


def test_auth_login_asks_for_what_it_was_not_given(
    pw: Pw, live_server: Any, api_key: str, cluster: Cluster
) -> None:
    env = {k: v for k, v in pw.env.items() if not k.startswith("PW_")}

    # A new session has no terminal, so the key is read from stdin as a script would give it.
    login = subprocess.run(
        [str(PW), "auth", "login"],
        env=env,
        input=f"{live_server.url}\n{api_key}\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        start_new_session=True,
    )

    assert login.returncode == 0, login.stderr
    assert "Platform host: " in login.stdout
    assert api_key not in login.stdout + login.stderr
    assert Pw(env)("cluster", "ls").returncode == 0
