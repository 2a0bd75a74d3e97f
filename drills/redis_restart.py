"""Restart Redis with workers connected: none is stopped falsely; heartbeats resume.

The drill runs its own redis-server (no persistence, so a restart loses every key: heartbeat
keys, the epoch, queued tasks) and points the platform at it. Workers are requested and
deleted through the API, so every task goes through that Redis.
"""

from __future__ import annotations

from drills.drill import Drill, DrillResult, now, pause
from drills.servers import RedisServer
from harness import HarnessError
from harness.cluster import SshTarget
from harness.objects import RUN_ENVIRONMENT

NAME = "Restart Redis with workers connected"


def run(target: SshTarget, *, restarts: int = 3, workers: int = 3, down: float = 2) -> DrillResult:
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    server: RedisServer | None = None
    try:
        with Drill("redis-restart", target, title=NAME) as drill:
            server = RedisServer(drill.platform.workdir)
            server.start()
            drill.platform.redis_url = server.url
            drill.platform.start_all()
            made = drill.request(RUN_ENVIRONMENT, workers)
            if not drill.wait_status(made, {S.CONNECTED}, timeout=180):
                raise HarnessError(f"workers did not connect: {drill.statuses(made)}")
            interval = drill.knob("ACTIVATE_HEARTBEAT_INTERVAL")
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
            for _ in range(restarts):
                restarted_at = now()
                server.kill()
                pause(down)
                server.start()
                drill.result.repetitions += 1
                # Past the heartbeat timeout and a few sweeps: a false stop would show by now.
                pause(timeout + 3 * sweep)
                changes = drill.changes_since(restarted_at, made)
                drill.check(not changes, f"status changed after a Redis restart: {changes}")
                client = drill.platform.redis_client()
                fresh = [
                    w.public_id
                    for w in made
                    if client.pttl(f"activate:hb:{w.pk}") > (timeout - 2 * interval) * 1000
                ]
                silent = sorted({w.public_id for w in made} - set(fresh))
                drill.check(not silent, f"heartbeats did not resume for {silent}")
            for worker in made:
                worker.refresh_from_db()
            resumed = [
                w for w in made if w.last_heartbeat_at and w.last_heartbeat_at >= restarted_at
            ]
            drill.note(
                f"{len(made)} connected workers, Redis killed {restarts} times for {down:g} s "
                f"(all keys lost each time); {len(resumed)} of {len(made)} wrote a heartbeat to "
                f"the database after the last restart; none changed status within "
                f"{timeout + 3 * sweep:g} s of each restart (timeout {timeout:g} s)"
            )
            result = drill.result
    finally:
        if server is not None:
            server.kill()
    return result
