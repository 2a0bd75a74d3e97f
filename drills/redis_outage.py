"""Redis unreachable for three heartbeat timeouts, then Redis back from an old snapshot: no
worker changes status either time, and the agents beat again.

The drill runs its own redis-server (the platform's broker and heartbeat store). First outage:
a snapshot is written, the server killed (its port closed) and started again from that snapshot
after three timeouts, so it comes back with the data it had. Second: a snapshot is written, the
agents beat on past the heartbeat timeout, then the server is killed and started from that
snapshot: every heartbeat key it holds is past its expiry, as after a restore from an hour-old
backup.
"""

from __future__ import annotations

import time

from drills.drill import Drill, DrillResult, now, pause
from drills.servers import RedisServer
from harness import HarnessError
from harness.cluster import SshTarget
from harness.waiting import wait_until

SWEEP_KEYS = ("activate:hb-epoch", "activate:hb-last-sweep")
NAME = "Redis unreachable for 3x the heartbeat timeout; back from an old snapshot"


def _platform_keys(server: RedisServer) -> list[str]:
    keys = server.client().keys("activate:*")
    return sorted(key.decode() if isinstance(key, bytes) else str(key) for key in keys)


def run(target: SshTarget, *, factor: float = 3.0) -> DrillResult:
    server: RedisServer | None = None
    try:
        with Drill("redis-outage", target, title=NAME) as drill:
            server = RedisServer(drill.platform.workdir)
            server.start()
            drill.platform.redis_url = server.url
            drill.platform.start_all()
            queued, connected = drill.settled(queued=2, connected=3)
            everyone = queued + connected
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
            settle = timeout + 3 * sweep

            # The sweep's own keys exist (a sweep has run), so the snapshot holds them.
            if not wait_until(lambda: server.client().exists(*SWEEP_KEYS) == 2, timeout=30):
                raise HarnessError("no heartbeat sweep ran against the drill's Redis")

            def graces() -> tuple[int, int]:
                return (
                    drill.log_count("heartbeat sweeps stopped for"),
                    drill.log_count("heartbeat store was reset: ")
                    + drill.log_count("heartbeat store went back to an older copy"),
                )

            # Each return must be met by a grace period of its own: a sweep gap, or a reset
            # if the epoch is gone.
            granted: list[tuple[int, int]] = []
            before = graces()

            # 1. Unreachable, data kept.
            began = now()
            server.snapshot()
            down = time.monotonic()
            kept = _platform_keys(server)
            server.kill()
            pause(factor * timeout)
            server.start()
            outage = time.monotonic() - down
            back = _platform_keys(server)
            lost = sorted(set(kept) - set(back))
            # Judged only once a sweep has met the return (the broker came back too, so
            # the Celery worker reconnects first): then a whole settle more.
            wait_until(lambda: sum(graces()) > sum(before), timeout=settle + 60, interval=0.5)
            pause(settle)
            changes = drill.changes_since(began, everyone)
            drill.check(not changes, f"status changed across the Redis outage: {changes}")
            silent = drill.silent(connected)
            drill.check(not silent, f"heartbeats did not resume after the outage: {silent}")
            drill.result.repetitions += 1
            after = graces()
            granted.append((after[0] - before[0], after[1] - before[1]))
            before = after

            # 2. Back from a snapshot older than the heartbeat timeout.
            keys = [f"activate:hb:{w.pk}" for w in connected]
            client = server.client()
            expiries = [int(client.pttl(key)) for key in keys]
            server.snapshot()
            taken = time.monotonic()
            pause(timeout + 2)
            began = now()
            age = time.monotonic() - taken
            server.kill()
            server.start()
            # Every heartbeat key in the snapshot had expired this long before it was restored.
            stale = age - max(expiries) / 1000
            # Judged only once a sweep has met the return (the broker came back too, so
            # the Celery worker reconnects first): then a whole settle more.
            wait_until(lambda: sum(graces()) > sum(before), timeout=settle + 60, interval=0.5)
            pause(settle)
            changes = drill.changes_since(began, everyone)
            drill.check(not changes, f"status changed after the old snapshot: {changes}")
            silent = drill.silent(connected)
            drill.check(not silent, f"heartbeats did not resume after the old snapshot: {silent}")
            drill.result.repetitions += 1
            after = graces()
            granted.append((after[0] - before[0], after[1] - before[1]))
            for number, (gap, reset) in enumerate(granted, start=1):
                drill.check(
                    gap + reset >= 1,
                    f"return {number} was met by no grace ({gap} gaps, {reset} resets)",
                )
            drill.note(
                f"{len(connected)} connected and {len(queued)} queued workers; Redis killed and "
                f"back with its data after {outage:.1f} s (heartbeat timeout {timeout:g} s; "
                f"platform keys gone on its return, heartbeat keys expired meanwhile aside: "
                f"{[k for k in lost if not k.startswith('activate:hb:')] or 'none'}); "
                f"then restored from a snapshot {age:.1f} s old, its heartbeat keys expired "
                f"{stale:.1f} s before; grace per return (gaps, resets): {granted}; "
                f"no status change within {settle:g} s of either return, every agent beating"
            )
            result = drill.result
    finally:
        if server is not None:
            server.kill()
    return result
