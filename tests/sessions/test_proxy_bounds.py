"""The session proxy bounded, against a real program: bodies stream to it as they arrive, one
user's requests and WebSockets are counted, messages have a size, and what crosses is filtered
both ways (no platform cookie reaches the program, no cookie of the program's leaves the
session's path).

The program is a real HTTP and WebSocket server on this machine, reached by the whole ASGI
application (API key, session lookup, proxy) over plain TCP where a deployment uses the owner's
SSH channel: what is proved here is the proxy's, not the tunnel's (tests/sessions/*_e2e.py and
`python -m bench proxy` go through real SSH to real programs).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth.models import AbstractUser
from websockets.sync.server import ServerConnection, serve

from activate.asgi import application
from sessions_app.models import Session
from sessions_app.proxy import limits
from sessions_app.proxy.headers import set_cookie
from sessions_app.proxy.target import Target, cookie_header
from sessions_app.statuses import SessionStatus
from tests.sessions.test_session_rules import connected_worker
from workers_app.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
TIMEOUT = 10


@dataclass
class Program:
    """A session's program: records what reached it, answers by path."""

    port: int
    seen: list[dict[str, Any]] = field(default_factory=list)
    first_body_chunk: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    held: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def headers_of(self, path_end: str) -> dict[bytes, list[bytes]]:
        request = next(r for r in self.seen if r["path"].endswith(path_end))
        found: dict[bytes, list[bytes]] = {}
        for name, value in request["headers"]:
            found.setdefault(bytes(name), []).append(bytes(value))
        return found


def _serve_one(program: Program, sock: socket.socket) -> None:
    conn = h11.Connection(h11.SERVER)
    request: dict[str, Any] = {}
    received = 0
    with sock:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = sock.recv(65536)
                conn.receive_data(data)
                if not data:
                    return
            elif isinstance(event, h11.Request):
                request = {"path": event.target.decode(), "headers": list(event.headers)}
                program.seen.append(request)
            elif isinstance(event, h11.Data):
                received += len(event.data)
                program.first_body_chunk.set()
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return
        path = request["path"]
        prefix = "/s/" + path.split("/")[2] + "/" if path.startswith("/s/") else "/"
        headers: list[tuple[str, str]] = [("content-type", "text/plain")]
        body = f"{received}".encode()
        if path.endswith("/cookies"):
            cookie = dict(request["headers"]).get(b"cookie", b"")
            body = bytes(cookie)
        elif path.endswith("/hostile"):
            headers += [
                ("set-cookie", "theme=dark; Path=/; Domain=127.0.0.1; HttpOnly"),
                ("set-cookie", "sessionid=planted; Path=/"),
                ("set-cookie", f"=sessionid=nameless; Path={prefix}"),
                ("set-cookie", f"kept=1; Path={prefix}lab; SameSite=Lax"),
                ("service-worker-allowed", "/"),
                ("clear-site-data", '"cookies"'),
            ]
        elif path.endswith("/hold"):
            program.held.release()
            program.release.wait(TIMEOUT)
        headers.append(("content-length", str(len(body))))
        out = conn.send(h11.Response(status_code=200, headers=headers))
        out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        with contextlib.suppress(OSError):
            sock.sendall(out)


def running_session(owner: AbstractUser, kind: str, port: int) -> Session:
    session = Session(
        name=f"{kind}_1",
        owner=owner,
        session_type=kind,
        worker=connected_worker(owner),
        status=SessionStatus.RUNNING,
        node_host="127.0.0.1",
        node_port=port,
    )
    session.set_secret("s3cret")
    session.save()
    return session


@pytest.fixture
def direct_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain TCP to the program where a deployment opens the owner's SSH channel."""

    async def pipe(
        target: Target, route: str = "http"
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(*target.address)

    monkeypatch.setattr("sessions_app.proxy.http_proxy.open_pipe", pipe)
    monkeypatch.setattr("sessions_app.proxy.websocket_proxy.open_pipe", pipe)


@pytest.fixture
def program(direct_pipe: None) -> Iterator[Program]:
    listener = socket.create_server(("127.0.0.1", 0))
    program = Program(port=listener.getsockname()[1])
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_serve_one, args=(program, sock), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield program
    stop.set()
    program.release.set()
    listener.close()


def key_headers(owner: AbstractUser) -> list[tuple[bytes, bytes]]:
    _, key = ApiKey.issue(owner)
    return [(b"authorization", f"Bearer {key}".encode()), (b"host", b"testserver")]


def http_scope(path: str, headers: list[tuple[bytes, bytes]], method: str = "GET") -> Any:
    return {
        "type": "http",
        "path": path,
        "headers": headers,
        "query_string": b"",
        "method": method,
        "http_version": "1.1",
        "scheme": "http",
    }


async def answer_of(communicator: ApplicationCommunicator) -> tuple[int, Any, bytes]:
    start = await communicator.receive_output(TIMEOUT)
    body = b""
    while True:
        message = await communicator.receive_output(TIMEOUT)
        body += message.get("body", b"")
        if not message.get("more_body"):
            return start["status"], start["headers"], body


def get(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, Any, bytes]:
    async def run() -> tuple[int, Any, bytes]:
        communicator = ApplicationCommunicator(application, http_scope(path, headers))
        await communicator.send_input({"type": "http.request", "body": b""})
        return await answer_of(communicator)

    return async_to_sync(run)()


def test_a_cookie_value_in_quotes_cannot_fold_the_platforms_session_into_the_programs_cookie(
    user: AbstractUser, program: Program
) -> None:
    # Given: the program set a="x (its path under the session's sorts it first) and zz=y", so
    # the browser's Cookie header wraps the platform's own cookies inside one quoted value.
    folded = b'a="x; sessionid=PLATFORM-SESSION; csrftoken=PLATFORM-CSRF; zz=y"'
    assert cookie_header([folded], {}) == 'a="x; zz=y"'
    session = running_session(user, "desktop", program.port)

    # When: the browser asks the program for a page with that header.
    status, _, body = get(
        f"/s/{session.public_id}/cookies", [*key_headers(user), (b"cookie", folded)]
    )

    # Then: the program gets its own cookies, byte for byte, and nothing of the platform's.
    assert status == 200
    assert body == b'a="x; zz=y"'
    assert b"PLATFORM" not in b"".join(v for _, v in program.seen[-1]["headers"])


def test_a_programs_cookies_stay_under_its_sessions_path_and_it_cannot_widen_its_reach(
    user: AbstractUser, program: Program
) -> None:
    # Given: a program that serves under /s/<id>/ itself (Jupyter) answering with cookies for
    # the whole site, one named as the platform's session, and headers about the whole origin.
    session = running_session(user, "jupyter", program.port)
    prefix = session.url_path

    # When: the browser asks it for a page.
    status, headers, _ = get(f"/s/{session.public_id}/hostile", key_headers(user))

    # Then: only its own cookies, kept to its path and this host, and none of those headers.
    assert status == 200
    cookies = [v.decode() for k, v in headers if k == b"set-cookie"]
    assert cookies == [
        f"theme=dark; HttpOnly; Path={prefix.rstrip('/')}",
        f"kept=1; SameSite=Lax; Path={prefix}lab",
    ]
    names = {k for k, _ in headers}
    assert b"service-worker-allowed" not in names and b"clear-site-data" not in names


def test_a_program_served_at_its_root_has_its_cookie_paths_put_under_the_session() -> None:
    prefix = "/s/abc/"
    assert (
        set_cookie(b"t=1; path=/static", prefix, keeps_prefix=False) == b"t=1; Path=/s/abc/static"
    )
    assert set_cookie(b"t=1; Path=/", prefix, keeps_prefix=False) == b"t=1; Path=/s/abc"
    assert set_cookie(b"t=1", prefix, keeps_prefix=False) == b"t=1"
    assert set_cookie(b"csrftoken=x; Path=/s/abc/", prefix, keeps_prefix=True) is None
    assert set_cookie(b"t=1; Path=/s/abcd", prefix, keeps_prefix=True) == b"t=1; Path=/s/abc"


def test_a_request_body_reaches_the_program_while_the_browser_is_still_sending_it(
    user: AbstractUser, program: Program
) -> None:
    session = running_session(user, "desktop", program.port)
    chunk = b"x" * 65536
    headers = [*key_headers(user), (b"content-length", str(3 * len(chunk)).encode())]

    async def run() -> tuple[bool, tuple[int, Any, bytes]]:
        scope = http_scope(f"/s/{session.public_id}/upload", headers, method="PUT")
        communicator = ApplicationCommunicator(application, scope)
        # When: the browser has sent the first of three chunks.
        await communicator.send_input({"type": "http.request", "body": chunk, "more_body": True})
        arrived = await asyncio.to_thread(program.first_body_chunk.wait, TIMEOUT)
        # Then: the program already has it, before the rest was sent.
        for more in (True, False):
            message = {"type": "http.request", "body": chunk, "more_body": more}
            await communicator.send_input(message)
        return arrived, await answer_of(communicator)

    arrived, (status, _, body) = async_to_sync(run)()
    assert arrived, "the proxy held the body back until the browser had sent all of it"
    assert (status, body) == (200, str(3 * len(chunk)).encode())


def test_a_body_declared_over_the_limit_is_refused_before_the_program_is_reached(
    user: AbstractUser, program: Program, settings: Any
) -> None:
    settings.ACTIVATE_PROXY_MAX_BODY = 4096
    session = running_session(user, "desktop", program.port)
    headers = [*key_headers(user), (b"content-length", b"4097")]

    async def run() -> tuple[int, Any, bytes]:
        scope = http_scope(f"/s/{session.public_id}/upload", headers, method="POST")
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": b"y" * 4097})
        return await answer_of(communicator)

    status, _, body = async_to_sync(run)()
    assert (status, body) == (413, b"The request body is too large.")
    assert program.seen == []


def test_a_users_requests_at_once_are_bounded_and_each_finished_one_frees_its_place(
    user: AbstractUser, other_user: AbstractUser, program: Program, settings: Any
) -> None:
    # Given: at most two proxied requests at once per user, and two of alice's held open.
    settings.ACTIVATE_PROXY_MAX_CONNECTIONS_PER_USER = 2
    session = running_session(user, "desktop", program.port)
    theirs = running_session(other_user, "desktop", program.port)
    mine, bobs = key_headers(user), key_headers(other_user)

    async def run() -> list[tuple[int, Any, bytes]]:
        held = []
        for _ in range(2):
            communicator = ApplicationCommunicator(
                application, http_scope(f"/s/{session.public_id}/hold", mine)
            )
            await communicator.send_input({"type": "http.request", "body": b""})
            held.append(communicator)
        for _ in range(2):
            assert await asyncio.to_thread(program.held.acquire, True, TIMEOUT)
        # When: she asks for a third, and bob for one of his.
        third = ApplicationCommunicator(application, http_scope(f"/s/{session.public_id}/x", mine))
        await third.send_input({"type": "http.request", "body": b""})
        refused = await answer_of(third)
        bob = ApplicationCommunicator(application, http_scope(f"/s/{theirs.public_id}/x", bobs))
        await bob.send_input({"type": "http.request", "body": b""})
        bobs_answer = await answer_of(bob)
        # And then: once hers finish, she gets through again.
        program.release.set()
        done = [await answer_of(c) for c in held]
        after = ApplicationCommunicator(application, http_scope(f"/s/{session.public_id}/x", mine))
        await after.send_input({"type": "http.request", "body": b""})
        return [refused, bobs_answer, *done, await answer_of(after)]

    refused, bobs_answer, *done, after = async_to_sync(run)()
    # Then: hers is refused plainly, bob's is not.
    assert refused[0] == 429 and refused[2].decode() == limits.TOO_MANY
    assert bobs_answer[0] == 200
    assert [d[0] for d in done] == [200, 200] and after[0] == 200
    assert limits.requests.held(user.pk) == 0


@pytest.fixture
def ws_program(direct_pipe: None) -> Iterator[tuple[int, list[int]]]:
    """A WebSocket program: says "hello", answers "big" with a message of 2048 bytes and
    records the size of every message it gets."""
    got: list[int] = []

    def handler(connection: ServerConnection) -> None:
        connection.send("hello")
        for message in connection:
            got.append(len(message))
            if message == "big":
                connection.send(b"z" * 2048)

    with serve(handler, "127.0.0.1", 0, max_size=None) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield server.socket.getsockname()[1], got
        server.shutdown()


async def ws_open(path: str, headers: list[tuple[bytes, bytes]]) -> ApplicationCommunicator:
    scope = {
        "type": "websocket",
        "path": path,
        "headers": headers,
        "query_string": b"",
        "subprotocols": [],
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "websocket.connect"})
    assert (await communicator.receive_output(TIMEOUT))["type"] == "websocket.accept"
    return communicator


def test_websocket_messages_over_the_size_limit_close_the_socket_either_way(
    user: AbstractUser, ws_program: tuple[int, list[int]], settings: Any
) -> None:
    settings.ACTIVATE_PROXY_MAX_MESSAGE = 1024
    port, got = ws_program
    session = running_session(user, "vscode", port)
    headers = key_headers(user)

    async def run() -> tuple[Any, Any, Any]:
        # From the program: it sends 2048 bytes.
        socket_ = await ws_open(f"/s/{session.public_id}/events", headers)
        hello = await socket_.receive_output(TIMEOUT)
        await socket_.send_input({"type": "websocket.receive", "text": "big"})
        from_program = await socket_.receive_output(TIMEOUT)
        # From the browser: it sends 2048 bytes.
        other = await ws_open(f"/s/{session.public_id}/events", headers)
        await other.receive_output(TIMEOUT)
        await other.send_input({"type": "websocket.receive", "bytes": b"q" * 2048})
        from_browser = await other.receive_output(TIMEOUT)
        for communicator in (socket_, other):
            await communicator.send_input({"type": "websocket.disconnect", "code": 1009})
            await communicator.wait(TIMEOUT)
        return hello, from_program, from_browser

    hello, from_program, from_browser = async_to_sync(run)()
    assert (hello["type"], hello.get("text")) == ("websocket.send", "hello")
    assert (from_program["type"], from_program.get("code")) == ("websocket.close", 1009)
    assert (from_browser["type"], from_browser.get("code")) == ("websocket.close", 1009)
    assert 2048 not in got


def test_a_users_open_websockets_are_bounded_and_a_closed_one_frees_its_place(
    user: AbstractUser, ws_program: tuple[int, list[int]], settings: Any
) -> None:
    settings.ACTIVATE_PROXY_MAX_WEBSOCKETS_PER_USER = 1
    port, _ = ws_program
    session = running_session(user, "vscode", port)
    headers = key_headers(user)
    path = f"/s/{session.public_id}/events"

    async def run() -> tuple[Any, Any]:
        first = await ws_open(path, headers)
        await first.receive_output(TIMEOUT)
        second = await ws_open(path, headers)
        refused = await second.receive_output(TIMEOUT)
        await second.send_input({"type": "websocket.disconnect", "code": 4429})
        await second.wait(TIMEOUT)
        await first.send_input({"type": "websocket.disconnect", "code": 1000})
        await first.wait(TIMEOUT)
        third = await ws_open(path, headers)
        welcome = await third.receive_output(TIMEOUT)
        await third.send_input({"type": "websocket.disconnect", "code": 1000})
        await third.wait(TIMEOUT)
        return refused, welcome

    refused, welcome = async_to_sync(run)()
    assert (refused["type"], refused.get("code")) == ("websocket.close", 4429)
    assert refused.get("reason") == limits.TOO_MANY
    assert (welcome["type"], welcome.get("text")) == ("websocket.send", "hello")
    assert limits.websockets.held(user.pk) == 0
