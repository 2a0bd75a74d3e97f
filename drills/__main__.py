"""Run the fault drills and print a pass/fail table: `python -m drills` (make drills).

    python -m drills                      # all of them
    python -m drills celery_kill deletion # some of them

Exits non-zero when any check of any drill fails (or a drill could not run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.harness import HarnessError, TestCluster, prepare_django
from bench.report import Table, machine_table, write_section
from drills.harness import DrillResult

NAMES = (
    "celery_kill",
    "redis_restart",
    "ssh_outage",
    "slurmctld_outage",
    "restarts",
    "two_beats",
    "deletion",
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m drills", description=__doc__.splitlines()[0])
    parser.add_argument(
        "drills", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)} (default: all)"
    )
    parser.add_argument("--record", type=Path, help="also write the table as Markdown here")
    parser.add_argument("--kills", type=int, default=8, help="Celery worker kills")
    parser.add_argument("--redis-restarts", type=int, default=3)
    parser.add_argument(
        "--outage", type=float, default=20, help="seconds sshd and slurmctld stay stopped"
    )
    parser.add_argument("--restarts", type=int, default=3, help="web + Celery worker restarts")
    parser.add_argument("--beats-for", type=float, default=40, help="seconds two beats run")
    parser.add_argument(
        "--mid-submit", type=int, default=10, help="deletions right after a request"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.drills if name not in NAMES]
    if unknown:
        parser.error(f"unknown drill {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    return args


def drills(args: argparse.Namespace) -> dict[str, Callable[[TestCluster], DrillResult]]:
    from drills import (
        celery_kill,
        deletion,
        redis_restart,
        restarts,
        slurmctld_outage,
        ssh_outage,
        two_beats,
    )

    return {
        "celery_kill": lambda t: celery_kill.run(t, kills=args.kills),
        "redis_restart": lambda t: redis_restart.run(t, restarts=args.redis_restarts),
        "ssh_outage": lambda t: ssh_outage.run(t, outage=args.outage),
        "slurmctld_outage": lambda t: slurmctld_outage.run(t, outage=args.outage),
        "restarts": lambda t: restarts.run(t, restarts=args.restarts),
        "two_beats": lambda t: two_beats.run(t, duration=args.beats_for),
        "deletion": lambda t: deletion.run(t, mid_submit=args.mid_submit),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    chosen = args.drills or list(NAMES)
    try:
        prepare_django("drills")
        target = TestCluster.from_files()
    except HarnessError as exc:
        print(f"drills: {exc}", file=sys.stderr)
        return 2
    machine = machine_table()
    runners = drills(args)
    results: list[DrillResult] = []
    started = time.monotonic()
    for name in chosen:
        print(f"== {name}", flush=True)
        began = time.monotonic()
        try:
            result = runners[name](target)
        except Exception as exc:
            traceback.print_exc()
            result = DrillResult(name, 0, failures=[f"could not run: {exc}"[:500]])
        results.append(result)
        verdict = "pass" if result.passed else "FAIL"
        print(f"   {verdict} in {time.monotonic() - began:.0f} s", flush=True)
        for line in result.failures:
            print(f"   failed: {line}", flush=True)
    table = Table(
        "Fault drills", ["drill", "repetitions", "result", "details"], align="lrll", wrap_last=70
    )
    for result in results:
        table.add(
            result.drill,
            result.repetitions,
            "pass" if result.passed else "FAIL",
            "; ".join(result.failures + result.details),
        )
    print()
    print(table.render())
    failed = [r.drill for r in results if not r.passed]
    summary = (
        f"{len(results) - len(failed)} passed, {len(failed)} failed "
        f"({time.monotonic() - started:.0f} s)"
    )
    print(f"\n{summary}")
    if args.record:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        text = "\n".join(
            [
                "### Recorded drills",
                "",
                f"`python -m drills {' '.join(chosen)}` on "
                f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} on the machine below; "
                f"load average at the end: {load}. Result: {summary}.",
                "",
                table.markdown(),
                "",
                machine.markdown(),
            ]
        )
        write_section(args.record, "recorded drills", text)
        print(f"recorded in {args.record}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
