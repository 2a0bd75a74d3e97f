"""pw knows the session types from the server: it lists them, checks --type against them with
one line of error, and completes --type with them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sessions_app import kinds
from tests.cli.conftest import PW, Pw
from tests.cli.test_completion import BASH_COMPLETE, script
from workers_app.models import Environment

pytestmark = pytest.mark.django_db(transaction=True)


def test_types_lists_the_servers_session_types(pw: Pw) -> None:
    listed = pw("sessions", "types")
    names = pw("sessions", "types", "--names")

    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["TYPE", "LABEL", "DESCRIPTION"]
    assert [row.split()[0] for row in rows] == kinds.names()
    assert names.stdout.split() == kinds.names()


def test_create_with_a_type_the_server_lacks_is_one_line_naming_the_ones_it_has(
    pw: Pw, compute_env: Environment
) -> None:
    result = pw("sessions", "create", "test-slurm", "--type", "emacs", "-e", "compute")

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    offered = ", ".join(kinds.names())
    assert result.stderr.startswith("pw: error: unknown session type 'emacs'")
    assert result.stderr.rstrip().endswith(f"offers: {offered}")


def test_create_with_a_type_the_server_has_launches_it(pw: Pw, compute_env: Environment) -> None:
    result = pw(
        "sessions", "create", "test-slurm", "-t", "vscode", "-e", "compute", "-p", "account=p"
    )

    assert result.returncode == 0, result.stderr
    assert "Type              vscode" in result.stdout


def test_bash_completes_type_with_the_servers_types(pw: Pw, tmp_path: Path) -> None:
    path = script("bash", tmp_path)
    env = {**pw.env, "PATH": f"{PW.parent}:{pw.env['PATH']}"}
    for line in ("pw sessions create c -t ", "pw sessions create c --type v"):
        done = subprocess.run(
            ["bash", "--norc", "--noprofile", "-c", BASH_COMPLETE, "bash", str(path), line],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env=env,
        )
        typed = line.rsplit(" ", 1)[1]
        assert done.stdout.split() == [n for n in kinds.names() if n.startswith(typed)], line
