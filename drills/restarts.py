"""Restart the web server, the agents' server and the Celery worker: no worker changes status;
agents' heartbeats resume.

A deploy's rolling restart: the web server (SIGTERM, then a new one), the agents' server, then
the Celery worker,
with workers connected (their agents beating) and others queued.
"""

from __future__ import annotations

import time

from drills.drill import Drill, DrillResult, now, pause
from harness.cluster import SshTarget

NAME = "Restart the web server, the agents' server and the Celery worker"


def run(target: SshTarget, *, restarts: int = 3) -> DrillResult:
    with Drill("restarts", target, title=NAME) as drill:
        platform = drill.platform
        platform.start_all()
        queued, connected = drill.settled(queued=2, connected=3)
        interval = drill.knob("ACTIVATE_HEARTBEAT_INTERVAL")
        timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
        web_down: list[float] = []
        agents_down: list[float] = []
        for _ in range(restarts):
            began = now()
            stopped = time.monotonic()
            platform.stop("web")
            platform.start_web()
            web_down.append(time.monotonic() - stopped)
            stopped = time.monotonic()
            platform.stop("agents")
            platform.start_agents()
            agents_down.append(time.monotonic() - stopped)
            platform.stop("worker")
            platform.start_worker()
            drill.result.repetitions += 1
            # Long enough for a false stop to show: the heartbeat timeout and a few sweeps more.
            pause(timeout + 3 * drill.knob("ACTIVATE_SWEEP_INTERVAL"))
            changes = drill.changes_since(began, connected + queued)
            drill.check(not changes, f"status changed across a restart: {changes}")
            # A key refreshed in the last two intervals means the agent beats the new server.
            client = platform.redis_client()
            silent = [
                w.public_id
                for w in connected
                if client.pttl(f"activate:hb:{w.pk}") <= (timeout - 2 * interval) * 1000
            ]
            drill.check(not silent, f"heartbeats did not resume after a restart: {silent}")
        drill.note(
            f"{len(connected)} connected and {len(queued)} queued workers; web down "
            f"{min(web_down):.1f}-{max(web_down):.1f} s and the agents' server "
            f"{min(agents_down):.1f}-{max(agents_down):.1f} s per restart (heartbeat timeout "
            f"{timeout:g} s); no status change, every agent beating the new server"
        )
        return drill.result
