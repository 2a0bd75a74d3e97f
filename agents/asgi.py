"""The heartbeat as a plain ASGI callable in front of Django, on the agents' own server.

Heartbeats are nearly all the requests an installation serves. The WSGI stack, not Redis, was
their ceiling (see docs/benchmarks.md), so a beat is answered here: the same checks as the view
(the request signed with the worker's own key, its nonce new; its body read by agents/payloads.py)
and the same one Redis round trip (agents/beats.py: BEAT_SCRIPT, which also remembers the nonce),
with redis.asyncio on the server's event loop; the answer is signed like the view's. Whatever
needs the database goes to the service in a thread: an agent whose identity is not cached
before its beat is answered, the once-a-minute "last seen" after (grouped, by a task of the
process: a beat never waits for PostgreSQL). Every other request, and every other path, is
Django's. A beat this process cannot answer within its budget is shed once its signature is
checked, before any of that (agents/admission.py): answered a signed 503 saying when to try
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.urls import reverse
from redis.exceptions import RedisError

from agents import service as agent_service
from agents import signing
from agents.activity import ActivityReport
from agents.admission import AdmissionGate
from agents.beats import BEAT_SCRIPT, AgentBeats, accepted, beat_outcome
from agents.errors import AgentRefused, Overloaded
from agents.payloads import MAX_BODY, beat_answer, parse_beat
from agents.pipelined import PipelinedScript
from agents.service import LAST_SEEN_GRANULARITY
from agents.signing import SignedCall
from core import metrics as families
from core.redis_connection import async_redis_client
from workers_app.liveness import NOTE_SHED, ShedRecord

log = logging.getLogger(__name__)
# The server's own access log (uvicorn's is off): every request but the successful beats, which
# at thousands a second would be most of the log and a share of the CPU.
access_log = logging.getLogger("activate.agents.access")

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OK = json.dumps(beat_answer("")).encode()
SIGNATURE_HEADER = signing.SIGNATURE_HEADER.lower().encode()
# Seconds a shutting-down process gives its last "last seen" write (uvicorn gives connections 10).
SHUTDOWN_WRITE = 5


def _in_database(function: Callable[..., object], *args: object) -> object:
    # Outside Django's request cycle nobody drops a connection PostgreSQL closed: do it here.
    close_old_connections()
    try:
        return function(*args)
    finally:
        close_old_connections()


class BeatAnswer(NamedTuple):
    status: int
    body: bytes
    call: SignedCall | None  # None when the request's signature was not checked
    retry_after: float | None = None  # seconds, when the beat was shed


class AgentServer:
    """ASGI application of `scripts/start.sh agents`: POST heartbeat here, the rest Django's."""

    def __init__(self, django_application: ASGIApp) -> None:
        self.django = django_application
        self.path = reverse("agent-heartbeat")
        self.redis = async_redis_client()
        self.script = PipelinedScript(self.redis, BEAT_SCRIPT)
        # Only its key names and TTL are used: it holds a synchronous client, never called here.
        self.beats = AgentBeats()
        self.seen = SeenWrites(_write_seen)
        self.sheds = ShedRecord()  # its key names only, as for self.beats
        self.note_shed_script = self.redis.register_script(NOTE_SHED)
        self.gate = AdmissionGate(
            budget=settings.ACTIVATE_AGENT_BEAT_BUDGET_MS / 1000,
            in_flight_limit=settings.ACTIVATE_AGENT_BEATS_IN_FLIGHT,
            retry_after_max=settings.ACTIVATE_AGENT_RETRY_AFTER_MAX,
            note_shed=self._note_shed,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"] == self.path and scope["method"] == "POST":
            self.gate.start()
            answer = await self._heartbeat(scope, receive)
            families.heartbeat_answered(answer.status)
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(answer.body)).encode()),
            ]
            if answer.retry_after is not None:
                # For clients that read the header; the agent reads the signed body's.
                headers.append((b"retry-after", str(math.ceil(answer.retry_after)).encode()))
            if answer.call is not None and answer.status != 401:
                signature = signing.sign_answer(answer.call, answer.status, answer.body)
                headers.append((SIGNATURE_HEADER, signature.encode()))
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": answer.body})
            # A shed beat is not logged one by one: the gate says how many once a second, and a
            # line each would cost what shedding saves.
            if answer.status != 200 and answer.retry_after is None:
                _log_access(scope, answer.status)
        elif scope["type"] == "http":
            status = 0

            async def send_noting_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            await self.django(scope, receive, send_noting_status)
            _log_access(scope, status)
        else:
            await self.django(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.gate.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.gate.stop()
                # The last "last seen" writes, but not past the shutdown's own time.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.seen.close(), SHUTDOWN_WRITE)
                await self.script.close()
                await self.redis.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _heartbeat(self, scope: Scope, receive: Receive) -> BeatAnswer:
        call = None
        try:
            body = await _read_body(receive)
            call = signing.verify_request(_header(scope, b"authorization"), "POST", self.path, body)
            self.gate.admit()
            try:
                activity, problem = parse_beat(body, call.worker)
                await self._beat(call, activity)
            finally:
                self.gate.done()
        except Overloaded as exc:
            return BeatAnswer(exc.status, json.dumps(exc.answer()).encode(), call, exc.retry_after)
        except AgentRefused as exc:
            return BeatAnswer(exc.status, json.dumps(exc.answer()).encode(), call)
        except RedisError as exc:
            log.warning("heartbeat not recorded, Redis did not answer: %s", exc)
            return BeatAnswer(
                503, json.dumps({"error": "heartbeat store unavailable"}).encode(), call
            )
        return BeatAnswer(200, json.dumps(beat_answer(problem)).encode() if problem else OK, call)

    async def _note_shed(self, count: int) -> None:
        keys, args = self.sheds.note_arguments(count)
        await self.note_shed_script(keys=keys, args=args)

    async def _beat(self, call: SignedCall, activity: ActivityReport | None) -> None:
        arguments = self.beats.beat_arguments(
            call.worker,
            call.key_hash,
            seen_window=LAST_SEEN_GRANULARITY,
            nonce=signing.nonce_of(call),
            activity=activity,
        )
        beaten = accepted(beat_outcome(await self.script(keys=arguments.keys, args=arguments.args)))
        if beaten is None:
            # Not cached (first beat after a connect, a Redis reset): the service asks the
            # database, refuses or caches, and beats (the nonce is remembered already).
            await sync_to_async(_in_database, thread_sensitive=False)(
                functools.partial(agent_service.beat_uncached, activity=activity),
                call.worker,
                call.key_hash,
            )
        elif beaten.first_in_window:
            self.seen.note(beaten.worker_id)


async def _write_seen(worker_ids: list[int]) -> None:
    await sync_to_async(_in_database, thread_sensitive=False)(
        agent_service.note_seen_many, worker_ids
    )


class SeenWrites:
    """The "last seen" writes of one process, grouped and off the beats' answers: a beat notes
    its worker and is answered; a task of the process writes every worker noted in one UPDATE,
    then those noted meanwhile in the next. Ten thousand agents need one each a minute, and
    this server keeps no connection to PostgreSQL: one connection a write would be about 170 a
    second, and a beat that waited for one waited behind every beat of the loop (the "last
    seen" is a coarse time for display, no status: liveness is in Redis)."""

    def __init__(self, write: Callable[[list[int]], Awaitable[None]]) -> None:
        self.write = write
        self.waiting: set[int] = set()
        self.writing: asyncio.Task[None] | None = None

    def note(self, worker_id: int) -> None:
        self.waiting.add(worker_id)
        if self.writing is None:
            self.writing = asyncio.get_running_loop().create_task(self._write_all())

    async def close(self) -> None:
        """Write what is noted (at shutdown)."""
        if self.writing is not None:
            await self.writing

    async def _write_all(self) -> None:
        try:
            while self.waiting:
                worker_ids, self.waiting = sorted(self.waiting), set()
                try:
                    await self.write(worker_ids)
                except DatabaseError as exc:
                    # Liveness is in Redis and was recorded; "last seen" waits for the next window.
                    log.warning(
                        "last heartbeat of %d worker(s) not written: %s", len(worker_ids), exc
                    )
                except Exception:
                    # Whatever went wrong, the next are written.
                    log.exception("last heartbeat of %d worker(s) not written", len(worker_ids))
        finally:
            self.writing = None


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise AgentRefused(400, "request ended early")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise AgentRefused(400, "request body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _log_access(scope: Scope, status: int) -> None:
    client = scope.get("client") or ("-", 0)
    query = scope.get("query_string", b"")
    path = scope["path"] + ("?" + query.decode("latin-1") if query else "")
    access_log.info(
        '%s:%s - "%s %s HTTP/%s" %d', client[0], client[1], scope["method"], path,
        scope.get("http_version", "1.1"), status,
    )  # fmt: skip


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return ""
