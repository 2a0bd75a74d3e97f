"""The starter of operators' apps (node/starters/app.py) with a stand-in launcher: how it reads
the app's definition, fills its templates (each token by itself, never a shell, a value never
read as a template), keeps the session's password out of command lines, and says why a start
failed with the program's last lines. Real programs, as the owner with a neighbour beside
them, are in tests/sessions/apps/."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from node import starter_source
from node.starters import app

SECRET = "s3cret-password-of-the-session"
HOME = os.path.expanduser("~")


class Failed(Exception):
    """launcher.fail: the session fails with this message."""


class Program:
    returncode = None

    def poll(self) -> None:
        return None


class StandInLauncher:
    """What a starter uses of the launcher, recording what it would start."""

    ready_within = 120

    def __init__(self, workdir: Path) -> None:
        self.workdir = str(workdir)
        self.routes: dict[str, str] = {}
        self.started: list[tuple[list[str], dict[str, Any]]] = []
        self.starter_source = starter_source("app")
        self.folder = os.path.join(HOME, "a folder")

    def route(self, name: str) -> str:
        self.routes[name] = os.path.join(self.workdir, name + ".sock")
        return self.routes[name]

    def answers(self, path: str) -> bool:
        return True

    def fail(self, message: str) -> None:
        raise Failed(message)

    def start(self, argv: list[str], vital: bool = True, **kwargs: Any) -> Program:
        self.started.append((argv, kwargs))
        return Program()


@pytest.fixture(autouse=True)
def _user_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node allows them (the real probe runs in tests/sessions/apps/)."""
    monkeypatch.setattr(app, "private_network_refused", lambda helper: "")


def encoded(spec: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(spec).encode()).decode().rstrip("=")


def spec_of(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "web",
        "command": ["python3", "-m", "http.server", "--bind", "127.0.0.1", "{port}"],
        "env": {},
        "reach": "tcp",
        "values": {},
        "base_url": "/s/abc123/",
        "start_timeout": 5,
    }
    spec.update(overrides)
    return spec


def started(tmp_path: Path, **overrides: Any) -> tuple[list[str], dict[str, Any], StandInLauncher]:
    """What the starter starts for this app: the argv and keywords given to launcher.start."""
    launcher = StandInLauncher(tmp_path)
    app.start(launcher, SECRET, {"--spec-b64": encoded(spec_of(**overrides))})  # type: ignore[arg-type]
    ((argv, kwargs),) = launcher.started
    return argv, kwargs, launcher


def program_argv(argv: list[str]) -> list[str]:
    """The program's own argv inside the private network's helper (tcp), or argv (unix)."""
    return argv[argv.index("--") + 1 :] if "--private-network" in argv else argv


def failure(tmp_path: Path, **overrides: Any) -> str:
    with pytest.raises(Failed) as failed:
        started(tmp_path, **overrides)
    return str(failed.value)


def test_each_token_is_filled_by_itself_and_a_value_reaches_the_program_as_it_is(
    tmp_path: Path,
) -> None:
    meta = "; rm -rf ~ $(id) `x` \"' && {port} {{home}} \\ \n | *"
    argv, kwargs, launcher = started(
        tmp_path,
        command=[
            "python3",
            "{meta}",
            "--path_prefix={base_path}",
            "{base_url}",
            "x{{literal}}y",
            "{workdir}/f",
            "{home}",
            "{cwd}",
            "{port}",
        ],
        values={"meta": meta},
    )
    port = program_argv(argv)[-1]
    assert program_argv(argv) == [
        "python3",
        meta,
        "--path_prefix=/s/abc123",
        "/s/abc123/",
        "x{literal}y",
        f"{launcher.workdir}/f",
        HOME,
        launcher.folder,
        port,
    ]
    assert 20000 <= int(port) < 32768
    assert kwargs["cwd"] == launcher.folder  # the session's folder, where it was asked to open


def test_the_password_goes_in_env_only_and_never_on_a_command_line(tmp_path: Path) -> None:
    argv, kwargs, _ = started(tmp_path, env={"APP_TOKEN": "token:{secret}", "PLAIN": "{{secret}}"})
    assert kwargs["env"]["APP_TOKEN"] == f"token:{SECRET}"
    assert kwargs["env"]["PLAIN"] == "{secret}"
    assert kwargs["env"]["PATH"] == os.environ["PATH"]  # the launcher's environment beneath
    assert not any(SECRET in token for token in argv)
    launcher = StandInLauncher(tmp_path)
    refused = encoded(spec_of(command=["python3", "--token={secret}", "{port}"]))
    with pytest.raises(Failed, match=r"may not hold \{secret\}.*use \{secret_file\}"):
        app.start(launcher, SECRET, {"--spec-b64": refused})  # type: ignore[arg-type]
    assert launcher.started == []


def test_the_secret_file_is_the_owners_alone_and_written_only_when_named(
    tmp_path: Path,
) -> None:
    argv, _, launcher = started(
        tmp_path, command=["python3", "--token-file", "{secret_file}", "{port}"]
    )
    path = program_argv(argv)[2]
    assert path == os.path.join(launcher.workdir, "secret")
    assert Path(path).read_text() == SECRET
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    other = tmp_path / "other"
    other.mkdir()
    started(other)
    assert not (other / "secret").exists()


@pytest.mark.parametrize(
    "token",
    ["{nope}", "{port:>6}", "{home!r}", "{home.real}", "{values[0]}", "{0}", "{}", "{", "a}b"],
)
def test_anything_but_a_known_plain_placeholder_fails_the_session_saying_so(
    tmp_path: Path, token: str
) -> None:
    message = failure(tmp_path, command=["python3", token, "{port}"])
    assert message.startswith("web: its command")
    if token == "{nope}":
        assert "unknown placeholder {nope}" in message and "{home}" in message


def test_each_reach_has_its_own_placeholder_and_an_app_must_be_told_where_to_listen(
    tmp_path: Path,
) -> None:
    assert "{port} is for apps reached over TCP" in failure(
        tmp_path, reach="unix", command=["prog", "{socket}", "{port}"]
    )
    assert "{socket} is for apps reached on a Unix socket" in failure(
        tmp_path, command=["prog", "{socket}", "{port}"]
    )
    assert "must tell it where to listen ({port})" in failure(tmp_path, command=["python3"])
    # Told in its environment is told too.
    started(tmp_path, command=["python3"], env={"PORT": "{port}"})


def test_a_unix_app_listens_on_the_route_itself_with_no_helper(tmp_path: Path) -> None:
    argv, _, launcher = started(tmp_path, reach="unix", command=["python3", "--socket={socket}"])
    assert argv == ["python3", f"--socket={launcher.routes['http']}"]


def test_a_tcp_app_runs_under_this_starter_as_the_private_networks_helper(
    tmp_path: Path,
) -> None:
    argv, _, launcher = started(tmp_path)
    helper = os.path.join(launcher.workdir, "app.py")
    port = program_argv(argv)[-1]
    assert argv[:6] == [
        sys.executable,
        helper,
        "--private-network",
        launcher.routes["http"],
        port,
        "--",
    ]
    assert Path(helper).read_text() == starter_source("app")


def test_a_node_without_user_namespaces_fails_a_tcp_app_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        app, "private_network_refused", lambda helper: "[Errno 1] Operation not permitted"
    )
    message = failure(tmp_path)
    assert message == (
        "web listens on TCP, and this node does not let its users have a network of their own "
        "(user namespaces: [Errno 1] Operation not permitted), without which its port would be "
        "open to every user of the node"
    )


def test_a_leading_tilde_in_a_value_is_the_home_folder_and_nowhere_else(tmp_path: Path) -> None:
    values = {"a": "~", "b": "~/runs", "c": "~bob/runs", "d": "x/~/y"}
    argv, _, _ = started(
        tmp_path, command=["python3", "{a}", "{b}", "{c}", "{d}", "{port}"], values=values
    )
    assert program_argv(argv)[1:5] == [HOME, f"{HOME}/runs", "~bob/runs", "x/~/y"]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("not base64 at all!", "is not base64 of JSON"),
        (base64.urlsafe_b64encode(b"[1, 2]").decode(), "is not a JSON object"),
        (encoded({"command": ["x"]}), "has no name"),
        (encoded(spec_of(command=[])), "its command must be a list of strings"),
        (encoded(spec_of(command=["x", 3])), "its command must be a list of strings"),
        (encoded(spec_of(env={"A": 1})), "its env must map names to strings"),
        (encoded(spec_of(env={"A=B": "x"})), "cannot be the name of an environment variable"),
        (encoded(spec_of(values={"port": "1"})), "may not be named 'port'"),
        (encoded(spec_of(reach="vnc")), "reach must be one of unix, tcp"),
        (encoded(spec_of(start_timeout="soon")), "start_timeout must be a number"),
    ],
)
def test_a_definition_the_starter_cannot_run_fails_saying_what_is_wrong(
    tmp_path: Path, spec: str, said: str
) -> None:
    launcher = StandInLauncher(tmp_path)
    with pytest.raises(Failed, match=said.replace("(", r"\(").replace(")", r"\)")):
        app.start(launcher, SECRET, {"--spec-b64": spec})  # type: ignore[arg-type]
    assert launcher.started == []


def test_a_program_the_node_does_not_have_fails_saying_it_is_not_installed(
    tmp_path: Path,
) -> None:
    message = failure(tmp_path, command=["no-such-program-here", "{port}"])
    assert message == "web is not installed on the node (no-such-program-here: not found)"


def test_a_failure_shows_the_programs_last_lines_within_what_the_platform_keeps(
    tmp_path: Path,
) -> None:
    log = tmp_path / "program.log"
    lines = [f"line {n}: " + "x" * 30 for n in range(200)]
    lines += ["\x1b[31mTraceback\x1b[0m: token " + SECRET, "ValueError: the last line"]
    log.write_text("\n".join(lines) + "\n")
    message = app.with_last_lines("web exited with status 1 before it listened", str(log), SECRET)
    assert len(message) <= app.MESSAGE_MAX
    assert message.startswith("web exited with status 1 before it listened; its last lines:\n")
    assert message.endswith("Traceback: token ********\nValueError: the last line")
    assert SECRET not in message and "\x1b" not in message
    log.write_text("")
    assert app.with_last_lines("web exited", str(log), SECRET) == "web exited (it printed nothing)"
