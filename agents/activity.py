"""What an agent's low-rate activity report says: how busy its job's processes were.

Some beats (one every ACTIVATE_ACTIVITY_INTERVAL seconds) carry, next to "worker", the CPU
seconds and I/O bytes the job's own processes used over a span, and the same per session
launcher on the node. The beat's Redis round trip stores it (beats.BEAT_SCRIPT); nothing
else of the heartbeat path changes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from agents.errors import AgentRefused

FIELDS = frozenset({"span", "cpu", "io", "sessions"})
MAX_SESSIONS = 30
SESSION_ENTRY = re.compile(r"^(?P<id>[a-z0-9]{1,32}):(?P<cpu>[0-9.]{1,16}):(?P<io>[0-9]{1,20})$")
LONGEST_SPAN = 7 * 86400.0


@dataclass(frozen=True)
class ActivityReport:
    span: float
    cpu: float  # CPU seconds over the span
    io: int  # bytes read and written over the span
    sessions: Mapping[str, tuple[float, int]]

    @staticmethod
    def is_busy(span: float, cpu: float, io: int) -> bool:
        return cpu / span >= settings.ACTIVATE_IDLE_CPU or io / span >= settings.ACTIVATE_IDLE_IO

    @property
    def busy(self) -> bool:
        return self.is_busy(self.span, self.cpu, self.io)

    def session_marks(self) -> list[str]:
        """Each session's id, after "+" when it was busy and "-" when it was quiet."""
        return [
            ("+" if self.is_busy(self.span, cpu, io) else "-") + session
            for session, (cpu, io) in self.sessions.items()
        ]

    @property
    def summary(self) -> str:
        """What is kept for display: the job's share of a core and its bytes a second."""
        return f"{self.cpu / self.span:.3f};{self.io / self.span:.0f}"


def _number(data: Mapping[str, str], name: str) -> float:
    try:
        value = float(data.get(name, ""))
    except ValueError:
        raise AgentRefused(400, f"{name}: must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise AgentRefused(400, f"{name}: must be a number of at least 0")
    return value


def activity_of(data: Mapping[str, str]) -> tuple[ActivityReport | None, str]:
    """The report a beat carries and, when it is malformed, why it was left out: a bad report
    must not cost the beat it came with (the worker would be declared lost)."""
    try:
        return parse_activity(data), ""
    except AgentRefused as exc:
        return None, exc.message


def parse_activity(data: Mapping[str, str]) -> ActivityReport | None:
    """The report a beat's fields carry; None when it carries none; AgentRefused if malformed."""
    if "span" not in data:
        return None
    span = _number(data, "span")
    if not 0 < span <= LONGEST_SPAN:
        raise AgentRefused(400, "span: seconds, more than 0 and at most a week")
    cpu, io = _number(data, "cpu"), _number(data, "io")
    sessions: dict[str, tuple[float, int]] = {}
    listed = data.get("sessions", "")
    entries = listed.split(",") if listed else []
    if len(entries) > MAX_SESSIONS:
        raise AgentRefused(400, f"sessions: at most {MAX_SESSIONS}")
    for entry in entries:
        match = SESSION_ENTRY.fullmatch(entry)
        if match is None:
            raise AgentRefused(400, "sessions: id:cpu:io, separated by commas")
        try:
            sessions[match["id"]] = (float(match["cpu"]), int(match["io"]))
        except ValueError:
            raise AgentRefused(400, "sessions: id:cpu:io, separated by commas") from None
    return ActivityReport(span=span, cpu=cpu, io=int(io), sessions=sessions)
