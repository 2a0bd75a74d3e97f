"""pw completion: the printed scripts, sourced in real shells, complete what the parser accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from activate_cli import statuses

from tests.cli.conftest import PW

# Splits a command line the way readline hands it over (a trailing space starts a new, empty
# word), calls the function `complete -p pw` names, and prints what it offers, one per line.
BASH_COMPLETE = r"""
source "$1"
read -ra COMP_WORDS <<< "$2"
[[ "$2" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="$2" COMP_POINT=${#2}
[[ "$(complete -p pw)" =~ -F\ ([^ ]+) ]]
"${BASH_REMATCH[1]}" pw "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"""

REGISTERED = 'source "$1" && complete -p pw'
COMMANDS = [
    "auth",
    "workers",
    "cluster",
    "environments",
    "sessions",
    "saved",
    "usage",
    "files",
    "ssh",
    "completion",
]

# zsh completes only inside its line editor; here compsys' entry points print what they are
# given instead, so the script's own logic runs in a real zsh.
ZSH_COMPLETE = r"""
compdef() { print -r -- "compdef $*" >&2; }
_describe() { print -rl -- ${(P)${@[-1]}}; }
compadd() { shift; print -rl -- "$@"; }
_files() { print -r -- "<files>"; }
source "$1"
words=(${=2})
[[ "$2" == *" " ]] && words+=("")
CURRENT=${#words}
_pw
"""


def script(shell: str, tmp_path: Path) -> Path:
    printed = subprocess.run(
        [str(PW), "completion", shell], capture_output=True, text=True, timeout=30, check=True
    )
    path = tmp_path / f"pw.{shell}"
    path.write_text(printed.stdout)
    return path


@pytest.fixture
def bash_script(tmp_path: Path) -> Path:
    return script("bash", tmp_path)


def bash_completions(path: Path, line: str, cwd: Path | None = None) -> list[str]:
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", BASH_COMPLETE, "bash", str(path), line],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=cwd,
    )
    return [w for w in done.stdout.splitlines() if w]


def test_sourcing_the_bash_script_registers_a_completion_function_for_pw(
    bash_script: Path,
) -> None:
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", REGISTERED, "bash", bash_script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )

    assert done.stdout.strip() == "complete -F _pw pw"


@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("pw wor", ["workers"]),
        ("pw ", COMMANDS),
        ("pw workers ", ["create", "again", "ls", "keep", "get", "delete"]),
        ("pw cluster ", ["ls", "connect", "verify", "disconnect"]),
        # An alias leads where its command does.
        ("pw clusters con", ["connect"]),
        ("pw env ls --c", ["--cluster"]),
        ("pw workers ls --st", ["--status"]),
        ("pw workers create -o ", ["table", "json"]),
        ("pw completion ", ["bash", "zsh"]),
        # An option's value is not taken for a command.
        ("pw --platform-host http://x workers g", ["get"]),
        ("pw --platform-host workers ", COMMANDS),
    ],
)
def test_bash_completes_commands_options_and_their_values(
    bash_script: Path, line: str, offered: list[str]
) -> None:
    assert bash_completions(bash_script, line) == offered


def test_bash_offers_every_worker_status_for_status(bash_script: Path) -> None:
    assert bash_completions(bash_script, "pw workers ls --status ") == list(statuses.STATUSES)


def test_bash_completes_file_names_for_a_key_file(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "id_ed25519").write_text("key")

    got = bash_completions(bash_script, "pw cluster connect hpc1 --key-file id_", cwd=tmp_path)

    assert got == ["id_ed25519"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("pw clusters ", ["ls:", "connect:", "verify:", "disconnect:"]),
        ("pw --platform-host http://x workers ls --status ", list(statuses.STATUSES)),
        ("pw cluster connect hpc1 --key-file ", ["<files>"]),
    ],
)
def test_the_zsh_script_walks_the_same_tables_in_zsh(
    tmp_path: Path, line: str, offered: list[str]
) -> None:
    path = script("zsh", tmp_path)

    done = subprocess.run(
        ["zsh", "-f", "-c", ZSH_COMPLETE, "zsh", str(path), line],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )

    assert done.stderr == "compdef _pw pw\n"
    got = done.stdout.splitlines()
    if offered[0].endswith(":"):
        # Sub-commands come with their help text for zsh to show.
        assert [w.split(":", 1)[0] + ":" for w in got] == offered
        assert all(w.split(":", 1)[1] for w in got)
    else:
        assert got == offered


def test_an_unknown_shell_is_a_usage_error() -> None:
    done = subprocess.run(
        [str(PW), "completion", "fish"], capture_output=True, text=True, timeout=30, check=False
    )

    assert done.returncode == 2
    assert "invalid choice: 'fish'" in done.stderr
