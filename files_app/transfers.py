"""Downloads and uploads, streamed between the browser (or `pw`) and the cluster's SFTP on the
event loop, outside Django: Django would hold a whole request body before a view saw it, and
streams a response from a thread.

    GET /files/<cluster>/download?path_b64=...              the file, as an attachment
    PUT /files/<cluster>/upload?path_b64=...&overwrite=0|1  the raw body becomes the file

Memory stays flat whatever the size: a few chunks are in flight each way, and each side waits
for the other (the ASGI server stops reading the socket while a body is not taken, and a
response's ``send`` waits while the client is slow). SFTP blocks, so each call runs in a thread
of this module's own, one at a time per transfer.

An upload is written to a hidden name of its own beside the final one (``.<name>.activate-
upload-<random>``, created exclusively) and renamed to the final name only once the whole body
arrived: a client that goes away, a body over the limit or a failed write leaves the final name
as it was, and the hidden file is removed. One left by a web process that died mid-upload is
removed when its folder is next listed, six hours after its last write (services.STALE_UPLOAD).

A user has at most ACTIVATE_FILES_TRANSFERS_PER_USER transfers under way at once, over all web
processes (slots in Redis, renewed while a transfer runs, given back when it ends however it
ends, lapsing a minute after a web process that died): 429 beyond it.

Authentication is the API's: an API key (``Authorization: Bearer``), or the browser's login
cookie, for an upload only with Django's CSRF token in ``X-CSRFToken`` and no foreign Origin.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connections
from django.middleware import csrf

from core.errors import ParameterError
from core.transport.errors import CommandTimeout, SSHError
from core.transport.sftp import (
    FileError,
    FileExists,
    FileReader,
    FileWriter,
    NoSuchFile,
    NotAFile,
    NotEmpty,
    PermissionDenied,
    SFTPSession,
)
from core.websocket_auth import Scope, WebSocketAuthMiddleware
from files_app import paths, services

log = logging.getLogger(__name__)
PATH = re.compile(r"^/files/(?P<cluster>[^/]+)/(?P<action>download|upload)$")
CHUNK = 1024 * 1024
IN_FLIGHT = 4
# SFTP's blocking calls: one at a time per transfer, never on the event loop or on the threads
# pages and the API answer on.
THREADS = 32
_threads = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="files")
T = TypeVar("T")


async def _run(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_threads, functools.partial(function, *args, **kwargs))


class _Serial:
    """One transfer's calls on its session, one at a time even when the task that asked for
    one was cancelled while its thread still runs; none after ``close``."""

    def __init__(self, files: SFTPSession) -> None:
        self.files = files
        self.lock = threading.Lock()
        self.closed = False

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await _run(self._call, function, *args, **kwargs)

    def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self.lock:
            if self.closed:
                raise SSHError("the transfer has ended")
            return function(*args, **kwargs)

    async def close(self, last: Callable[[], None]) -> None:
        await asyncio.shield(_run(self._close, last))

    def _close(self, last: Callable[[], None]) -> None:
        with self.lock:
            self.closed = True
            try:
                last()
            finally:
                self.files.close()


def _open_files(place: services.Place) -> SFTPSession:
    try:
        return services.open_files(place)
    finally:
        # A certificate login asks the database; this thread's connection is not kept.
        connections.close_all()


class _Refused(Exception):
    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field


def _refusal(exc: BaseException) -> _Refused:
    """The API's answer to a cluster's refusal (files_app/api/views.py says the same)."""
    if isinstance(exc, services.ClusterNotFound):
        return _Refused(404, "Not found.")
    if isinstance(exc, NoSuchFile):
        return _Refused(404, str(exc))
    if isinstance(exc, PermissionDenied):
        return _Refused(403, str(exc))
    if isinstance(exc, FileExists | NotEmpty):
        return _Refused(409, str(exc))
    if isinstance(exc, NotAFile | FileError):
        return _Refused(400, str(exc), "path")
    if isinstance(exc, ParameterError):
        return _Refused(400, exc.message, exc.field)
    if isinstance(exc, CommandTimeout):
        return _Refused(503, str(exc))
    if isinstance(exc, SSHError):
        return _Refused(502, f"The cluster cannot be reached: {exc}")
    raise exc


async def _answer(
    send: Any, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"cache-control", b"no-store"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _refuse(send: Any, refused: _Refused) -> None:
    body: dict[str, Any] = {"detail": refused.detail}
    if refused.status == 400:
        body = {"field": refused.field, "detail": refused.detail}
    await _answer(send, refused.status, body)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def csrf_passed(scope: Scope) -> bool:
    """Django's check, on the cookie and header it uses: the header's token matches the
    cookie's secret."""
    secret = scope.get("cookies", {}).get(settings.CSRF_COOKIE_NAME, "")
    header = settings.CSRF_HEADER_NAME.removeprefix("HTTP_").replace("_", "-").lower()
    token = _header(scope, header.encode()) or ""
    django_csrf: Any = csrf  # its checks are module-private, and the same as its middleware's
    try:
        django_csrf._check_token_format(secret)
        django_csrf._check_token_format(token)
    except csrf.InvalidTokenFormat:
        return False
    return bool(django_csrf._does_token_match(token, secret))


def _query(scope: Scope) -> dict[str, str]:
    raw = bytes(scope.get("query_string", b"")).decode("ascii", "replace")
    pairs = parse_qsl(raw, keep_blank_values=True, errors="surrogateescape")
    return dict(pairs)


def _declared_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


def content_disposition(name: bytes) -> bytes:
    """``attachment`` with the name for every browser: RFC 5987's UTF-8 form, and a plain
    ASCII stand-in for those that read only that."""
    shown = paths.display(name)
    fallback = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in shown
    )
    encoded = quote(shown.encode("utf-8"), safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}".encode("ascii")


class FileTransfers:
    """The ASGI app for /files/<cluster>/download and /upload (activate/routing.py)."""

    def __init__(self) -> None:
        self.authenticated = WebSocketAuthMiddleware(self._serve)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        await self.authenticated(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Any, send: Any) -> None:
        match = PATH.match(scope["path"])
        if match is None:
            await _answer(send, 404, {"detail": "Not found."})
            return
        action, method = match["action"], scope["method"]
        wanted = "GET" if action == "download" else "PUT"
        if method != wanted:
            allow = [(b"allow", wanted.encode())]
            await _answer(send, 405, {"detail": f'Method "{method}" not allowed.'}, allow)
            return
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            detail = (
                "Invalid API key."
                if scope.get("auth") == "api_key"
                else "Authentication credentials were not provided."
            )
            await _answer(send, 401, {"detail": detail}, [(b"www-authenticate", b"Bearer")])
            return
        if action == "upload" and scope.get("auth") == "session":
            if scope.get("origin_refused") and _header(scope, b"origin") is not None:
                await _answer(send, 403, {"detail": "This page's origin may not upload."})
                return
            if not csrf_passed(scope):
                await _answer(send, 403, {"detail": "CSRF Failed: CSRF token missing or wrong."})
                return
        query = _query(scope)
        try:
            path = paths.path_from(query)
            overwrite = query.get("overwrite", "0")
            if overwrite not in ("0", "1"):
                raise ParameterError("overwrite", "must be 0 or 1")
            if action == "upload":
                declared = _declared_length(scope)
                limit = settings.ACTIVATE_FILES_MAX_UPLOAD
                if declared is not None and declared > limit:
                    raise _Refused(413, _too_large(limit))
            place = await database_sync_to_async(services.place_for)(user, match["cluster"])
        except _Refused as refused:
            await _refuse(send, refused)
            return
        except (ParameterError, services.ClusterNotFound) as exc:
            await _refuse(send, _refusal(exc))
            return
        limit = settings.ACTIVATE_FILES_TRANSFERS_PER_USER
        try:
            slot = await _run(services.take_transfer_slot, user, limit=limit)
        except services.TooManyTransfers as exc:
            await _answer(send, 429, {"detail": str(exc)}, [(b"retry-after", b"5")])
            return
        renewing = asyncio.ensure_future(_renew(slot))
        try:
            if action == "download":
                await _download(place, path, receive, send)
            else:
                await _upload(place, path, overwrite == "1", receive, send)
        finally:
            renewing.cancel()
            if slot is not None:
                await asyncio.shield(_run(services.release_transfer_slot, slot))


async def _renew(slot: services.TransferSlot | None) -> None:
    while slot is not None:
        await asyncio.sleep(services.SLOT_RENEW)
        await _run(services.renew_transfer_slot, slot)


def _too_large(limit: int) -> str:
    return f"The file is larger than this platform takes: at most {limit:,} bytes."


# -- downloads -------------------------------------------------------------------------------


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _download(place: services.Place, path: bytes, receive: Any, send: Any) -> None:
    try:
        serial = _Serial(await _run(_open_files, place))
    except SSHError as exc:
        await _refuse(send, _refusal(exc))
        return
    reader: FileReader | None = None

    def close_reader() -> None:
        if reader is not None:
            with contextlib.suppress(SSHError):
                reader.close()

    try:
        try:
            where = await serial.run(services.resolve, serial.files, path)
            reader = await serial.run(serial.files.open_reader, where)
        except SSHError as exc:
            await _refuse(send, _refusal(exc))
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/octet-stream"),
                    (b"content-length", str(reader.size).encode()),
                    (b"content-disposition", content_disposition(paths.name_of(where))),
                    (b"x-content-type-options", b"nosniff"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        sending = asyncio.ensure_future(_send_file(serial, reader, send))
        gone = asyncio.ensure_future(_until_disconnect(receive))
        await asyncio.wait({sending, gone}, return_when=asyncio.FIRST_COMPLETED)
        for task in (sending, gone):
            task.cancel()
        outcome = (await asyncio.gather(sending, gone, return_exceptions=True))[0]
        if isinstance(outcome, SSHError):
            # The head is sent: cutting the body short is how the client learns of it.
            log.warning("a download from %s stopped: %s", place.cluster.name, outcome)
    finally:
        await serial.close(close_reader)


async def _send_file(serial: _Serial, reader: FileReader, send: Any) -> None:
    """The file's chunks, read a few ahead in a thread while the client takes them."""
    pieces: Iterator[bytes] = reader.chunks(CHUNK)
    ready: asyncio.Queue[bytes | None] = asyncio.Queue(IN_FLIGHT)

    async def read_ahead() -> None:
        while (piece := await serial.run(next, pieces, None)) is not None:
            await ready.put(piece)
        await ready.put(None)

    reading = asyncio.ensure_future(read_ahead())
    try:
        while True:
            getting = asyncio.ensure_future(ready.get())
            await asyncio.wait({getting, reading}, return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                getting.cancel()
                reading.result()  # it failed: raise what it raised
                continue
            piece = getting.result()
            if piece is None:
                break
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)


# -- uploads ---------------------------------------------------------------------------------


class _Disconnected(Exception):
    pass


async def _upload(
    place: services.Place, path: bytes, overwrite: bool, receive: Any, send: Any
) -> None:
    try:
        serial = _Serial(await _run(_open_files, place))
    except SSHError as exc:
        await _refuse(send, _refusal(exc))
        return
    files = serial.files
    target: services.UploadTarget | None = None
    writer: FileWriter | None = None
    finished = False

    def settle() -> None:
        # Whatever did not finish leaves nothing behind: no hidden file, the final name as it was.
        try:
            if writer is not None:
                with contextlib.suppress(SSHError):
                    writer.close()
            if target is not None and not finished:
                services.forget_upload(files, target)
        except SSHError:
            log.warning("could not remove an unfinished upload's file", exc_info=True)

    try:
        target = await serial.run(services.upload_target, files, path, overwrite=overwrite)
        writer = await serial.run(files.open_writer, target.temporary)
        await _receive_into(serial, writer, receive, settings.ACTIVATE_FILES_MAX_UPLOAD)
        await serial.run(writer.close)
        made = await serial.run(services.finish_upload, files, target, overwrite=overwrite)
        finished = True
        await _answer(send, 200 if target.replaces else 201, made)
    except _Refused as refused:
        await _refuse(send, refused)
    except _Disconnected:
        log.info("an upload to %s was abandoned by its client", place.cluster.name)
    except SSHError as exc:
        await _refuse(send, _refusal(exc))
    finally:
        await serial.close(settle)


async def _receive_into(serial: _Serial, writer: FileWriter, receive: Any, limit: int) -> None:
    """The request's body into ``writer``, in chunks written in a thread while the next one
    arrives; _Refused (413) past ``limit`` bytes, _Disconnected if the client goes away."""
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue(IN_FLIGHT)

    async def write_all() -> None:
        while (chunk := await chunks.get()) is not None:
            await serial.run(writer.write, chunk)

    writing = asyncio.ensure_future(write_all())

    async def hand_over(chunk: bytes | None) -> None:
        putting = asyncio.ensure_future(chunks.put(chunk))
        await asyncio.wait({putting, writing}, return_when=asyncio.FIRST_COMPLETED)
        if not putting.done():
            putting.cancel()
            writing.result()  # it failed: raise what it raised

    bodies: list[bytes] = []  # joined once per chunk: one copy of each byte, not two
    held = 0
    received = 0
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            body = message.get("body", b"")
            received += len(body)
            if received > limit:
                raise _Refused(413, _too_large(limit))
            if body:
                bodies.append(body)
                held += len(body)
            more = message.get("more_body", False)
            if held >= CHUNK or (held and not more):
                await hand_over(b"".join(bodies))
                bodies, held = [], 0
            if not more:
                break
        await hand_over(None)
        await writing
    finally:
        if not writing.done():
            # Stop after the write under way (never two calls on the session at once).
            while not chunks.empty():
                chunks.get_nowait()
            chunks.put_nowait(None)
            await asyncio.gather(writing, return_exceptions=True)
