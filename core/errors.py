"""Errors every room raises and every answer (API, page, command line) shows the same way."""

from __future__ import annotations


class ParameterError(Exception):
    """A request parameter is wrong; ``field`` names it for a 400 answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
