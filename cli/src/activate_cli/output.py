"""Aligned tables for people, the API's own JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

EMPTY = "-"


def cell(value: Any) -> str:
    if value is None or value == "":
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def when(value: str | None) -> str:
    """An API timestamp in the reader's local time, to the second."""
    if not value:
        return EMPTY
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def idle_for(since: str | None, *, now: datetime | None = None) -> str:
    """How long since ``since`` (an API timestamp), in minutes or hours: ``25m``, ``3h 05m``."""
    if not since:
        return EMPTY
    try:
        moment = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        return since
    minutes = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds() // 60))
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def pairs(items: Sequence[tuple[str, str]]) -> str:
    """One value per line, labels aligned: how a single object is shown."""
    width = max((len(label) for label, _ in items), default=0)
    return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in items)


def emit(out: TextIO, data: Any, fmt: str, render: Callable[[Any], str]) -> None:
    if fmt == "json":
        out.write(json.dumps(data, indent=2) + "\n")
    else:
        out.write(render(data) + "\n")
