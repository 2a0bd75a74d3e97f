"""A node's clock stepped 10 minutes forward and back under the agents of real jobs: their
workers stay connected.

The whole platform runs (beat and the sweeper with the tests' fast timeouts: 1 s beats, 6 s
heartbeat timeout, a sweep every second, the hearing probe on as shipped), so a lapse would
stop a worker. Two workers are requested through the API from the test cluster's Slurm; their
jobs' agents run on the node with a stepped time.time() (harness/clocks.py JobClocks: the
cluster account's usercustomize, for this platform's agents only). One starts on the node's
true clock, the other 10 minutes ahead (its first call refused for its time, a signed 425, then
re-based). Both clocks are then stepped +10 min, back to 0, -10 min and back, each held past the
heartbeat timeout. Checks, each hold: no sample (every 0.1 s) found a worker's liveness key
missing or its status not connected, each worker's beats seen landing, no beat refused, and the
heartbeat sweep completing meanwhile with the platform not deaf and no breaker open (the sweep
could have stopped a silent worker). At the end: the only call refused for its time was the
late starter's first, one re-base in its agent's log and none in the other's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drills.drill import Drill, DrillResult
from harness import HarnessError
from harness.clocks import JobClocks, beats_answered, rebases, watch
from harness.cluster import SshTarget
from harness.objects import RUN_ENVIRONMENT

if TYPE_CHECKING:
    from workers_app.models import Worker

NAME = "A node's clock stepped 10 min forward and back"
STEP = 600.0
SCHEDULE = (STEP, 0.0, -STEP, 0.0)


def run(target: SshTarget) -> DrillResult:
    with Drill("clock-step", target, title=NAME) as drill:
        platform = drill.platform
        with JobClocks(target, platform.agent_url) as clocks:
            platform.start_all()
            on_time = _connected(drill, clocks, offset=0.0)
            if on_time is None:
                raise HarnessError(
                    f"a worker on the node's true clock did not connect\n{platform.logs()}"
                )
            workers = {"on time": on_time}
            ahead = _connected(drill, clocks, offset=STEP)
            if ahead is not None:
                workers["started ahead"] = ahead
            drill.check(ahead is not None, "the worker started 10 min ahead did not connect")
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
            beat = drill.knob("ACTIVATE_HEARTBEAT_INTERVAL")
            hold = timeout + 4 * sweep
            steps = []
            for offset in SCHEDULE:
                for worker in workers.values():
                    clocks.clock(worker.public_id).step_to(offset)
                steps.append(_hold(drill, workers, offset, hold, beat, sweep))
            drill.result.repetitions = len(SCHEDULE)
            logs = {name: clocks.agent_log(w.public_id) for name, w in workers.items()}
        refused = rebases(platform.workdir / "agents.log")
        drill.check(
            [path for path, _ in refused] == ["connect"],
            f"calls refused for their time: {refused[:5]} ({len(refused)}; expected one, the "
            "late starter's connect)",
        )
        rebased = {name: log.count("re-based") for name, log in logs.items()}
        drill.check(
            rebased == {name: int(name == "started ahead") for name in logs},
            f"re-bases in the agents' logs: {rebased} (expected 1 for the late starter only)",
        )
        for name, log in logs.items():
            drill.check(log.count("connected as") == 1, f"{name} connected again: {log[-500:]}")
        took = refused[0][1] if refused else None
        drill.note(
            f"{beat:g} s beats, {timeout:g} s timeout, a sweep every {sweep:g} s, each clock held "
            f"{hold:g} s: "
            + "; ".join(steps)
            + f". Calls refused for their time (signed 425): {len(refused)}; the first "
            + (f"re-based and answered 200 {took:.3f} s after it" if took is not None else "never")
        )
        return drill.result


def _connected(drill: Drill, clocks: JobClocks, *, offset: float) -> Worker | None:
    """A worker of the run environment whose agent starts ``offset`` seconds off, once
    connected (None if it is not within 90 s)."""
    from workers_app.statuses import WorkerStatus

    clocks.start_at(offset)
    (worker,) = drill.request(RUN_ENVIRONMENT)
    # Its own clock from now on, whenever its agent starts; later starters follow start_at.
    clocks.clock(worker.public_id).step_to(offset)
    if drill.wait_status([worker], {WorkerStatus.CONNECTED}, timeout=90):
        return worker
    return None


def _hold(
    drill: Drill, workers: dict[str, Worker], offset: float, hold: float, beat: float, sweep: float
) -> str:
    """Hold the clocks at ``offset`` for ``hold`` seconds, watching; the step's figures."""
    from workers_app.liveness import DEAF_KEY, Breakers

    metrics = drill.platform.workdir / "metrics"
    before = beats_answered(metrics)
    seen = watch([w.pk for w in workers.values()], hold)
    answered = beats_answered(metrics) - before
    step = f"{offset / 60:+.0f} min" if offset else "back to 0"
    for name, worker in workers.items():
        drill.check(
            seen.lapses[worker.pk] == 0,
            f"{step}: {name}'s worker lapsed in {seen.lapses[worker.pk]} samples "
            f"(seen {sorted(seen.left.get(worker.pk, set()))})",
        )
        drill.check(
            seen.beats[worker.pk] >= hold / beat - 2,
            f"{step}: {seen.beats[worker.pk]} of {name}'s beats seen in {hold:g} s",
        )
    drill.check(not answered.refused, f"{step}: beats refused {answered.refused}")
    client = drill.platform.redis_client()
    drill.check(
        seen.sweeps >= hold / sweep / 2,
        f"{step}: {seen.sweeps} heartbeat sweeps completed in {hold:g} s",
    )
    drill.check(not client.exists(DEAF_KEY), f"{step}: the platform found itself deaf")
    drill.check(not Breakers(client).all_open(), f"{step}: a breaker opened")
    beats = ", ".join(f"{name} {seen.beats[w.pk]}" for name, w in workers.items())
    return (
        f"{step}: beats answered {answered.received:.0f}, refused "
        f"{sum(answered.refused.values()):.0f}, seen landing {beats}; "
        f"{seen.sweeps} sweeps"
    )
