"""pw cluster ls|connect|verify|disconnect against a scripted platform that keeps the API contract.

The platform's side of per-user accounts is built separately; these pin what pw sends and how it
words each answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from activate_cli.main import main

HOST = "http://platform.test"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests activate:alice@hpc1"
PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----\n"
)


def account(*, verified: bool = False, last_error: str = "", origin: str = "generated") -> dict:
    return {
        "remote_username": "alice",
        "verified": verified,
        "public_key": PUBLIC_KEY,
        "origin": origin,
        "last_error": last_error,
    }


Route = Callable[[httpx.Request], httpx.Response]


@dataclass
class Platform:
    """Answers by (method, path); records every request pw made."""

    routes: dict[tuple[str, str], Route]
    seen: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        route = self.routes.get((request.method, request.url.path))
        if route is None:
            return httpx.Response(404, json={"field": None, "detail": "Not found."})
        return route(request)

    def bodies(self) -> list[tuple[str, str, Any]]:
        return [
            (r.method, r.url.path, json.loads(r.content) if r.content else None) for r in self.seen
        ]


def answer(status: int, body: Any = None) -> Route:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status) if body is None else httpx.Response(status, json=body)

    return respond


@pytest.fixture
def pw(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    monkeypatch.setenv("PW_PLATFORM_HOST", HOST)
    monkeypatch.setenv("PW_API_KEY", "pwk_x")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def run(platform: Platform, *args: str) -> tuple[int, str, str]:
        code = main(list(args), transport=httpx.MockTransport(platform))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_cluster_ls_says_for_each_cluster_how_you_act_on_it(pw: Callable[..., Any]) -> None:
    clusters = [
        {"name": "hpc1", "scheduler": "slurm", "reachability": "online", "shared": False},
        {
            "name": "hpc2",
            "scheduler": "pbs",
            "reachability": "offline",
            "shared": False,
            "agent_route": "via_login_host",
            "relay_state": "up",
        },
        {"name": "lab", "scheduler": "host", "reachability": "unknown", "shared": True},
        {"name": "new", "scheduler": "slurm", "reachability": "online", "shared": False},
    ]
    clusters[0]["account"] = account(verified=True)
    clusters[1]["account"] = account(verified=False)
    clusters[2]["account"] = None
    clusters[3]["account"] = None
    page = {"count": 4, "next": None, "previous": None, "results": clusters}
    platform = Platform({("GET", "/api/clusters/"): answer(200, page)})

    code, out, _ = pw(platform, "cluster", "ls")

    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "SCHEDULER", "STATUS", "AGENTS", "ACCOUNT"]
    account_column = [row[header.index("ACCOUNT") :] for row in rows]
    assert account_column == [
        "alice (verified)",
        "alice (not verified)",
        "shared",
        "none - run: pw cluster connect new --user USER",
    ]
    assert [row.split()[2] for row in rows] == ["online", "offline", "unknown", "online"]
    # A platform that does not say (an older one) is read as direct.
    assert [row.split()[3] for row in rows] == [
        "direct",
        "login-host-relay:up",
        "direct",
        "direct",
    ]


def test_connect_without_a_key_shows_the_public_key_to_install_and_what_next(
    pw: Callable[..., Any],
) -> None:
    platform = Platform({("POST", "/api/clusters/hpc1/account/"): answer(201, account())})

    code, out, err = pw(platform, "cluster", "connect", "hpc1", "--user", "alice")

    assert code == 0, err
    assert platform.bodies() == [
        ("POST", "/api/clusters/hpc1/account/", {"remote_username": "alice"})
    ]
    # The key alone on stdout: `pw cluster connect ... > key.pub` keeps just the key.
    assert out == PUBLIC_KEY + "\n"
    assert "~/.ssh/authorized_keys of alice on hpc1" in err
    assert "then run: pw cluster verify hpc1" in err


def test_connect_with_a_key_file_sends_the_key_and_verifies_at_once(
    pw: Callable[..., Any], tmp_path: Path
) -> None:
    key_file = tmp_path / "id_ed25519"
    key_file.write_text(PRIVATE_KEY)
    platform = Platform(
        {
            ("POST", "/api/clusters/hpc1/account/"): answer(201, account(origin="uploaded")),
            ("POST", "/api/clusters/hpc1/account/verify/"): answer(200, account(verified=True)),
        }
    )

    code, out, err = pw(
        platform, "cluster", "connect", "hpc1", "-u", "alice", "--key-file", str(key_file)
    )

    assert code == 0, err
    assert platform.bodies() == [
        (
            "POST",
            "/api/clusters/hpc1/account/",
            {"remote_username": "alice", "private_key": PRIVATE_KEY},
        ),
        ("POST", "/api/clusters/hpc1/account/verify/", {}),
    ]
    assert out == "verified: you act on hpc1 as alice\n"


def test_connect_with_a_key_that_cannot_log_in_fails_with_the_platforms_reason(
    pw: Callable[..., Any], tmp_path: Path
) -> None:
    key_file = tmp_path / "id_ed25519"
    key_file.write_text(PRIVATE_KEY)
    refused = account(verified=False, last_error="Authentication failed:\n publickey denied")
    platform = Platform(
        {
            ("POST", "/api/clusters/hpc1/account/"): answer(201, account(origin="uploaded")),
            ("POST", "/api/clusters/hpc1/account/verify/"): answer(200, refused),
        }
    )

    code, out, err = pw(
        platform, "cluster", "connect", "hpc1", "-u", "alice", "--key-file", str(key_file)
    )

    assert code == 1
    assert out == ""
    assert err.splitlines()[-1] == (
        "pw: error: cannot log in to hpc1 as alice: Authentication failed: publickey denied"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            PUBLIC_KEY + "\n",
            "{path} is a public key; pass the private key file (e.g. without .pub)",
        ),
        (None, "cannot read {path}: No such file or directory"),
    ],
)
def test_a_key_file_that_is_not_a_private_key_is_refused_before_anything_is_sent(
    pw: Callable[..., Any], tmp_path: Path, content: str | None, message: str
) -> None:
    key_file = tmp_path / "id_ed25519.pub"
    if content is not None:
        key_file.write_text(content)
    platform = Platform({})

    code, out, err = pw(
        platform, "cluster", "connect", "hpc1", "-u", "alice", "--key-file", str(key_file)
    )

    assert (code, out) == (1, "")
    assert err == f"pw: error: {message.format(path=key_file)}\n"
    assert platform.seen == []


def test_verify_says_who_you_act_as(pw: Callable[..., Any]) -> None:
    platform = Platform(
        {("POST", "/api/clusters/hpc1/account/verify/"): answer(200, account(verified=True))}
    )

    code, out, _ = pw(platform, "cluster", "verify", "hpc1")

    assert (code, out) == (0, "verified: you act on hpc1 as alice\n")


def test_verify_that_fails_prints_the_last_error_and_exits_non_zero(
    pw: Callable[..., Any],
) -> None:
    refused = account(verified=False, last_error="Permission denied (publickey)")
    platform = Platform({("POST", "/api/clusters/hpc1/account/verify/"): answer(200, refused)})

    code, out, err = pw(platform, "cluster", "verify", "hpc1")

    assert (code, out) == (1, "")
    assert err == "pw: error: cannot log in to hpc1 as alice: Permission denied (publickey)\n"


def test_verify_without_an_account_says_how_to_connect_one(pw: Callable[..., Any]) -> None:
    code, _, err = pw(Platform({}), "cluster", "verify", "hpc1")

    assert code == 1
    assert err == (
        "pw: error: you have no account on cluster hpc1 (connect one with: pw cluster connect)\n"
    )


def test_disconnect_deletes_the_account(pw: Callable[..., Any]) -> None:
    platform = Platform({("DELETE", "/api/clusters/hpc1/account/"): answer(204)})

    code, out, err = pw(platform, "cluster", "disconnect", "hpc1")

    assert code == 0, err
    assert platform.bodies() == [("DELETE", "/api/clusters/hpc1/account/", None)]
    assert out == "disconnected: the platform no longer acts on hpc1 as you\n"


@pytest.mark.parametrize(
    ("answered", "message"),
    [
        (
            answer(400, {"field": "remote_username", "detail": "Not a valid user name."}),
            "pw: error: remote_username: Not a valid user name.",
        ),
        (
            answer(400, {"field": None, "detail": "hpc1 is shared; it needs no account."}),
            "pw: error: hpc1 is shared; it needs no account.",
        ),
        (answer(404, {"field": None, "detail": "Not found."}), "pw: error: cluster hpc1 not found"),
    ],
)
def test_a_refused_connect_is_one_line(
    pw: Callable[..., Any], answered: Route, message: str
) -> None:
    platform = Platform({("POST", "/api/clusters/hpc1/account/"): answered})

    code, out, err = pw(platform, "cluster", "connect", "hpc1", "--user", "alice")

    assert (code, out) == (1, "")
    assert err == message + "\n"
