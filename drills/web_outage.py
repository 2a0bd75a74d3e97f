"""Stop the web server for three heartbeat timeouts while one node dies: nobody is stopped for
the platform's own deafness, the dead node is still found once the platform hears again.

The server the agents call back on goes (the web server, and the agents' own server when the
platform runs one); Celery's worker and beat keep running, so the heartbeat sweep runs all along
and its ping of the agents' endpoint fails. One agent is frozen (SIGSTOP) a moment into the
outage: after the servers return it must be stopped within the heartbeat timeout plus one sweep
(and a small margin), while the other connected workers stay connected past a further timeout.
"""

from __future__ import annotations

import time

from drills.drill import Drill, DrillResult, now, pause
from harness.agents import freeze_agent, thaw
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_until

NAME = "Stop the web server for 3x the heartbeat timeout, a node dying meanwhile"
# Celery picking up the sweep task and the last sweep's own time: what "a small margin" allows.
MARGIN = 2.0


def agent_servers(platform: Platform) -> list[str]:
    """The running processes that agents call back on."""
    return [name for name in ("agents", "web") if name in platform.processes]


def start_server(platform: Platform, name: str) -> None:
    if name == "agents":
        platform.start_agents()
    else:
        platform.start_web()


def run(target: SshTarget, *, factor: float = 3.0) -> DrillResult:
    from workers_app.models import WorkerEvent
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    frozen: list[int] = []
    with Drill("web-outage", target, title=NAME) as drill:
        platform = drill.platform
        platform.start_all()
        queued, connected = drill.settled(queued=2, connected=4)
        victim, others = connected[0], connected[1:]
        timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
        sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
        servers = agent_servers(platform)
        deaf_before = drill.log_count("agents cannot reach the platform")
        try:
            began = now()
            down = time.monotonic()
            for name in servers:
                platform.stop(name)
            pause(1)
            frozen = freeze_agent(victim.public_id)
            drill.check(bool(frozen), f"no agent found to freeze for {victim.public_id}")
            pause(max(0.0, factor * timeout - (time.monotonic() - down)))
            changes = drill.changes_since(began, connected + queued)
            drill.check(not changes, f"status changed while the web server was down: {changes}")
            during = drill.statuses(connected + queued)
            for name in servers:
                start_server(platform, name)
            back_at = now()
            outage = time.monotonic() - down
            deaf = drill.log_count("agents cannot reach the platform") - deaf_before
            drill.check(deaf > 0, "the sweep never found the agents' endpoint unreachable")
            drill.result.repetitions = 1
            # The victim: stopped "Worker disconnected" within timeout + one sweep of the return.
            window = timeout + sweep + MARGIN
            stopped = wait_until(
                lambda: WorkerEvent.objects.filter(
                    worker=victim.pk, old_status=S.CONNECTED, at__gte=back_at
                ).exists(),
                timeout=window + 10,
            )
            event = (
                WorkerEvent.objects.filter(worker=victim.pk, old_status=S.CONNECTED)
                .order_by("at")
                .first()
            )
            detected = (event.at - back_at).total_seconds() if event else float("nan")
            drill.check(
                stopped and event is not None and event.at >= back_at,
                f"the frozen node was not stopped after the web server returned "
                f"(events: {drill.changes_since(began, [victim])})",
            )
            if event is not None:
                drill.check(
                    event.reason == "Worker disconnected",
                    f"frozen node ended with {event.reason!r}, not 'Worker disconnected'",
                )
                drill.check(
                    detected <= window,
                    f"frozen node stopped {detected:.1f} s after the return, past "
                    f"timeout + sweep + {MARGIN:g} s = {window:g} s",
                )
            # The others: still connected a further timeout (and a few sweeps) later.
            pause(max(0.0, timeout + 3 * sweep - (now() - back_at).total_seconds()))
            changes = drill.changes_since(began, others + queued)
            drill.check(not changes, f"healthy workers changed status: {changes}")
            silent = drill.silent(others)
            drill.check(not silent, f"agents did not beat again after the return: {silent}")
        finally:
            thaw(frozen)
        drill.note(
            f"{len(connected)} connected and {len(queued)} queued workers; "
            f"{' and '.join(servers)} down {outage:.1f} s (heartbeat timeout {timeout:g} s), "
            f"{deaf} sweeps found the agents' endpoint unreachable; statuses during: "
            f"{sorted(set(during.values()))}; one agent frozen 1 s in: stopped "
            f"'{event.reason if event else '-'}' {detected:.1f} s after the return "
            f"(limit {window:g} s); the other {len(others)} connected and beating "
            f"{timeout + 3 * sweep:g} s after it, no other status change"
        )
        return drill.result
