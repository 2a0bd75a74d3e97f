"""pw installs on its own: `pip install ./cli` into a fresh virtual environment, from PyPI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

CLI = Path(__file__).resolve().parents[2] / "cli"
TIMEOUT = 120


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    # Nothing of this repository's environment leaks in (PYTHONPATH, VIRTUAL_ENV).
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [str(a) for a in argv], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


def test_pip_install_of_cli_gives_a_working_pw_without_the_server(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0

    installed = run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", CLI)
    assert installed.returncode == 0, installed.stderr

    helped = run(venv / "bin" / "pw", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "workers" in helped.stdout and "cluster" in helped.stdout
    assert run(venv / "bin" / "pw", "completion", "bash").stdout.startswith("# bash completion")
    located = run(python, "-c", "import activate_cli; print(activate_cli.__file__)")
    assert located.stdout.startswith(str(venv)), "pw must run from the venv, not the checkout"
    for server_only in ("django", "celery", "paramiko", "psycopg"):
        imported = run(python, "-c", f"import {server_only}")
        assert imported.returncode != 0, f"{server_only} came along with pw"
        assert "ModuleNotFoundError" in imported.stderr
