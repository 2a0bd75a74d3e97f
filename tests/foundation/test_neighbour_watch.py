"""The neighbour's process watcher (tests/watched.py runs it through the e2e, sessions, relay and
agent tests) catches what it is there to catch: secrets planted where another Unix user reads
them, found by value, by hash, and as an X cookie read from a desktop's authority file."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.watcher import SecretBook, Watcher, gather_platform_secrets, x_cookies
from tests.watched import TESTS, WATCHED
from workers_app.models import ApiKey


@pytest.fixture
def watcher(ssh_target: SshTarget, tmp_path: Path) -> Iterator[Watcher]:
    running = Watcher(sorted(ssh_target.accounts)[-1], tmp_path / "processes.jsonl").start()
    yield running
    running.stop()


def uid_of(user: str) -> int:
    return int(subprocess.check_output(["id", "-u", user]))


def as_user(user: str, *argv: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        ["runuser", "-u", user, "--", *argv],
        env={**os.environ, **(env or {})},
        check=True,
        timeout=30,
    )


def test_an_api_key_on_the_owners_command_line_is_found_by_its_hash(
    db: None, user: User, ssh_target: SshTarget, watcher: Watcher
) -> None:
    # Given an API key the platform keeps only as a hash
    _, key = ApiKey.issue(user)
    gather_platform_secrets(watcher.book)
    owner = sorted(ssh_target.accounts)[0]
    start = watcher.mark()
    # When the owner's process carries it on its command line (planted)
    as_user(owner, "sh", "-c", "sleep 0.3", "sh", f"--token={key}")
    end = watcher.mark()
    # Then the neighbour read it there, and the watcher names it
    leaks = watcher.leaks_between(start, end)
    print("\n".join(str(leak) for leak in leaks))
    # (runuser's own command line, root's, shows it as well as the owner's shell)
    assert {leak.kind for leak in leaks} == {"an API key (by its hash)"}
    assert uid_of(owner) in {leak.uid for leak in leaks}
    assert all(leak.where == "argv" and key not in leak.shown for leak in leaks)


def test_the_owners_environment_is_refused_to_the_neighbour_and_a_readable_one_is_checked(
    ssh_target: SshTarget, watcher: Watcher
) -> None:
    owner = sorted(ssh_target.accounts)[0]
    secret = "planted-" + os.urandom(12).hex()
    watcher.book.add(secret, "a planted password")
    start = watcher.mark()
    as_user(owner, "sh", "-c", "sleep 0.3", env={"PLANTED": secret})
    end = watcher.mark()
    records = [r for r in watcher.records(start, end) if r.get("argv") == ["sh", "-c", "sleep 0.3"]]
    # The kernel refuses another user's environment to the neighbour...
    assert [r["environ"] for r in records] == ["refused"]
    assert watcher.leaks_between(start, end) == []
    # ...and one it let the neighbour read (a process that kept another's environment when it
    # became the neighbour's, say) would be checked.
    readable = {**records[0], "environ": ["HOME=/home/x", f"PLANTED={secret}"]}
    leaks = watcher.book.leaks(readable)
    print("\n".join(str(leak) for leak in leaks))
    assert [(leak.kind, leak.where) for leak in leaks] == [("a planted password", "environ")]


# The planted cookie is in /tmp, where every watcher of a parallel run reads cookies from.
@pytest.mark.serial
def test_a_desktops_x_cookie_is_read_from_its_authority_file_and_found_on_a_command_line(
    tmp_path: Path, ssh_target: SshTarget, watcher: Watcher
) -> None:
    xauth = shutil.which("xauth")
    assert xauth, "xauth is installed by scripts/session-tools.sh"
    folder = Path(f"/tmp/activate-session-watchtest{os.getpid()}")
    folder.mkdir(mode=0o700)
    try:
        cookie = os.urandom(16).hex()
        subprocess.run(
            [xauth, "-q", "-f", str(folder / "Xauthority"), "source", "-"],
            input=f"add :77 MIT-MAGIC-COOKIE-1 {cookie}\n".encode(),
            check=True,
        )
        assert list(x_cookies([folder / "Xauthority"])) == [cookie]
        # the watcher's scan (as root, every 0.2 s) learns it
        deadline = time.monotonic() + 5
        while cookie not in watcher.book.known and time.monotonic() < deadline:
            time.sleep(0.1)
        start = watcher.mark()
        as_user(sorted(ssh_target.accounts)[0], "sh", "-c", "sleep 0.3", "sh", cookie)
        end = watcher.mark()
        leaks = watcher.leaks_between(start, end)
        print("\n".join(str(leak) for leak in leaks))
        assert {leak.kind for leak in leaks} == {"an X cookie"}
    finally:
        shutil.rmtree(folder)


def test_short_or_absent_values_are_never_counted_as_secrets() -> None:
    book = SecretBook()
    book.add("short", "too short to tell")
    book.add_hash("not-a-digest", "nothing")
    assert book.known == {} and book.hashes == {}
    assert book.leaks({"pid": 1, "uid": 0, "argv": ["short", "x" * 40]}) == []


def test_a_login_session_key_is_found_by_what_the_session_table_keeps_of_it(db: None) -> None:
    # Given a browser login whose key the table keeps only as a truncated hash
    from django.contrib.sessions.models import Session as PlatformSession

    from core.login_sessions import SessionStore

    store = SessionStore()
    store["seen"] = True
    store.save()
    key = store.session_key
    assert key and not PlatformSession.objects.filter(session_key=key).exists()
    book = SecretBook()
    gather_platform_secrets(book)
    # When the key shows on a command line, Then the book names it; a made-up key it does not
    (leak,) = book.leaks({"pid": 7, "uid": 1001, "argv": ["curl", "-b", f"sessionid={key}"]})
    assert leak.kind == "a platform session key (by its hash)" and key not in leak.shown
    made_up = "sessionid=" + "q" * 32
    assert book.leaks({"pid": 7, "uid": 1001, "argv": ["curl", "-b", made_up]}) == []


def test_every_folder_the_neighbour_watches_exists_and_holds_tests() -> None:
    # A folder renamed under the watch would leave its tests unwatched without a word.
    for folder in WATCHED:
        assert list((TESTS / folder).rglob("test_*.py")), f"tests/{folder} holds no test"
