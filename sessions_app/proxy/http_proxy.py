"""Plain HTTP requests under /s/<id>/, forwarded to the session's program one channel each."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import quote

import h11
from django.conf import settings
from django.shortcuts import resolve_url

from activate.websocket_auth import Scope
from sessions_app.proxy.target import (
    PATH,
    Target,
    cookie_header,
    find_target,
    open_pipe,
    program_check,
)
from sessions_app.services import REASON_PROGRAM_ENDED
from sessions_app.statuses import SessionStatus
from workers_app.transport.errors import SSHError

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
}
# Never sent to a node: the platform's credentials.
STRIPPED = {b"authorization", b"cookie"}
MAX_BODY = 64 * 1024 * 1024


class SessionHttpProxy:
    """Plain HTTP requests under /s/<id>/ (the auth middleware has set scope["user"])."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        match = PATH.match(scope["path"])
        if match is None:
            await _plain(send, 404, "Not found.")
            return
        public_id, rest = match["public_id"], match["rest"] or ""
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            login = f"{resolve_url(settings.LOGIN_URL)}?next={quote(scope['path'])}"
            await _plain(send, 302, "Log in first.", [(b"location", login.encode())])
            return
        target = await find_target(user, public_id)
        if target is None:
            await _plain(send, 404, "Not found.")
            return
        session = target.session
        if not rest:
            await _plain(send, 302, "", [(b"location", session.url_path.encode())])
            return
        if rest == "/":
            page = target.kind.page(session)
            if page is not None:
                await _page(send, page)
                return
            if target.kind.landing_path:
                landing = session.url_path + target.kind.landing_path
                await _plain(send, 302, "", [(b"location", landing.encode())])
                return
        unsafe = scope["method"] not in ("GET", "HEAD", "OPTIONS")
        if unsafe and scope.get("auth") == "session" and scope.get("origin_refused"):
            if any(k.lower() == b"origin" for k, _ in scope.get("headers", [])):
                await _plain(send, 403, "This page's origin may not use the session.")
                return
        if session.status != SessionStatus.RUNNING:
            message = f"This session is {session.status}. {session.status_reason}".strip()
            await _plain(send, 503, message, [(b"retry-after", b"2")])
            return
        body = await _read_body(receive)
        if body is None:
            await _plain(send, 413, "The request body is too large.")
            return
        try:
            reader, writer = await open_pipe(target)
        except SSHError as exc:
            if await program_check(session.pk):
                await _plain(send, 502, f"The session's node cannot be reached: {exc}")
            else:
                await _plain(send, 503, f"This session has ended. {REASON_PROGRAM_ENDED}.")
            return
        try:
            await _forward(scope, target, rest, body, reader, writer, send)
        finally:
            writer.close()


async def _page(send: Any, page: str) -> None:
    body = page.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Any) -> bytes | None:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return body
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            return None
        if not message.get("more_body"):
            return body


async def _forward(
    scope: Scope,
    target: Target,
    rest: str,
    body: bytes,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    send: Any,
) -> None:
    query = scope["query_string"].decode("latin-1")
    path = target.path_on_node(rest) + ("?" + query if query else "")
    host, port = target.address
    headers: list[tuple[bytes, bytes]] = [(b"host", _browser_host(scope, host, port))]
    raw_cookies = []
    for name, value in scope.get("headers", []):
        lower = name.lower()
        if lower == b"cookie":
            raw_cookies.append(value)
        elif lower not in HOP_BY_HOP and lower not in STRIPPED:
            headers.append((name, value))
    cookies = cookie_header(raw_cookies, target.login.cookies)
    if cookies:
        headers.append((b"cookie", cookies.encode("latin-1")))
    headers += target.login.headers
    headers += [(b"connection", b"close"), (b"content-length", str(len(body)).encode())]
    client = h11.Connection(h11.CLIENT)
    writer.write(client.send(h11.Request(method=scope["method"], target=path, headers=headers)))
    if body:
        writer.write(client.send(h11.Data(data=body)))
    writer.write(client.send(h11.EndOfMessage()))
    await writer.drain()
    started = False
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(await reader.read(65536))
            continue
        if isinstance(event, h11.Response):
            started = True
            await send(
                {
                    "type": "http.response.start",
                    "status": event.status_code,
                    "headers": _response_headers(target, event.headers),
                }
            )
        elif isinstance(event, h11.Data):
            await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)) or event is h11.PAUSED:
            break
    if not started:
        await _plain(send, 502, "The session's program closed the connection.")
        return
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _browser_host(scope: Scope, host: str, port: int) -> bytes:
    # The program sees the browser's Host, so its same-origin checks (code-server compares
    # Origin and Host on WebSockets) hold for the address the browser actually uses.
    for name, value in scope.get("headers", []):
        if name.lower() == b"host":
            return bytes(value)
    return f"{host}:{port}".encode()


def _response_headers(target: Target, headers: Any) -> list[tuple[bytes, bytes]]:
    kept: list[tuple[bytes, bytes]] = []
    # A program that serves under /s/<id>/ itself says its own paths; others' are put under it.
    prefix = b"" if target.kind.keeps_prefix else target.session.url_path.encode()
    for name, value in headers:
        lower = bytes(name).lower()
        if lower in HOP_BY_HOP - {b"content-length"}:
            continue
        value = bytes(value)
        if prefix and lower == b"location" and value.startswith(b"/"):
            if not value.startswith(b"//"):
                value = prefix + value[1:]
        if prefix and lower == b"set-cookie":
            value = re.sub(rb"(?i)path=/[^;]*", b"Path=" + prefix.rstrip(b"/"), value)
        kept.append((lower, value))
    return kept


async def _plain(
    send: Any, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
