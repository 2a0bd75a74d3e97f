"""What a benchmark hands back (tables and goals) and how its figures are written."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.report import Table


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linearly interpolated between the two nearest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def seconds(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.1f} ms"


def millis(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.1f} ms"


def times(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return "-"
    return f"{value:.0f}x" if value >= 10 else f"{value:.2f}x"


def rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}/s"


@dataclass
class Goal:
    benchmark: str
    goal: str
    measured: str
    met: bool


@dataclass
class Outcome:
    """What one benchmark hands back: its tables and its goals."""

    tables: list[Table] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)


def goals_table(goals: list[Goal]) -> Table:
    table = Table("Goals", ["benchmark", "goal", "measured", "met"], align="llll")
    for goal in goals:
        table.add(goal.benchmark, goal.goal, goal.measured, "yes" if goal.met else "NO")
    return table


def rss(pids: Iterable[int]) -> int:
    """Resident memory of these processes, in bytes (those gone count nothing)."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
