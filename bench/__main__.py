"""Run the benchmarks and print their figures as tables: `python -m bench` (make bench).

    python -m bench                       # all of them
    python -m bench polling api           # some of them
    python -m bench --record docs/benchmarks.md

Numbers are not judged: a missed goal is printed as such and the exit status stays 0. A
benchmark that could not run (cluster down, a process that failed) exits non-zero.
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
from bench.report import Outcome, Table, goals_table, machine_table, write_section

NAMES = ("polling", "submission", "heartbeats", "api", "detection")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "benchmarks", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)} (default: all)"
    )
    parser.add_argument("--record", type=Path, help="also write the run as Markdown here")
    group = parser.add_argument_group("polling")
    group.add_argument("--poll-sizes", type=_ints, default=(1, 100, 1000))
    group.add_argument(
        "--poll-sample",
        type=int,
        default=50,
        help="per-job ssh polls timed for sizes above --poll-full-up-to",
    )
    group.add_argument("--poll-full-up-to", type=int, default=100)
    group = parser.add_argument_group("submission")
    group.add_argument("--submit-count", type=int, default=200)
    group.add_argument("--celery-concurrency", type=int, default=4)
    group.add_argument("--post-concurrency", type=int, default=8)
    group = parser.add_argument_group("heartbeats")
    group.add_argument("--agents", type=_ints, default=(50, 200))
    group.add_argument("--beat-rate", type=float, default=2000)
    group.add_argument("--beat-duration", type=float, default=10)
    group.add_argument(
        "--web-workers", type=int, default=int(os.environ.get("ACTIVATE_WEB_WORKERS", "2"))
    )
    group.add_argument(
        "--web-threads", type=int, default=int(os.environ.get("ACTIVATE_WEB_THREADS", "4"))
    )
    group.add_argument("--load-processes", type=int, default=2)
    group = parser.add_argument_group("api")
    group.add_argument("--api-workers", type=int, default=10_000)
    group.add_argument("--api-requests", type=int, default=200)
    group = parser.add_argument_group("detection")
    group.add_argument("--detect-workers", type=int, default=5)
    args = parser.parse_args(argv)
    unknown = [name for name in args.benchmarks if name not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    return args


def benchmarks(args: argparse.Namespace) -> dict[str, Callable[[TestCluster], Outcome]]:
    from bench import api, detection, heartbeats, polling, submission

    return {
        "polling": lambda t: polling.run(
            t, sizes=args.poll_sizes, sample=args.poll_sample, full_up_to=args.poll_full_up_to
        ),
        "submission": lambda t: submission.run(
            t,
            count=args.submit_count,
            celery_concurrency=args.celery_concurrency,
            post_concurrency=args.post_concurrency,
        ),
        "heartbeats": lambda t: heartbeats.run(
            t,
            agent_counts=args.agents,
            goal_rate=args.beat_rate,
            duration=args.beat_duration,
            web_workers=args.web_workers,
            web_threads=args.web_threads,
            load_processes=args.load_processes,
        ),
        "api": lambda t: api.run(t, workers=args.api_workers, requests=args.api_requests),
        "detection": lambda t: detection.run(t, workers=args.detect_workers),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    chosen = args.benchmarks or list(NAMES)
    try:
        prepare_django()
        target = TestCluster.from_files()
    except HarnessError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    machine = machine_table()
    print(machine.render(), "\n", flush=True)
    runners = benchmarks(args)
    outcomes: list[Outcome] = []
    failed: list[str] = []
    started = time.monotonic()
    for name in chosen:
        print(f"== {name}", flush=True)
        began = time.monotonic()
        try:
            outcome = runners[name](target)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        outcomes.append(outcome)
        for table in outcome.tables:
            print(table.render(), "\n", flush=True)
        print(f"   ({name} took {time.monotonic() - began:.0f} s)\n", flush=True)
    goals = goals_table([goal for outcome in outcomes for goal in outcome.goals])
    print(goals.render())
    load_after = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average at the end: {load_after}; total {time.monotonic() - started:.0f} s")
    if failed:
        print(f"bench: could not run: {', '.join(failed)}", file=sys.stderr)
    if args.record:
        record(args.record, machine, outcomes, goals, load_after, chosen, failed)
    return 1 if failed else 0


def record(
    path: Path,
    machine: Table,
    outcomes: list[Outcome],
    goals: Table,
    load_after: str,
    chosen: list[str],
    failed: list[str],
) -> None:
    lines = [
        "### Recorded run",
        "",
        f"`python -m bench {' '.join(chosen)}` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}; load average at the end: "
        f"{load_after}.",
        "",
        machine.markdown(),
        "",
        goals.markdown(),
        "",
    ]
    for outcome in outcomes:
        for table in outcome.tables:
            lines += [table.markdown(), ""]
    if failed:
        lines += [f"Could not run: {', '.join(failed)}.", ""]
    write_section(path, "recorded run", "\n".join(lines))
    print(f"recorded in {path}")


if __name__ == "__main__":
    sys.exit(main())
