"""The load generator of the shedding benchmark: agents as the node agent beats, one kept
HTTP/1.1 connection each, signing each beat when it is due, and waiting as a signed 503 says
(its retry_after plus up to half again) before the next. Unlike bench/beat_load.py (open loop,
signed beforehand) it answers the server's back-off, as real agents do.

    python -m bench.shed_load PLAN OUT

PLAN is JSON: host, port, start (wall-clock time of offset 0), end (offset), interval and
burst ([from, to, interval]: the agents' interval between those offsets), and the agents
([public id, key id, key, phase]). OUT gets every beat as [due, sent, answered, status] (offsets
in seconds; status "200", "503" with a retry_after, or what else came or failed) and this
process's CPU seconds. Nothing of the server is imported: the signing is the node agent's own.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import sys
import time
from pathlib import Path

from bench.beat_load import generate
from node.activate_agent import authorization, new_nonce

PATH = "/agent/v1/heartbeat"
TIMEOUT = 10.0


class Run:
    def __init__(self, plan: dict[str, object]) -> None:
        self.host = str(plan["host"])
        self.port = int(plan["port"])  # type: ignore[call-overload]
        self.end = float(plan["end"])  # type: ignore[arg-type]
        self.interval = float(plan["interval"])  # type: ignore[arg-type]
        burst = plan["burst"]
        assert isinstance(burst, list)
        self.burst_from, self.burst_to, self.burst_interval = (float(x) for x in burst)
        start = float(plan["start"])  # type: ignore[arg-type]
        self.origin = time.monotonic() + (start - time.time())
        self.beats: list[tuple[float, float, float, str]] = []
        self.rng = random.Random()

    def now(self) -> float:
        return time.monotonic() - self.origin

    def next_after(self, due: float) -> float:
        inside = self.burst_from <= due < self.burst_to
        return due + (self.burst_interval if inside else self.interval)

    async def agent(self, worker: str, key_id: str, key: str, phase: float) -> None:
        kept: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        due = phase
        while due < self.end:
            wait = due - self.now()
            if wait > 0:
                await asyncio.sleep(wait)
            body = json.dumps({"worker": worker}).encode()
            seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
            header = authorization(
                worker, key_id, key, "POST", PATH, body, f"{seconds}.{micros:06d}", new_nonce()
            )
            request = (
                f"POST {PATH} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nAuthorization: {header}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            sent = self.now()
            try:
                if kept is None:
                    kept = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port), TIMEOUT
                    )
                kept[1].write(request)
                status, answer = await asyncio.wait_for(_answer(kept[0]), TIMEOUT)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                self.beats.append((due, sent, self.now(), type(exc).__name__))
                if kept is not None:
                    kept[1].close()
                kept = None
                due = self.next_after(due)
                continue
            told = float(json.loads(answer).get("retry_after", 0) or 0) if status == "503" else 0
            # A 503 without a delay is not a shed beat (Redis did not answer the server).
            outcome = "503 without retry_after" if status == "503" and not told else status
            self.beats.append((due, sent, self.now(), outcome))
            if told:
                due = self.now() + told + self.rng.uniform(0, told / 2)
                continue
            due = self.next_after(due)
        if kept is not None:
            kept[1].close()


async def _answer(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await reader.readexactly(length)
    return lines[0][9:12].decode(), body


async def run(path: Path) -> dict[str, object]:
    plan = json.loads(path.read_text())
    load = Run(plan)
    agents = plan["agents"]
    assert isinstance(agents, list)
    if load.now() > 0:
        return {"error": f"ready {load.now():.2f} s after the start"}
    before = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*(load.agent(*agent) for agent in agents))
    used = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "beats": load.beats,
        "cpu": used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime,
    }


def main() -> int:
    return generate(run)


if __name__ == "__main__":
    sys.exit(main())
