"""Run the fault drills and print a pass/fail table: `python -m drills` (make drills).

    python -m drills                      # all of them
    python -m drills celery_kill deletion # some of them

Exits non-zero when any check of any drill fails (or a drill could not run).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from drills import (
    beat_failover,
    broker_outage,
    celery_kill,
    clock_step,
    deletion,
    exec_flood,
    host_cut_off,
    host_loss,
    paused_holder,
    postgres_failover,
    postgres_outage,
    redis_failover,
    redis_outage,
    redis_restart,
    restarts,
    slow_polls,
    slurmctld_outage,
    ssh_outage,
    two_beats,
    web_outage,
)
from drills.drill import DrillResult
from harness.cluster import SshTarget
from harness.report import Table
from harness.runner import Conclusion, Suite, run


class Drills(Suite[DrillResult]):
    name = "drills"
    record_title = "Recorded drills"
    names = (
        "celery_kill",
        "redis_restart",
        "ssh_outage",
        "slurmctld_outage",
        "restarts",
        "two_beats",
        "deletion",
        "web_outage",
        "redis_outage",
        "postgres_outage",
        "broker_outage",
        "exec_flood",
        "slow_polls",
        "beat_failover",
        "host_loss",
        "host_cut_off",
        "redis_failover",
        "postgres_failover",
        "paused_holder",
        "clock_step",
    )
    doc = __doc__ or ""

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--kills", type=int, default=8, help="Celery worker kills")
        parser.add_argument("--redis-restarts", type=int, default=3)
        parser.add_argument(
            "--outage", type=float, default=20, help="seconds sshd and slurmctld stay stopped"
        )
        parser.add_argument("--restarts", type=int, default=3, help="web + Celery worker restarts")
        parser.add_argument("--host-losses", type=int, default=3, help="hosts lost in turn")
        parser.add_argument("--beats-for", type=float, default=40, help="seconds two beats run")
        parser.add_argument(
            "--mid-submit", type=int, default=10, help="deletions right after a request"
        )
        parser.add_argument(
            "--sick-for",
            type=float,
            default=3,
            help="heartbeat timeouts the web server, Redis or PostgreSQL stays down",
        )
        parser.add_argument(
            "--commands", type=int, default=50, help="long commands at once in exec_flood"
        )
        parser.add_argument(
            "--sweeps-on-worker",
            action="store_true",
            help="slow_polls without the sweeper (the sweeps on the shared worker): should fail",
        )

    def runners(self, args: argparse.Namespace) -> dict[str, Callable[[SshTarget], DrillResult]]:
        return {
            "celery_kill": lambda t: celery_kill.run(t, kills=args.kills),
            "redis_restart": lambda t: redis_restart.run(t, restarts=args.redis_restarts),
            "ssh_outage": lambda t: ssh_outage.run(t, outage=args.outage),
            "slurmctld_outage": lambda t: slurmctld_outage.run(t, outage=args.outage),
            "restarts": lambda t: restarts.run(t, restarts=args.restarts),
            "two_beats": lambda t: two_beats.run(t, duration=args.beats_for),
            "deletion": lambda t: deletion.run(t, mid_submit=args.mid_submit),
            "web_outage": lambda t: web_outage.run(t, factor=args.sick_for),
            "redis_outage": lambda t: redis_outage.run(t, factor=args.sick_for),
            "postgres_outage": lambda t: postgres_outage.run(t, factor=args.sick_for),
            "broker_outage": lambda t: broker_outage.run(t, factor=args.sick_for),
            "exec_flood": lambda t: exec_flood.run(t, commands=args.commands),
            "slow_polls": lambda t: slow_polls.run(t, sweeps_on_worker=args.sweeps_on_worker),
            "beat_failover": lambda t: beat_failover.run(t),
            "host_loss": lambda t: host_loss.run(t, rounds=args.host_losses),
            "host_cut_off": lambda t: host_cut_off.run(t),
            "redis_failover": lambda t: redis_failover.run(t),
            "paused_holder": lambda t: paused_holder.run(t),
            "postgres_failover": lambda t: postgres_failover.run(t),
            "clock_step": lambda t: clock_step.run(t),
        }

    def could_not_run(self, name: str, exc: Exception) -> DrillResult:
        return DrillResult(name, 0, failures=[f"could not run: {exc}"[:500]])

    def show(self, name: str, result: DrillResult, took: float) -> None:
        print(f"   {'pass' if result.passed else 'FAIL'} in {took:.0f} s", flush=True)
        for line in result.failures:
            print(f"   failed: {line}", flush=True)

    def conclude(self, results: list[DrillResult], failed: list[str], elapsed: float) -> Conclusion:
        table = Table(
            "Fault drills",
            ["drill", "repetitions", "result", "details"],
            align="lrll",
            wrap_last=70,
        )
        for result in results:
            table.add(
                result.drill,
                result.repetitions,
                "pass" if result.passed else "FAIL",
                "; ".join(result.failures + result.details),
            )
        failing = [r.drill for r in results if not r.passed]
        summary = (
            f"Result: {len(results) - len(failing)} passed, {len(failing)} failed ({elapsed:.0f} s)"
        )
        return Conclusion([table], summary, ok=not failing)


if __name__ == "__main__":
    sys.exit(run(Drills()))
