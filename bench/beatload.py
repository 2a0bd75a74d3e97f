"""Heartbeat load generator: a separate process, asyncio, one keep-alive connection per agent.

    python -m bench.beatload --url URL --agents FILE --duration S [--rate R] [--warmup S]

FILE is JSON: [[worker_public_id, secret], ...]. With --rate 0 each agent beats again as soon
as its answer arrives (closed loop: capacity); with --rate R the agents together send R beats
per second on a fixed schedule (open loop), and a beat's latency counts from when it was due,
so a server that falls behind is not hidden by the client waiting for it. Bounded: it stops
after --warmup + --duration seconds and never sends more than --max-requests beats.
Prints one JSON object: beats, errors, latencies (seconds), elapsed, client CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from urllib.parse import urlparse


class Agent:
    def __init__(self, host: str, port: int, public_id: str, secret: str) -> None:
        self.host, self.port = host, port
        body = json.dumps({"worker": public_id}).encode()
        self.request = (
            f"POST /agent/v1/heartbeat HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def beat(self) -> int:
        """Send one heartbeat; returns the HTTP status (0 when the connection failed)."""
        for attempt in range(2):
            try:
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                assert self.reader is not None
                self.writer.write(self.request)
                head = await self.reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length, close = 0, False
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                await self.reader.readexactly(length)
                if close:
                    self.close()
                return status
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                # The server closed an idle keep-alive connection: reconnect once.
                self.close()
                if attempt:
                    return 0
        return 0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def drive(args: argparse.Namespace) -> dict[str, object]:
    url = urlparse(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    with open(args.agents) as handle:
        agents = [Agent(host, port, public_id, secret) for public_id, secret in json.load(handle)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from = start + args.warmup
    stop_at = measure_from + args.duration
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    sent = 0
    interval = len(agents) / args.rate if args.rate > 0 else 0.0

    async def run_agent(index: int, agent: Agent) -> None:
        nonlocal sent
        due = start + (interval * index / len(agents) if interval else 0.0)
        while sent < args.max_requests:
            now = loop.time()
            if due > now:
                await asyncio.sleep(due - now)
            if due >= stop_at or loop.time() >= stop_at:
                break
            sent += 1
            began = due if interval else loop.time()
            status = await agent.beat()
            finished = loop.time()
            if began >= measure_from and finished <= stop_at:
                latencies.append(finished - began)
                statuses[status] = statuses.get(status, 0) + 1
            due = due + interval if interval else finished
        agent.close()

    cpu_before = os.times()
    await asyncio.gather(*(run_agent(i, a) for i, a in enumerate(agents)))
    cpu_after = os.times()
    ok = statuses.get(200, 0)
    return {
        "beats": ok,
        "errors": sum(statuses.values()) - ok,
        "statuses": {str(k): v for k, v in statuses.items()},
        "latencies": latencies,
        "elapsed": args.duration,
        "client_cpu": (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--agents", required=True)
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--rate", type=float, default=0)
    parser.add_argument("--max-requests", type=int, default=200_000)
    args = parser.parse_args(argv)
    if args.duration > 120 or args.warmup > 60:
        parser.error("bounded: --duration at most 120 s, --warmup at most 60 s")
    if urlparse(args.url).hostname not in {"127.0.0.1", "localhost", "::1"}:
        parser.error("load goes to this machine's loopback only")
    result = asyncio.run(drive(args))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
