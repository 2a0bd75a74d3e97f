"""What tests/e2e, the benchmarks and the fault drills share: the test cluster, the platform as
real processes, waiting, and one runner for bench and drills.

Nothing here imports tests/, bench/ or drills/: they import it.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class HarnessError(Exception):
    """The machine is not ready for a run (no cluster, no PostgreSQL, a process that failed)."""
