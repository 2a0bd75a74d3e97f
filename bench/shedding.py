"""Overload shed, not collapse: connected agents beating the agents' server as the node agent
does (a kept connection each, a signed 503 "retry after N s" waited out with jitter), at their
steady rate, then ten times it, then steady again, with the heartbeat sweep running.

- The server: `scripts/start.sh agents` with production settings (bench/heartbeats.py starts it),
  its admission as shipped (ACTIVATE_AGENT_BEAT_BUDGET_MS, ACTIVATE_AGENT_BEATS_IN_FLIGHT).
- The agents: made and connected as bench/beats.py makes them; each beats at its own phase,
  every 30 s, every 3 s during the burst, from bench/shed_load.py processes (uvloop).
- The sweep: workers_app.sweeps.sweep_heartbeats in this process every ACTIVATE_SWEEP_INTERVAL,
  against the run's Redis and PostgreSQL (the hearing probe off: the server is known to answer).
- Figures: the accepted beats' p99 (from each beat's due time, the generator's lateness
  included) in the burst and overall, the beats shed, the workers the sweeps stopped, and how
  long after the burst the server was back to steady: the end of the last second in which a
  beat was shed or the accepted beats' p99 was over 100 ms.
"""

from __future__ import annotations

import json
import random
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.beats import BURST, INTERVAL, LEAD, Agent, _connect, _stagger_seen, _workers
from bench.heartbeats import _group_cpu, _start_ours
from bench.report import Goal, Outcome, Table, millis, percentile
from harness import REPO, HarnessError
from harness.cluster import SshTarget
from harness.objects import forget_workers, start_afresh
from harness.platform import NO_RECONCILE, PRODUCTION_KNOBS, Platform

NAME = "shedding"
GOAL_P99 = 0.100
ACCEPTED = "200"
SHED = "503"


@dataclass
class Shedding:
    agents: int
    steady: float
    burst: float
    after: float
    beats: int
    accepted: int
    shed: int
    failures: dict[str, int]
    p99_burst: float
    p99_all: float
    p99_phases: list[
        tuple[str, float]
    ]  # accepted p99 by phase (steady, burst, each interval after)
    p50_all: float
    server_p99_burst: float  # from sending to the answer: the generator's lateness left out
    late_p99_burst: float  # how late the generators sent, in the burst
    stopped: int
    sweeps: int
    forgiven: int  # silent workers a sweep found while the platform had shed lately
    back_after: float  # seconds after the burst's end
    server_cpu: float
    generator_cpu: float
    recorded_shed: int  # ShedRecord's total


class Sweeping:
    """The heartbeat sweep every sweep interval while the load runs."""

    def __init__(self, worker_ids: list[int]) -> None:
        self.worker_ids = worker_ids
        self.stopped = 0
        self.sweeps = 0
        self.forgiven = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from django.conf import settings
        from django.db import connection
        from django.test import override_settings

        from workers_app import sweeps
        from workers_app.liveness import Liveness, ShedRecord
        from workers_app.models import Worker
        from workers_app.statuses import WorkerStatus

        with override_settings(ACTIVATE_HEARING_PROBE=False):
            while not self.stopping.wait(settings.ACTIVATE_SWEEP_INTERVAL):
                connected = list(
                    Worker.objects.filter(
                        pk__in=self.worker_ids, status=WorkerStatus.CONNECTED
                    ).values_list("pk", flat=True)
                )
                silent = len(connected) - len(Liveness().alive(connected))
                if silent and ShedRecord().shed_lately():
                    self.forgiven = max(self.forgiven, silent)
                self.stopped += sweeps.sweep_heartbeats()
                self.sweeps += 1
        connection.close()

    def __enter__(self) -> Sweeping:
        from workers_app.liveness import Liveness, SweepRecord

        Liveness().claim_reset()
        # As agents beating since their connect have them (the first connected 2.5 minutes
        # before the last here, silent meanwhile), and no gap since an earlier run's last sweep.
        Liveness().beat_many(self.worker_ids)
        SweepRecord().note_sweep(time.time())
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join()


def _plans(
    agents: list[Agent],
    url: str,
    workdir: Path,
    *,
    processes: int,
    steady: float,
    burst: float,
    after: float,
    rng: random.Random,
) -> list[Path]:
    host, port = url.removeprefix("http://").split(":")
    shares: list[list[list[object]]] = [[] for _ in range(processes)]
    for number, agent in enumerate(agents):
        signed = agent.signed
        phase = rng.uniform(0, INTERVAL)
        shares[number % processes].append([signed.public_id, signed.key_id, signed.key, phase])
    start = time.time() + LEAD + 0.5 * processes
    plans = []
    for number, share in enumerate(shares):
        plan = workdir / f"shed-plan-{number}.json"
        said = {
            "host": host, "port": int(port), "start": start, "end": steady + burst + after,
            "interval": INTERVAL, "burst": [steady, steady + burst, INTERVAL / BURST],
            "agents": share,
        }  # fmt: skip
        plan.write_text(json.dumps(said))
        plans.append(plan)
    return plans


def _back_after(beats: list[list[object]], burst_end: float) -> float:
    """Seconds from the burst's end to the end of the last second (by answer time) that was not
    steady: a beat shed in it, or its accepted beats' p99 over the goal."""
    seconds: dict[int, list[float]] = {}
    shed: set[int] = set()
    for due, _, answered, status in beats:
        assert isinstance(due, float) and isinstance(answered, float)
        second = int(answered)
        if status == SHED:
            shed.add(second)
        elif status == ACCEPTED:
            seconds.setdefault(second, []).append(answered - due)
    unsteady = shed | {s for s, took in seconds.items() if percentile(took, 99) > GOAL_P99}
    last = max((s for s in unsteady if s + 1 > burst_end), default=None)
    return 0.0 if last is None else last + 1 - burst_end


def run(
    target: SshTarget,
    *,
    agents_count: int = 10_000,
    steady: float = 30,
    burst: float = 30,
    after: float = 2 * INTERVAL,
    processes: int = 2,
    server_workers: int = 2,
    seed: int = 39,
) -> Outcome:
    from workers_app.liveness import ShedRecord
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    start_afresh(target)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="bench-shed-"))
    platform = Platform(workdir=workdir, knobs={**PRODUCTION_KNOBS, **NO_RECONCILE})
    try:
        secret_key = secrets.token_urlsafe(40)
        ours = _start_ours(platform, server_workers, secret_key)
        agents = _workers(agents_count, 0, secret_key)
        took = _connect(agents, platform.agent_url)
        print(f"  shedding: {agents_count:,} agents connected in {took:.0f} s", flush=True)
        _stagger_seen(agents, rng)
        record = ShedRecord()
        shed_before = record.total()
        plans = _plans(
            agents, platform.agent_url, workdir, processes=processes, steady=steady,
            burst=burst, after=after, rng=rng,
        )  # fmt: skip
        outs = [plan.with_suffix(".out") for plan in plans]
        with Sweeping([agent.worker_id for agent in agents]) as sweeping:
            cpu_before = _group_cpu(ours.pid)
            generators = [
                subprocess.Popen(
                    [sys.executable, "-m", "bench.shed_load", str(plan), str(out)], cwd=REPO
                )
                for plan, out in zip(plans, outs, strict=True)
            ]
            codes = [g.wait(timeout=steady + burst + after + 120) for g in generators]
            server_cpu = _group_cpu(ours.pid) - cpu_before
        results = [json.loads(out.read_text()) for out in outs]
        for code, result in zip(codes, results, strict=True):
            if code != 0 or "error" in result:
                raise HarnessError(f"shed load failed: {result.get('error', code)}")
        time.sleep(1.5)  # the last second's sheds noted
        recorded = record.total() - shed_before
        stopped = Worker.objects.filter(
            pk__in=[agent.worker_id for agent in agents], status=WorkerStatus.STOPPED
        ).count()
    finally:
        platform.stop_all()
        forget_workers()
    beats = [beat for result in results for beat in result["beats"]]
    (workdir / "shed-beats.json").write_text(json.dumps(beats))
    accepted = [answered - due for due, _, answered, status in beats if status == ACCEPTED]
    burst_beats = [
        (due, sent, answered)
        for due, sent, answered, status in beats
        if status == ACCEPTED and steady <= due < steady + burst
    ]
    in_burst = [answered - due for due, _, answered in burst_beats]
    failures: dict[str, int] = {}
    for _, _, _, status in beats:
        if status not in (ACCEPTED, SHED):
            failures[status] = failures.get(status, 0) + 1
    phases = [("steady before", 0.0, steady), ("burst", steady, steady + burst)]
    start = steady + burst
    while start < steady + burst + after:
        end = min(start + INTERVAL, steady + burst + after)
        phases.append((f"after, {start - steady - burst:g}-{end - steady - burst:g} s", start, end))
        start = end
    p99_phases = [
        (name, percentile(
            [answered - due for due, _, answered, status in beats
             if status == ACCEPTED and begin <= due < end], 99,
        ))
        for name, begin, end in phases
    ]  # fmt: skip
    measured = Shedding(
        agents=agents_count, steady=steady, burst=burst, after=after, beats=len(beats),
        accepted=len(accepted), shed=sum(1 for b in beats if b[3] == SHED), failures=failures,
        p99_burst=percentile(in_burst, 99), p99_all=percentile(accepted, 99),
        p99_phases=p99_phases,
        p50_all=percentile(accepted, 50),
        server_p99_burst=percentile([answered - sent for _, sent, answered in burst_beats], 99),
        late_p99_burst=percentile([sent - due for due, sent, _ in burst_beats], 99),
        stopped=max(stopped, sweeping.stopped),
        sweeps=sweeping.sweeps, forgiven=sweeping.forgiven,
        back_after=_back_after(beats, steady + burst), server_cpu=server_cpu,
        generator_cpu=sum(result["cpu"] for result in results), recorded_shed=recorded,
    )  # fmt: skip
    print(
        f"  shedding: {agents_count:,} agents, {BURST}x burst: accepted p99 "
        f"{millis(measured.p99_burst)} in the burst, {millis(measured.p99_all)} overall; "
        f"shed {measured.shed:,} (noted {recorded:,}); stopped {measured.stopped}; back to "
        f"steady {measured.back_after:.0f} s after the burst (every beat: "
        f"{workdir / 'shed-beats.json'})",
        flush=True,
    )
    for name, p99 in p99_phases:
        print(f"  shedding: accepted p99 {name}: {millis(p99)}", flush=True)
    return _outcome(measured, server_workers, processes)


def _outcome(m: Shedding, server_workers: int, processes: int) -> Outcome:
    from django.conf import settings

    span = m.steady + m.burst + m.after
    table = Table(
        "Shedding: a 10x burst, agents waiting out the server's signed retry-after",
        ["agents", "phases", "beats", "accepted", "shed", "failed", "accepted p50",
         "accepted p99 (burst)", "accepted p99 (all)", "workers stopped", "back to steady",
         "server CPU", "generator CPU"],
        align="rlrrrrrrrrrrr",
    )  # fmt: skip
    table.add(
        f"{m.agents:,}",
        f"{m.steady:g} s steady, {m.burst:g} s at {BURST}x, {m.after:g} s steady",
        f"{m.beats:,}",
        f"{m.accepted:,}",
        f"{m.shed:,}",
        ", ".join(f"{n} {s}" for s, n in sorted(m.failures.items())) or "0",
        millis(m.p50_all),
        millis(m.p99_burst),
        millis(m.p99_all),
        f"{m.stopped} of {m.agents:,} ({m.sweeps} sweeps)",
        f"{m.back_after:.0f} s after the burst",
        f"{m.server_cpu / span:.0%} of a core",
        f"{m.generator_cpu / span:.0%} of a core",
    )
    table.notes += [
        f"agents' server: scripts/start.sh agents, {server_workers} uvicorn processes, "
        "activate.settings.prod, admission as shipped (a "
        f"{settings.ACTIVATE_AGENT_BEAT_BUDGET_MS:g} ms budget, "
        f"{settings.ACTIVATE_AGENT_BEATS_IN_FLIGHT} beats in flight).",
        "accepted p99 by the phase the beats were due in: "
        + ", ".join(f"{name} {millis(p99)}" for name, p99 in m.p99_phases)
        + ".",
        f"load: {processes} processes of bench/shed_load.py (uvloop) on the same 2 cores; each "
        "agent on a kept connection, a beat signed when due (the node agent's signing), every "
        f"{INTERVAL:g} s ({INTERVAL / BURST:g} s in the burst) at its own phase; told to retry "
        "after N s, it waits N plus up to half again.",
        "latency: from the beat's due time to its whole answer read; back to steady: from the "
        "burst's end to the end of the last second in which a beat was shed or the accepted "
        "beats' p99 was over 100 ms.",
        f"in the burst, the accepted beats' p99 from sending to answer (the generators' "
        f"lateness left out) {millis(m.server_p99_burst)}; the generators sent them at most "
        f"{millis(m.late_p99_burst)} late (p99).",
        f"the server noted {m.recorded_shed:,} beats shed in Redis (ShedRecord); the sweeps "
        f"found at most {m.forgiven:,} silent workers while it had shed lately, and stopped "
        f"{m.stopped}.",
    ]
    goal = Goal(
        NAME,
        f"a {BURST}x burst over {m.agents:,} agents at a {INTERVAL:g} s interval: accepted p99 "
        f"< {GOAL_P99 * 1000:.0f} ms, the rest shed, 0 workers stopped, back to steady within "
        f"two intervals",
        f"accepted p99 {millis(m.p99_burst)} (burst), shed {m.shed:,}, stopped {m.stopped}, "
        f"back {m.back_after:.0f} s after",
        m.p99_burst < GOAL_P99
        and m.stopped == 0
        and not m.failures
        and m.back_after <= 2 * INTERVAL,
    )
    return Outcome([table], [goal])
