"""Many node agents in one process, each the real agent's code (node/activate_agent.py's Agent
and Platform: connect, then beat at the interval the platform answers with, retrying as the
agent retries), a thread each, every call's outcome written down.

    python -m harness.agent_crowd SPEC OUT

SPEC is JSON: ``url`` (the agents' server), ``interval`` (seconds, until a connect answers),
``connecting`` (how many agents may be connecting at once), ``agents``: [public id, key id, key,
job id, hostname] each. OUT gets one line per call as it
ends: agent index, path, wall-clock start and end, outcome ("ok", or the status or exception).
Runs until SIGTERM. Imports nothing of the server: what a node has.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO

from node import activate_agent


class Recorder:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.lock = threading.Lock()

    def note(self, index: int, path: str, started: float, outcome: str) -> None:
        line = f"{index} {path} {started:.6f} {time.time():.6f} {outcome}\n"
        with self.lock:
            self.out.write(line)


class RecordedPlatform(activate_agent.Platform):
    """The agent's platform client, each call's outcome noted."""

    def __init__(
        self,
        recorder: Recorder,
        index: int,
        base: str,
        worker: str,
        key_id: str,
        key: str,
        *,
        interval: float,
    ) -> None:
        # The agent's own timeout for this interval (activate_agent.main).
        super().__init__(base, worker, key_id, key, timeout=max(2.0, min(10.0, interval)))
        self.recorder, self.index = recorder, index

    def post(self, path: str, payload: dict) -> dict:
        started = time.time()
        try:
            answer = super().post(path, payload)
        except activate_agent.Refused as exc:
            self.recorder.note(self.index, path, started, str(exc.status))
            raise
        except Exception as exc:
            self.recorder.note(self.index, path, started, type(exc).__name__)
            raise
        self.recorder.note(self.index, path, started, "ok")
        return answer


def live(
    agent: activate_agent.Agent, first: float, stop: threading.Event, gate: threading.Semaphore
) -> None:
    """The agent's main loop without its job's watchers: connect or beat when due. Only a few
    connect at once, as jobs start over a while: 200 connects at once would time out (2 s)
    together and come back together, each retry queued behind those the server is still
    answering."""
    next_beat = first
    while not stop.wait(max(0.0, next_beat - time.monotonic())):
        if agent.connected:
            next_beat = time.monotonic() + agent.beat()
        else:
            with gate:
                next_beat = time.monotonic() + agent.beat()


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    interval = float(spec["interval"])
    gate = threading.Semaphore(int(spec["connecting"]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.stack_size(512 * 1024)
    with Path(sys.argv[2]).open("a", buffering=1) as out:
        recorder = Recorder(out)
        threads = []
        start = time.monotonic()
        for index, (worker, key_id, key, job_id, hostname) in enumerate(spec["agents"]):
            platform = RecordedPlatform(
                recorder, index, spec["url"], worker, key_id, key, interval=interval
            )
            identity = {"worker": worker, "hostname": hostname, "job_id": job_id}
            agent = activate_agent.Agent(platform, identity, interval)
            # Each at its own phase of the interval, as agents started at different times are.
            first = start + random.uniform(0, interval)  # noqa: S311 - no secret
            thread = threading.Thread(target=live, args=(agent, first, stop, gate), daemon=True)
            thread.start()
            threads.append(thread)
        stop.wait()
        for thread in threads:
            thread.join(timeout=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
