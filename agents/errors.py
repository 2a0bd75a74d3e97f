from __future__ import annotations


class AgentRefused(Exception):
    """An agent's call refused with an HTTP status and a message for the agent's log."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def answer(self) -> dict[str, str]:
        """The refusal's JSON body."""
        return {"error": self.message}


# A signed request refused for its time alone: the signed answer carries the platform's time.
OUTSIDE_WINDOW = 425


def server_time(now: float) -> str:
    """The platform's time as answers carry it (seconds, six decimals)."""
    return f"{now:.6f}"


class TimeRefused(AgentRefused):
    """A request signed with the worker's key whose time is outside the window of the
    platform's clock (``now``, Redis's): refused with nothing done, and answered signed with
    that time so the agent re-bases its clock and signs again at once."""

    def __init__(self, now: float) -> None:
        super().__init__(
            OUTSIDE_WINDOW, "timestamp outside the accepted window (the agent re-bases its clock)"
        )
        self.now = now

    def answer(self) -> dict[str, str]:
        return {"error": self.message, "server_time": server_time(self.now)}


# A beat the agents' server had no room for: the signed answer says when to try again.
OVERLOADED = 503


class Overloaded(AgentRefused):
    """A signed beat the agents' server shed, before any database or Redis work, because it
    could not answer it within its budget: answered signed, with the seconds (``retry_after``)
    the agent waits, plus jitter of its own, before its next beat."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(OVERLOADED, "the agents' server is overloaded; retry after the delay")
        self.retry_after = retry_after

    def answer(self) -> dict[str, str]:
        return {"error": self.message, "retry_after": f"{self.retry_after:.1f}"}
