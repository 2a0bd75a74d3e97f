from __future__ import annotations


class AgentRefused(Exception):
    """An agent's call refused with an HTTP status and a message for the agent's log."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
