"""WebSockets under /s/<id>/: a handshake with the program (with its login), then frames both
ways until either side closes."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from core.transport.errors import SSHError
from sessions_app import metrics
from sessions_app.proxy import limits
from sessions_app.proxy.raw_bridge import RawBridge
from sessions_app.proxy.target import Target, cookie_header, find_target, open_pipe, program_check
from sessions_app.statuses import SessionStatus

SESSION_NOT_FOUND = 4404
SESSION_UNAVAILABLE = 4503
TOO_MANY_SOCKETS = 4429
MESSAGE_TOO_BIG = 1009


class SessionWebSocketProxy(AsyncWebsocketConsumer):
    """WebSockets under /s/<id>/: a handshake with the program, then frames both ways."""

    slot: int | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # However the socket ends, its slot in the user's share is given back once.
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.slot is not None:
                limits.websockets.give_back(self.slot)
                self.slot = None

    async def connect(self) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.pump_task: asyncio.Task[None] | None = None
        self.protocol: ClientProtocol | None = None
        self.raw: RawBridge | None = None
        self.target: Target | None = None
        user = self.scope.get("user")
        public_id = self.scope["url_route"]["kwargs"]["public_id"]
        if user is not None and user.is_authenticated:
            if not limits.websockets.take(user.pk):
                await self.refuse(TOO_MANY_SOCKETS, limits.TOO_MANY)
                return
            self.slot = user.pk
        target = await find_target(user, public_id)
        if target is None or self.scope.get("origin_refused"):
            # Someone else's session (or none): refused before the cluster is asked. Accepted
            # first, so the client reads the close code rather than a bare 403.
            await self.refuse(SESSION_NOT_FOUND)
            return
        session = target.session
        if session.status != SessionStatus.RUNNING:
            await self.refuse(SESSION_UNAVAILABLE)
            return
        self.target = target
        route = target.kind.raw_routes.get(self.scope["url_route"]["kwargs"].get("rest", ""))
        try:
            if route is not None:
                self.raw = await RawBridge.open(self, target, route)
                return
            reader, writer = await open_pipe(target)
        except SSHError:
            alive = await program_check(session.pk)
            metrics.proxy_failed(target.kind.name, "unreachable" if alive else "program_ended")
            await self.refuse(SESSION_UNAVAILABLE)
            return
        self.writer = writer
        rest = target.path_on_node("/" + self.scope["url_route"]["kwargs"].get("rest", ""))
        query = self.scope.get("query_string", b"").decode("latin-1")
        host, port = target.address
        uri = parse_uri(f"ws://{host}:{port}{rest}" + (f"?{query}" if query else ""))
        subprotocols = list(self.scope.get("subprotocols") or [])
        protocol = ClientProtocol(
            uri, subprotocols=subprotocols or None, max_size=settings.ACTIVATE_PROXY_MAX_MESSAGE
        )
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
        cookies = cookie_header(raw_cookies, target.login.cookies)
        if cookies:
            headers["Cookie"] = cookies
        for name, value in target.login.headers:
            headers[name.decode("latin-1")] = value.decode("latin-1")
        request.headers = headers
        protocol.send_request(request)
        await self._flush()
        response = await self._handshake(reader)
        if response is None:
            writer.close()
            metrics.proxy_failed(target.kind.name, "handshake")
            await self.refuse(SESSION_UNAVAILABLE)
            return
        await self.accept(subprotocol=response.headers.get("Sec-WebSocket-Protocol"))
        self.pump_task = asyncio.create_task(self._pump(reader))

    async def refuse(self, code: int, reason: str | None = None) -> None:
        await self.accept()
        await self.close(code=code, reason=reason)

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
                if isinstance(self.protocol.parser_exc, PayloadTooBig):
                    # The program was told so by the protocol (1009); the browser is too.
                    await self.close(code=MESSAGE_TOO_BIG)
                    return
                data = await reader.read(65536)
                if self.target is not None:
                    self.target.note_traffic()
                    metrics.to_browser(self.target.kind.name, len(data))
                if not data:
                    self.protocol.receive_eof()
                    await self.close()
                    return
                self.protocol.receive_data(data)
                frames = [e for e in self.protocol.events_received() if isinstance(e, Frame)]
        except (ConnectionError, OSError):
            await self.close()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        data = bytes_data if bytes_data is not None else (text_data or "").encode()
        if len(data) > settings.ACTIVATE_PROXY_MAX_MESSAGE:
            await self.close(code=MESSAGE_TOO_BIG)
            return
        if self.target is not None:
            self.target.note_traffic()
        if self.raw is not None:
            await self.raw.from_browser(bytes_data or (text_data or "").encode())
            return
        if self.protocol is None or self.writer is None:
            return
        if self.target is not None:
            metrics.to_node(self.target.kind.name, len(data))
        if bytes_data is not None:
            self.protocol.send_binary(bytes_data)
        elif text_data is not None:
            self.protocol.send_text(text_data.encode())
        try:
            await self._flush()
        except (ConnectionError, OSError):
            await self.close()

    async def disconnect(self, code: int) -> None:
        if self.raw is not None:
            self.raw.close()
        if self.pump_task is not None:
            self.pump_task.cancel()
        if self.writer is not None:
            self.writer.close()
