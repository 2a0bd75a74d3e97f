"""An open-loop load generator for the beats benchmark: sends pre-signed heartbeats, each at its
own scheduled time, and times each from that time (not from when it was sent), so a server that
falls behind is charged for the beats waiting behind it (no coordinated omission).

    python -m bench.beat_load PLAN OUT

PLAN is written by bench/beats.py: a JSON line (host, port, start: the wall-clock time of
offset 0), then one beat a line: offset in seconds, Authorization header, JSON body. Each beat
opens a connection of its own and asks for it to be closed, as the agent's urllib does. OUT gets
a JSON object: every beat's latency, how late each was sent, the answers' statuses, and this
process's CPU seconds. Nothing of the server is imported: only what a client needs.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import uvloop

TIMEOUT = 10.0
PATH = "/agent/v1/heartbeat"


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    open_at_most: int = 0
    open_now: int = 0
    last_done: float = 0.0

    def note(self, latency: float, outcome: str) -> None:
        self.latencies.append(latency)
        self.statuses[outcome] += 1
        self.last_done = max(self.last_done, time.monotonic())


class BeatProtocol(asyncio.Protocol):
    """One beat on a connection of its own: write it, read one answer, close."""

    def __init__(
        self,
        request: bytes,
        due: float,
        tally: Tally,
        done: asyncio.Future[None],
        closed: asyncio.Future[None],
    ) -> None:
        self.request = request
        self.due = due
        self.tally = tally
        self.done = done
        self.closed = closed
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, though they behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = 0
        for line in bytes(self.buffer[:end]).split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        self._finish(self.buffer[9:12].decode())

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish("closed early" if exc is None else type(exc).__name__)
        if not self.closed.done():
            self.closed.set_result(None)

    def _finish(self, outcome: str) -> None:
        if self.done.done():
            return
        self.tally.note(time.monotonic() - self.due, outcome)
        self.done.set_result(None)


async def _send(
    host: str, port: int, request: bytes, due: float, tally: Tally, timeout: float
) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    closed: asyncio.Future[None] = loop.create_future()
    tally.lags.append(time.monotonic() - due)
    tally.open_now += 1
    tally.open_at_most = max(tally.open_at_most, tally.open_now)
    transport = None
    try:
        async with asyncio.timeout(timeout):
            transport, _ = await loop.create_connection(
                lambda: BeatProtocol(request, due, tally, done, closed), host, port
            )
            await done
            # The server closes first (the request said so): its side keeps the TIME_WAIT, so
            # one host opening thousands of connections a second does not run out of ports.
            await closed
    except (TimeoutError, OSError) as exc:
        # uvloop may also tell the protocol of a connection that failed: count the beat once.
        if not done.done() or done.cancelled():
            outcome = "timeout" if isinstance(exc, TimeoutError) else f"{exc!r}"[:60]
            tally.note(time.monotonic() - due, outcome)
    finally:
        tally.open_now -= 1
        if transport is not None:
            transport.close()


def _request(host: str, port: int, authorization: str, body: str) -> bytes:
    payload = body.encode()
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: {authorization}\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\nUser-Agent: Python-urllib/3.11\r\n\r\n"
    )
    return head.encode() + payload


async def run(plan: Path) -> dict[str, object]:
    with plan.open() as lines:
        head = json.loads(next(lines))
        host, port, start = head["host"], int(head["port"]), float(head["start"])
        beats = []
        for line in lines:
            at, authorization, body = line.rstrip("\n").split("\t", 2)
            beats.append((float(at), _request(host, port, authorization, body)))
    beats.sort(key=lambda beat: beat[0])
    tally = Tally()
    late_start = time.time() - start
    if late_start > 0:
        return {"error": f"ready {late_start:.2f} s after the start: sign fewer or start later"}
    # The start in this process's monotonic clock: every due time is measured against it.
    origin = time.monotonic() + (start - time.time())
    before = resource.getrusage(resource.RUSAGE_SELF)
    tasks = set()
    for offset, request in beats:
        due = origin + offset
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(_send(host, port, request, due, tally, TIMEOUT))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))
    used = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "latencies": tally.latencies,
        "lags": tally.lags,
        "statuses": dict(tally.statuses),
        "open_at_most": tally.open_at_most,
        # Sending and reading only: not the start-up nor reading the plan.
        "cpu": used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime,
        "span": tally.last_done - origin,
        "last_due": beats[-1][0] if beats else 0.0,
    }


def generate(load: Callable[[Path], Coroutine[object, object, dict[str, object]]]) -> int:
    """A generator process's life: ``load`` of the plan named first, its result written to the
    file named second; exit status 1 when it says "error"."""
    plan, out = Path(sys.argv[1]), Path(sys.argv[2])
    # One socket per beat in flight: a stalled server could hold thousands at once.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = uvloop.run(load(plan))
    out.write_text(json.dumps(result))
    return 0 if "error" not in result else 1


def main() -> int:
    return generate(run)


if __name__ == "__main__":
    sys.exit(main())
