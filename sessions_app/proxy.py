"""The session proxy: the browser reaches a session's program at /s/<id>/ through the platform.

HTTP and WebSocket traffic for a session's URL goes to its node's port over a ``direct-tcpip``
channel of the owner's SSH connection to the login host, so the browser never needs to reach
compute nodes. Only the owner gets through; anyone else gets 404 before the cluster is asked.
The platform's own cookies and Authorization never reach the node; the program's login (a
code-server session cookie) is filled in here. Each request and socket opens a channel of its
own, so a restarted web server simply serves the next one (noVNC reconnects by itself).
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote, urlencode

import h11
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from activate.websocket_auth import Scope
from sessions_app.launch import COOKIE_NAME
from sessions_app.models import Session, SessionType
from sessions_app.services import REASON_PROGRAM_ENDED, check_program, find_session
from sessions_app.statuses import SessionStatus
from workers_app.connections import open_tunnel
from workers_app.transport.channels import ChannelPipe
from workers_app.transport.errors import SSHError

log = logging.getLogger(__name__)

PREFIX = "/s/"
PATH = re.compile(r"^/s/(?P<public_id>[a-z0-9]{1,16})(?P<rest>/.*)?$")
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
SESSION_NOT_FOUND = 4404
SESSION_UNAVAILABLE = 4503


def _platform_cookies() -> set[str]:
    return {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}


def _cookie_header(raw: list[bytes], login_cookie: str) -> str:
    """The browser's cookies minus the platform's own, plus the program's login."""
    jar: SimpleCookie = SimpleCookie()
    for value in raw:
        try:
            jar.load(value.decode("latin-1"))
        except Exception:  # noqa: S112 - a malformed cookie is dropped, as browsers do
            continue
    kept = [f"{k}={m.value}" for k, m in jar.items() if k not in _platform_cookies()]
    if login_cookie:
        kept = [c for c in kept if not c.startswith(COOKIE_NAME + "=")]
        kept.append(f"{COOKIE_NAME}={login_cookie}")
    return "; ".join(kept)


def _target(session: Session) -> tuple[str, int]:
    assert session.node_port is not None
    return session.node_host, session.node_port


# It asks the node over SSH: off the thread the server's database calls share.
program_check = database_sync_to_async(check_program, thread_sensitive=False)


@database_sync_to_async
def _lookup(user: Any, public_id: str) -> tuple[Session | None, str]:
    if user is None or not user.is_authenticated:
        return None, ""
    session = find_session(user, public_id)
    if session is None:
        return None, ""
    # Read here, off the event loop: the proxy must not touch the database later.
    cookie = session.login_cookie() if session.status == SessionStatus.RUNNING else ""
    _ = session.worker.cluster, session.worker.account
    return session, cookie


async def _open_pipe(session: Session) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = _target(session)
    log.info("session %s: tunnel to %s:%s", session.public_id, host, port)
    connection, channel = await asyncio.to_thread(open_tunnel, session.worker, host, port)
    return await ChannelPipe(channel, connection.tunnel_closed).open()


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
            login = f"{settings.LOGIN_URL}?next={quote(scope['path'])}"
            await _plain(send, 302, "Log in first.", [(b"location", login.encode())])
            return
        session, cookie = await _lookup(user, public_id)
        if session is None:
            await _plain(send, 404, "Not found.")
            return
        if not rest:
            await _plain(send, 302, "", [(b"location", session.url_path.encode())])
            return
        if rest == "/" and session.session_type == SessionType.DESKTOP:
            await _desktop_page(send, session)
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
            reader, writer = await _open_pipe(session)
        except SSHError as exc:
            if await program_check(session.pk):
                await _plain(send, 502, f"The session's node cannot be reached: {exc}")
            else:
                await _plain(send, 503, f"This session has ended. {REASON_PROGRAM_ENDED}.")
            return
        try:
            await _forward(scope, session, cookie, rest, body, reader, writer, send)
        finally:
            writer.close()


# The desktop's page: noVNC in a frame, its password and WebSocket path filled in. noVNC retries a
# dropped connection once; while the platform restarts that is not enough, so this page watches
# the frame and, once noVNC has given up and the platform answers again, loads it afresh.
DESKTOP_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>html,body,iframe{{margin:0;border:0;width:100%;height:100%;overflow:hidden;
background:#313131}}</style></head>
<body><iframe id="desktop" src="{src}" allow="clipboard-read; clipboard-write"></iframe>
<script>
const frame = document.getElementById("desktop");
const busy = ["noVNC_connecting", "noVNC_connected", "noVNC_disconnecting", "noVNC_reconnecting"];
let idle = 0;
function gaveUp() {{
  let doc;
  try {{ doc = frame.contentDocument; }} catch (e) {{ return true; }}
  if (!doc || doc.readyState !== "complete" || !doc.getElementById("noVNC_status")) return true;
  return !busy.some((name) => doc.documentElement.classList.contains(name));
}}
setInterval(async () => {{
  idle = gaveUp() ? idle + 1 : 0;
  if (idle < 2) return;
  try {{
    const answer = await fetch("vnc.html", {{method: "HEAD", cache: "no-store"}});
    if (answer.ok) {{ idle = 0; frame.src = frame.src; }}
  }} catch (e) {{ /* the platform is still away: try again */ }}
}}, 1000);
</script></body></html>
"""


def _novnc_src(session: Session) -> str:
    base = session.url_path
    query = urlencode(
        {
            "autoconnect": "1",
            "reconnect": "1",
            "reconnect_delay": "1000",
            "resize": "remote",
            "path": base.lstrip("/") + "websockify",
            "password": session.secret(),
        }
    )
    return f"{base}vnc.html?{query}"


async def _desktop_page(send: Any, session: Session) -> None:
    body = DESKTOP_PAGE.format(
        title=html.escape(f"{session.name} (desktop)"), src=html.escape(_novnc_src(session))
    ).encode()
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
    session: Session,
    cookie: str,
    rest: str,
    body: bytes,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    send: Any,
) -> None:
    target = rest + ("?" + scope["query_string"].decode("latin-1") if scope["query_string"] else "")
    host, port = _target(session)
    headers: list[tuple[bytes, bytes]] = [(b"host", _browser_host(scope, host, port))]
    raw_cookies = []
    for name, value in scope.get("headers", []):
        lower = name.lower()
        if lower == b"cookie":
            raw_cookies.append(value)
        elif lower not in HOP_BY_HOP and lower not in STRIPPED:
            headers.append((name, value))
    cookies = _cookie_header(raw_cookies, cookie)
    if cookies:
        headers.append((b"cookie", cookies.encode("latin-1")))
    headers += [(b"connection", b"close"), (b"content-length", str(len(body)).encode())]
    client = h11.Connection(h11.CLIENT)
    writer.write(client.send(h11.Request(method=scope["method"], target=target, headers=headers)))
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
                    "headers": _response_headers(session, event.headers),
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


def _response_headers(session: Session, headers: Any) -> list[tuple[bytes, bytes]]:
    kept: list[tuple[bytes, bytes]] = []
    prefix = session.url_path.encode()
    for name, value in headers:
        lower = bytes(name).lower()
        if lower in HOP_BY_HOP - {b"content-length"}:
            continue
        value = bytes(value)
        if lower == b"location" and value.startswith(b"/") and not value.startswith(b"//"):
            value = prefix + value[1:]
        if lower == b"set-cookie":
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


class SessionWebSocketProxy(AsyncWebsocketConsumer):
    """WebSockets under /s/<id>/: a handshake with the program, then frames both ways."""

    async def connect(self) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.pump_task: asyncio.Task[None] | None = None
        self.protocol: ClientProtocol | None = None
        user = self.scope.get("user")
        public_id = self.scope["url_route"]["kwargs"]["public_id"]
        session, cookie = await _lookup(user, public_id)
        if session is None or self.scope.get("origin_refused"):
            # Someone else's session (or none): refused before the cluster is asked. Accepted
            # first, so the client reads the close code rather than a bare 403.
            await self.refuse(SESSION_NOT_FOUND)
            return
        if session.status != SessionStatus.RUNNING:
            await self.refuse(SESSION_UNAVAILABLE)
            return
        try:
            reader, writer = await _open_pipe(session)
        except SSHError:
            await program_check(session.pk)
            await self.refuse(SESSION_UNAVAILABLE)
            return
        self.writer = writer
        rest = "/" + self.scope["url_route"]["kwargs"].get("rest", "")
        query = self.scope.get("query_string", b"").decode("latin-1")
        host, port = _target(session)
        uri = parse_uri(f"ws://{host}:{port}{rest}" + (f"?{query}" if query else ""))
        subprotocols = list(self.scope.get("subprotocols") or [])
        protocol = ClientProtocol(uri, subprotocols=subprotocols or None, max_size=None)
        self.protocol = protocol
        request = protocol.connect()
        headers = Headers()
        for name, value in request.headers.raw_items():
            if name.lower() != "host":
                headers[name] = value
        for name, value in self.scope.get("headers", []):
            lower = name.lower()
            if lower == b"host":
                headers["Host"] = value.decode("latin-1")
            elif lower == b"origin":
                headers["Origin"] = value.decode("latin-1")
        raw_cookies = [v for k, v in self.scope.get("headers", []) if k.lower() == b"cookie"]
        cookies = _cookie_header(raw_cookies, cookie)
        if cookies:
            headers["Cookie"] = cookies
        request.headers = headers
        protocol.send_request(request)
        await self._flush()
        response = await self._handshake(reader)
        if response is None:
            writer.close()
            await self.refuse(SESSION_UNAVAILABLE)
            return
        await self.accept(subprotocol=response.headers.get("Sec-WebSocket-Protocol"))
        self.pump_task = asyncio.create_task(self._pump(reader))

    async def refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def _flush(self) -> None:
        assert self.protocol is not None and self.writer is not None
        for data in self.protocol.data_to_send():
            if data:
                self.writer.write(data)
            else:
                self.writer.write_eof() if self.writer.can_write_eof() else None
        await self.writer.drain()

    async def _handshake(self, reader: asyncio.StreamReader) -> Response | None:
        """The program's answer to the handshake; frames that came with it are kept."""
        assert self.protocol is not None
        response: Response | None = None
        while response is None:
            data = await reader.read(65536)
            if not data:
                return None
            self.protocol.receive_data(data)
            for event in self.protocol.events_received():
                if isinstance(event, Response):
                    response = event
                elif isinstance(event, Frame):
                    self.pending_frames.append(event)
        return response if self.protocol.handshake_exc is None else None

    @property
    def pending_frames(self) -> list[Frame]:
        if not hasattr(self, "_pending"):
            self._pending: list[Frame] = []
        return self._pending

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        assert self.protocol is not None
        fragments: list[bytes] = []
        text = False
        frames = list(self.pending_frames)
        try:
            while True:
                for frame in frames:
                    if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                        text, fragments = frame.opcode == Opcode.TEXT, [bytes(frame.data)]
                    elif frame.opcode == Opcode.CONT:
                        fragments.append(bytes(frame.data))
                    elif frame.opcode == Opcode.CLOSE:
                        await self.close()
                        return
                    else:
                        continue
                    if frame.fin:
                        message = b"".join(fragments)
                        if text:
                            await self.send(text_data=message.decode())
                        else:
                            await self.send(bytes_data=message)
                await self._flush()
                data = await reader.read(65536)
                if not data:
                    self.protocol.receive_eof()
                    await self.close()
                    return
                self.protocol.receive_data(data)
                frames = [e for e in self.protocol.events_received() if isinstance(e, Frame)]
        except (ConnectionError, OSError):
            await self.close()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.protocol is None or self.writer is None:
            return
        if bytes_data is not None:
            self.protocol.send_binary(bytes_data)
        elif text_data is not None:
            self.protocol.send_text(text_data.encode())
        try:
            await self._flush()
        except (ConnectionError, OSError):
            await self.close()

    async def disconnect(self, code: int) -> None:
        if self.pump_task is not None:
            self.pump_task.cancel()
        if self.writer is not None:
            self.writer.close()
