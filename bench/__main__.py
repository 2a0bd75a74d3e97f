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
from collections.abc import Callable

from bench import (
    api,
    beats,
    detection,
    files,
    heartbeats,
    polling,
    proxy_upload,
    scale,
    shedding,
    submission,
    terminals,
)
from bench.report import Outcome, goals_table
from harness.cluster import SshTarget
from harness.runner import Conclusion, Suite, run


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


class Benchmarks(Suite[Outcome]):
    name = "bench"
    record_title = "Recorded run"
    names = (
        "polling",
        "submission",
        "heartbeats",
        "api",
        "detection",
        "terminals",
        "proxy",
        "scale",
        "beats",
        "shedding",
        "files",
    )
    doc = __doc__ or ""

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("polling")
        group.add_argument("--poll-sizes", type=_ints, default=(1, 100, 1000))
        group.add_argument(
            "--poll-sample",
            type=int,
            default=50,
            help="per-job ssh polls timed for sizes above --poll-full-up-to",
        )
        group.add_argument("--poll-full-up-to", type=int, default=100)
        group.add_argument(
            "--poll-accounts",
            type=_ints,
            default=(1, 10, 50),
            help="users' own accounts the jobs are spread over",
        )
        group = parser.add_argument_group("submission")
        group.add_argument(
            "--submit-counts",
            type=_ints,
            default=(200, 1000),
            help="workers per race against dask-jobqueue; the first also for the sbatch loops",
        )
        group.add_argument(
            "--submit-schedulers",
            type=lambda text: tuple(part for part in text.split(",") if part),
            default=("slurm", "gridengine"),
            help="the test cluster's schedulers raced against dask-jobqueue (slurm,gridengine)",
        )
        group.add_argument(
            "--submit-repetitions",
            type=int,
            default=5,
            help="rounds of (dask-jobqueue, the platform twice, dask-jobqueue) at each count",
        )
        group.add_argument(
            "--submit-references",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="also the sbatch loops and the in-process costs (--no-submit-references: "
            "the races alone)",
        )
        group.add_argument("--celery-concurrency", type=int, default=4)
        group.add_argument("--post-concurrency", type=int, default=8)
        group.add_argument(
            "--post-rate", type=float, default=20, help="single POSTs per second, for latency"
        )
        group.add_argument("--post-count", type=int, default=200)
        group = parser.add_argument_group("heartbeats")
        group.add_argument("--agents", type=int, default=1000, help="connected agents beating")
        group.add_argument("--beat-connections", type=int, default=50)
        group.add_argument("--beat-duration", type=float, default=12, help="seconds per round")
        group.add_argument("--beat-rounds", type=int, default=2)
        group.add_argument(
            "--server-workers",
            type=int,
            default=int(os.environ.get("ACTIVATE_AGENT_WORKERS", "2")),
            help="processes of each server compared",
        )
        group.add_argument("--django-threads", type=int, default=4)
        group.add_argument("--wrk-threads", type=int, default=2)
        group = parser.add_argument_group("api")
        group.add_argument("--api-workers", type=int, default=10_000)
        group.add_argument("--api-requests", type=int, default=200)
        group = parser.add_argument_group("detection")
        group.add_argument("--detect-workers", type=int, default=5)
        group = parser.add_argument_group("terminals")
        group.add_argument("--terminals", type=int, default=50)
        group.add_argument("--terminal-beat-rate", type=float, default=300)
        group.add_argument("--terminal-rounds", type=int, default=2)
        group = parser.add_argument_group("proxy")
        group.add_argument("--proxy-rounds", type=int, default=3)
        group.add_argument("--proxy-quiet", type=float, default=8, help="seconds per quiet round")
        group.add_argument("--proxy-uploads", type=int, default=4, help="64 MiB uploads per round")
        group = parser.add_argument_group("files")
        group.add_argument("--files-size", type=int, default=1024, help="MiB each way")
        group = parser.add_argument_group("scale")
        group.add_argument("--scale-sweep-sizes", type=_ints, default=(1_000, 10_000))
        group.add_argument("--scale-poll-sizes", type=_ints, default=(1_000, 10_000))
        group.add_argument("--scale-served-sizes", type=_ints, default=(10_000, 100_000))
        group = parser.add_argument_group("beats")
        group.add_argument("--beats-sizes", type=_ints, default=(1_000, 10_000))
        group.add_argument("--beats-steady", type=float, default=30, help="seconds at 1 per 30 s")
        group.add_argument("--beats-burst", type=float, default=25, help="seconds at 10x that")
        group.add_argument("--beats-generators", type=int, default=2, help="load processes")
        group = parser.add_argument_group("shedding")
        group.add_argument("--shed-agents", type=int, default=10_000)
        group.add_argument("--shed-burst", type=float, default=30, help="seconds at 10x")

    def runners(self, args: argparse.Namespace) -> dict[str, Callable[[SshTarget], Outcome]]:
        return {
            "polling": lambda t: polling.run(
                t,
                sizes=args.poll_sizes,
                account_counts=args.poll_accounts,
                sample=args.poll_sample,
                full_up_to=args.poll_full_up_to,
            ),
            "submission": lambda t: submission.run(
                t,
                counts=args.submit_counts,
                schedulers=args.submit_schedulers,
                repetitions=args.submit_repetitions,
                references=args.submit_references,
                celery_concurrency=args.celery_concurrency,
                post_concurrency=args.post_concurrency,
                post_rate=args.post_rate,
                post_count=args.post_count,
            ),
            "heartbeats": lambda t: heartbeats.run(
                t,
                agent_count=args.agents,
                connections=args.beat_connections,
                duration=args.beat_duration,
                rounds=args.beat_rounds,
                server_workers=args.server_workers,
                django_threads=args.django_threads,
                wrk_threads=args.wrk_threads,
            ),
            "api": lambda t: api.run(t, workers=args.api_workers, requests=args.api_requests),
            "detection": lambda t: detection.run(t, workers=args.detect_workers),
            "terminals": lambda t: terminals.run(
                t,
                terminals=args.terminals,
                beat_rate=args.terminal_beat_rate,
                rounds=args.terminal_rounds,
            ),
            "proxy": lambda t: proxy_upload.run(
                t, rounds=args.proxy_rounds, quiet=args.proxy_quiet, uploads=args.proxy_uploads
            ),
            "files": lambda t: files.run(t, size_mib=args.files_size),
            "scale": lambda t: scale.run(
                t,
                sweep_sizes=args.scale_sweep_sizes,
                poll_sizes=args.scale_poll_sizes,
                served_sizes=args.scale_served_sizes,
            ),
            "beats": lambda t: beats.run(
                t,
                sizes=args.beats_sizes,
                steady_duration=args.beats_steady,
                burst_duration=args.beats_burst,
                processes=args.beats_generators,
                server_workers=args.server_workers,
            ),
            "shedding": lambda t: shedding.run(
                t,
                agents_count=args.shed_agents,
                burst=args.shed_burst,
                processes=args.beats_generators,
                server_workers=args.server_workers,
            ),
        }

    def could_not_run(self, name: str, exc: Exception) -> Outcome | None:
        return None

    def show(self, name: str, result: Outcome, took: float) -> None:
        for table in result.tables:
            print(table.render(), "\n", flush=True)
        print(f"   ({name} took {took:.0f} s)\n", flush=True)

    def conclude(self, results: list[Outcome], failed: list[str], elapsed: float) -> Conclusion:
        goals = goals_table([goal for outcome in results for goal in outcome.goals])
        summary = f"total {elapsed:.0f} s"
        if failed:
            summary += f"; could not run: {', '.join(failed)}"
        details = [table for outcome in results for table in outcome.tables]
        return Conclusion([goals], summary, ok=not failed, details=details)


if __name__ == "__main__":
    sys.exit(run(Benchmarks()))
