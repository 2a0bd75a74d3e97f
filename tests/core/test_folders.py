"""Folders something opens in: what is refused with a sentence, and a command run in one by a
real sh, whatever bytes the name holds, with nothing in it ever run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from core.errors import ParameterError
from core.folders import MAX_FOLDER, checked_folder, in_folder

ODD = "a b 'q' \"d\" $(touch ran) `touch ran` ; touch ran & \n -x *"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("relative/path", "must be absolute"),
        ("~bob/x", "must be absolute"),
        ("/a\x00b", "NUL"),
        ("/" + "x" * MAX_FOLDER, "at most"),
        ("/\udcff", "UTF-8"),
        (7, "must be a string"),
    ],
)
def test_a_folder_that_names_no_place_is_refused_saying_why(value: object, said: str) -> None:
    with pytest.raises(ParameterError) as refused:
        checked_folder(value, "cwd")
    assert refused.value.field == "cwd"
    assert said in refused.value.message


@pytest.mark.parametrize("value", ["", None, "~", "~/x y", "/tmp", "/" + "é" * 100])
def test_absolute_folders_and_the_home_are_taken_as_given(value: object) -> None:
    assert checked_folder(value) == (value or "")


def run(folder: str, argv: list[str], home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "SHELL": "/bin/sh"}
    return subprocess.run(
        in_folder(folder, argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=30
    )


def test_a_command_runs_in_the_folder_named_with_any_characters_and_nothing_in_it_runs(
    tmp_path: Path,
) -> None:
    home, start = tmp_path / "home", tmp_path / "start"
    odd = home / ODD
    odd.mkdir(parents=True)
    start.mkdir()
    done = run(str(odd), ["sh", "-c", 'pwd; printf "%s|" "$@"', "x", "-n", "$(id)"], home, start)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{odd}\n-n|$(id)|"
    assert not list(tmp_path.rglob("ran"))  # neither the folder's name nor an argument ran


def test_the_home_is_where_the_node_says_and_a_login_shell_starts_without_a_command(
    tmp_path: Path,
) -> None:
    home, start = tmp_path / "home", tmp_path / "start"
    (home / "d").mkdir(parents=True)
    start.mkdir()
    assert run("~/d", ["pwd"], home, start).stdout == f"{home}/d\n"
    assert run("~", ["pwd"], home, start).stdout == f"{home}\n"
    shell = subprocess.run(
        in_folder("~/d", []),
        input="pwd; exit 4\n",
        capture_output=True,
        text=True,
        env={"HOME": str(home), "PATH": os.environ["PATH"], "SHELL": "/bin/sh"},
        cwd=start,
        timeout=30,
    )
    assert (shell.returncode, shell.stdout) == (4, f"{home}/d\n")


def test_a_folder_that_is_not_there_ends_it_saying_so_before_the_command_runs(
    tmp_path: Path,
) -> None:
    done = run(str(tmp_path / "gone"), ["touch", str(tmp_path / "ran")], tmp_path, tmp_path)
    assert done.returncode == 1
    assert done.stderr == f"activate: cannot open the folder {tmp_path}/gone\n"
    assert not (tmp_path / "ran").exists()


def test_no_folder_leaves_the_command_as_it_was() -> None:
    assert in_folder("", ["ls", "-l"]) == ["ls", "-l"]
