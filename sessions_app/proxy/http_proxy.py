"""Plain HTTP requests under /s/<id>/, forwarded to the session's program one channel each.

Bodies stream both ways as they come (nothing holds a whole body on the event loop), within the
user's share of the proxy (limits) and what may cross (headers)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import h11
from django.conf import settings
from django.shortcuts import resolve_url

from core.transport.errors import SSHError
from core.websocket_auth import Scope
from sessions_app import metrics
from sessions_app.proxy import headers as headers_for
from sessions_app.proxy import limits
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


class SessionHttpProxy:
    """Plain HTTP requests under /s/<id>/ (the auth middleware has set scope["user"])."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        match = PATH.match(scope["path"])
        if match is None:
            await plain(send, 404, "Not found.")
            return
        public_id, rest = match["public_id"], match["rest"] or ""
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            login = f"{resolve_url(settings.LOGIN_URL)}?next={quote(scope['path'])}"
            await plain(send, 302, "Log in first.", [(b"location", login.encode())])
            return
        if not limits.requests.take(user.pk):
            await plain(send, 429, limits.TOO_MANY, [(b"retry-after", b"1")])
            return
        try:
            await self._serve(scope, receive, send, user, public_id, rest)
        finally:
            limits.requests.give_back(user.pk)

    async def _serve(
        self, scope: Scope, receive: Any, send: Any, user: Any, public_id: str, rest: str
    ) -> None:
        target = await find_target(user, public_id)
        if target is None:
            await plain(send, 404, "Not found.")
            return
        session = target.session
        if not rest:
            await plain(send, 302, "", [(b"location", session.url_path.encode())])
            return
        if rest == "/":
            page = target.kind.page(session)
            if page is not None:
                await _page(send, page)
                return
            if target.kind.landing_path:
                landing = session.url_path + target.kind.landing_path
                await plain(send, 302, "", [(b"location", landing.encode())])
                return
        unsafe = scope["method"] not in ("GET", "HEAD", "OPTIONS")
        if unsafe and scope.get("auth") == "session" and scope.get("origin_refused"):
            if any(k.lower() == b"origin" for k, _ in scope.get("headers", [])):
                await plain(send, 403, "This page's origin may not use the session.")
                return
        if session.status != SessionStatus.RUNNING:
            message = f"This session is {session.status}. {session.status_reason}".strip()
            await plain(send, 503, message, [(b"retry-after", b"2")])
            return
        length = _declared_length(scope)
        if length is not None and length > settings.ACTIVATE_PROXY_MAX_BODY:
            await plain(send, 413, "The request body is too large.")
            return
        try:
            reader, writer = await open_pipe(target)
        except SSHError as exc:
            if await program_check(session.pk):
                metrics.proxy_failed(target.kind.name, "unreachable")
                await plain(send, 502, f"The session's node cannot be reached: {exc}")
            else:
                metrics.proxy_failed(target.kind.name, "program_ended")
                await plain(send, 503, f"This session has ended. {REASON_PROGRAM_ENDED}.")
            return
        try:
            await _forward(scope, target, rest, receive, reader, writer, send)
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


class _BodyTooLarge(Exception):
    pass


async def _upload(
    receive: Any, client: h11.Connection, writer: asyncio.StreamWriter, limit: int, target: Target
) -> None:
    """The browser's body to the program chunk by chunk as it arrives, never held whole."""
    sent = 0
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionAbortedError("the browser went away")
            chunk = message.get("body", b"")
            sent += len(chunk)
            if sent > limit:
                raise _BodyTooLarge
            if chunk:
                target.note_traffic()
                metrics.to_node(target.kind.name, len(chunk))
                writer.write(client.send(h11.Data(data=chunk)))
                await writer.drain()
            if not message.get("more_body"):
                break
        writer.write(client.send(h11.EndOfMessage()))
        await writer.drain()
    except (_BodyTooLarge, ConnectionAbortedError):
        # Abandoned: the program sees the request cut short, the response side the end.
        writer.close()
        raise


async def _forward(
    scope: Scope,
    target: Target,
    rest: str,
    receive: Any,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    send: Any,
) -> None:
    query = scope["query_string"].decode("latin-1")
    path = target.path_on_node(rest) + ("?" + query if query else "")
    host, port = target.address
    browser = scope.get("headers", [])
    headers: list[tuple[bytes, bytes]] = [(b"host", _browser_host(scope, host, port))]
    headers += headers_for.to_program(browser)
    raw_cookies = [value for name, value in browser if name.lower() == b"cookie"]
    cookies = cookie_header(raw_cookies, target.login.cookies)
    if cookies:
        headers.append((b"cookie", cookies.encode("latin-1")))
    headers += target.login.headers
    headers.append((b"connection", b"close"))
    length = _declared_length(scope)
    if length is None:
        headers.append((b"transfer-encoding", b"chunked"))
    else:
        headers.append((b"content-length", str(length).encode()))
    client = h11.Connection(h11.CLIENT)
    writer.write(client.send(h11.Request(method=scope["method"], target=path, headers=headers)))
    upload = asyncio.create_task(
        _upload(receive, client, writer, settings.ACTIVATE_PROXY_MAX_BODY, target)
    )
    try:
        started = await _relay_response(target, client, reader, send)
    finally:
        upload.cancel()
        await asyncio.gather(upload, return_exceptions=True)
    if started:
        return
    if upload.done() and not upload.cancelled() and isinstance(upload.exception(), _BodyTooLarge):
        await plain(send, 413, "The request body is too large.")
    else:
        metrics.proxy_failed(target.kind.name, "program_closed")
        await plain(send, 502, "The session's program closed the connection.")


async def _relay_response(
    target: Target, client: h11.Connection, reader: asyncio.StreamReader, send: Any
) -> bool:
    """The program's response to the browser as it comes; whether it had begun."""
    started = False
    prefix = target.session.url_path
    try:
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                client.receive_data(data)
                target.note_traffic()
                metrics.to_browser(target.kind.name, len(data))
                continue
            if isinstance(event, h11.Response):
                started = True
                kept = headers_for.to_browser(
                    event.headers, prefix, keeps_prefix=target.kind.keeps_prefix
                )
                await send(
                    {"type": "http.response.start", "status": event.status_code, "headers": kept}
                )
            elif isinstance(event, h11.Data):
                body = {"type": "http.response.body", "body": bytes(event.data), "more_body": True}
                await send(body)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
            elif event is h11.PAUSED:
                break
    except (h11.RemoteProtocolError, ConnectionError, OSError):
        pass
    if started:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return started


def _declared_length(scope: Scope) -> int | None:
    """The body's length as the browser declared it (0 without one), None if chunked."""
    for name, value in scope.get("headers", []):
        lower = name.lower()
        if lower == b"transfer-encoding":
            return None
        if lower == b"content-length":
            return int(value)
    return 0


def _browser_host(scope: Scope, host: str, port: int) -> bytes:
    # The program sees the browser's Host, so its same-origin checks (code-server compares
    # Origin and Host on WebSockets) hold for the address the browser actually uses.
    for name, value in scope.get("headers", []):
        if name.lower() == b"host":
            return bytes(value)
    return f"{host}:{port}".encode()


async def plain(
    send: Any, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """The platform's own short answer (never the program's): not cached, no Referer onward."""
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                (b"referrer-policy", b"no-referrer"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
