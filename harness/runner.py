"""One runner for the benchmarks and the fault drills (`python -m bench`, `python -m drills`).

A suite names its runs, adds its options, and turns the results into tables; the runner parses
the command line, prepares Django and the cluster, runs the chosen ones in order (one that raises
is reported and the others still run), prints, and records the whole run with ``--record``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from harness import HarnessError
from harness.cluster import SshTarget
from harness.django_setup import prepare_django
from harness.platform import started_processes
from harness.report import Table, machine_table, write_section

R = TypeVar("R")


@dataclass
class Conclusion:
    """What a suite makes of its results."""

    # Printed at the end and recorded.
    tables: list[Table]
    # One line, printed at the end and recorded.
    summary: str
    ok: bool
    # Recorded only (already printed as each run ended).
    details: list[Table] = field(default_factory=list)


class Suite(ABC, Generic[R]):
    # The command (`python -m <name>`), the run's installation id, and the record's marker.
    name: ClassVar[str]
    record_title: ClassVar[str]
    names: ClassVar[tuple[str, ...]]
    doc: ClassVar[str]

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """Options of the suite's runs."""

    @abstractmethod
    def runners(self, args: argparse.Namespace) -> dict[str, Callable[[SshTarget], R]]: ...

    @abstractmethod
    def could_not_run(self, name: str, exc: Exception) -> R | None:
        """The result standing for a run that raised (None: the run is left out)."""

    @abstractmethod
    def show(self, name: str, result: R, took: float) -> None:
        """Print one run's result as soon as it ended."""

    @abstractmethod
    def conclude(self, results: list[R], failed: list[str], elapsed: float) -> Conclusion: ...


def parse(suite: Suite[R], argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {suite.name}",
        description=suite.doc.splitlines()[0],
        epilog=suite.doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "chosen",
        nargs="*",
        metavar="NAME",
        help=f"any of {', '.join(suite.names)} (default: all)",
    )
    parser.add_argument("--record", type=Path, help="also write the run as Markdown here")
    suite.add_options(parser)
    args = parser.parse_args(argv)
    unknown = [name for name in args.chosen if name not in suite.names]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; choose from {', '.join(suite.names)}")
    return args


def run(suite: Suite[R], argv: list[str] | None = None) -> int:
    """Exit status: 0 when the suite concludes ok, 1 when not, 2 when nothing could start."""
    args = parse(suite, argv)
    chosen = args.chosen or list(suite.names)
    try:
        prepare_django(suite.name)
        target = SshTarget.running()
    except HarnessError as exc:
        print(f"{suite.name}: {exc}", file=sys.stderr)
        return 2
    machine = machine_table()
    print(machine.render(), "\n", flush=True)
    runners = suite.runners(args)
    results: list[R] = []
    failed: list[str] = []
    started = time.monotonic()
    for name in chosen:
        print(f"== {name}", flush=True)
        began = time.monotonic()
        try:
            result = runners[name](target)
        except Exception as exc:
            traceback.print_exc()
            failed.append(name)
            stand_in = suite.could_not_run(name, exc)
            if stand_in is None:
                continue
            result = stand_in
        results.append(result)
        suite.show(name, result, time.monotonic() - began)
        for line in started_processes():
            print(f"   {line}", flush=True)
    conclusion = suite.conclude(results, failed, time.monotonic() - started)
    for table in conclusion.tables:
        print(f"\n{table.render()}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{conclusion.summary}; load average at the end: {load}")
    if failed:
        print(f"{suite.name}: could not run: {', '.join(failed)}", file=sys.stderr)
    if args.record:
        record(args.record, suite, chosen, machine, conclusion, load)
    return 0 if conclusion.ok else 1


def record(
    path: Path,
    suite: Suite[R],
    chosen: list[str],
    machine: Table,
    conclusion: Conclusion,
    load: str,
) -> None:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"### {suite.record_title}",
        f"`python -m {suite.name} {' '.join(chosen)}` on {when} on the machine below; "
        f"load average at the end: {load}. {conclusion.summary}.",
        machine.markdown(),
        *(table.markdown() for table in conclusion.tables + conclusion.details),
    ]
    write_section(path, suite.record_title.lower(), "\n\n".join(parts))
    print(f"recorded in {path}")
