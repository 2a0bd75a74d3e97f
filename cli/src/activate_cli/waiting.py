"""Waiting on the platform: poll, show each new line of progress, ride out a short outage."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from activate_cli.errors import CliError, Unreachable

POLL_ENV = "PW_POLL_INTERVAL"
DEFAULT_POLL_SECONDS = 2.0
# While waiting, the platform may restart or the network blip; give up only after this long.
WAIT_OUTAGE_SECONDS = 120.0

T = TypeVar("T")


def poll_interval() -> float:
    raw = os.environ.get(POLL_ENV)
    if not raw:
        return DEFAULT_POLL_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise CliError(f"{POLL_ENV} must be a positive number of seconds, not {raw!r}")
    return seconds


def poll(
    current: T,
    fetch: Callable[[], T],
    *,
    progress: Callable[[T], str],
    finished: Callable[[T], bool],
) -> T:
    """Fetch anew until ``finished`` (which raises to end the wait with an error) says so,
    printing ``progress`` to stderr whenever it changes."""
    interval = poll_interval()
    shown = ""
    outage_since: float | None = None
    while True:
        line = progress(current)
        if line != shown:
            print(line, file=sys.stderr, flush=True)
            shown = line
        if finished(current):
            return current
        time.sleep(interval)
        try:
            current = fetch()
            outage_since = None
        except Unreachable as exc:
            now = time.monotonic()
            if outage_since is None:
                outage_since = now
                print(f"{exc}; still trying", file=sys.stderr, flush=True)
            elif now - outage_since > WAIT_OUTAGE_SECONDS:
                raise
