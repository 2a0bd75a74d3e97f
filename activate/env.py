"""Strict reading of configuration from the environment.

A malformed value stops start-up with a message naming the variable, instead of
surfacing later as a confusing runtime failure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlparse


class ConfigurationError(Exception):
    """A setting read from the environment is malformed."""


class EnvReader:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ

    def _raw(self, name: str) -> str | None:
        value = self.environ.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def string(self, name: str, default: str) -> str:
        value = self._raw(name)
        return default if value is None else value

    def optional_string(self, name: str) -> str | None:
        return self._raw(name)

    def matching(self, name: str, default: str, *, pattern: str, meaning: str) -> str:
        value = self.string(name, default)
        if not re.fullmatch(pattern, value):
            raise ConfigurationError(f"{name} must be {meaning}, got {value!r}")
        return value

    def integer(self, name: str, default: int, *, minimum: int = 0) -> int:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigurationError(f"{name} must be an integer, got {value!r}") from None
        if number < minimum:
            raise ConfigurationError(f"{name} must be at least {minimum}, got {number}")
        return number

    def number(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ConfigurationError(f"{name} must be a number, got {value!r}") from None
        if number != number or number < minimum:
            raise ConfigurationError(f"{name} must be a number >= {minimum}, got {value!r}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self._raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise ConfigurationError(f"{name} must be true or false, got {value!r}")

    def url(self, name: str, default: str, *, schemes: tuple[str, ...]) -> str:
        value = self.string(name, default)
        parsed = urlparse(value)
        if parsed.scheme not in schemes or not (parsed.netloc or parsed.path):
            allowed = ", ".join(f"{s}://" for s in schemes)
            raise ConfigurationError(f"{name} must be a URL starting with {allowed}, got {value!r}")
        return value

    def csv_list(self, name: str, default: list[str]) -> list[str]:
        value = self._raw(name)
        if value is None:
            return default
        return [item.strip() for item in value.split(",") if item.strip()]


def require_less_than(smaller: tuple[str, float], larger: tuple[str, float]) -> None:
    """Timing knobs must keep their order: an interval longer than its timeout is an error."""
    (small_name, small), (large_name, large) = smaller, larger
    if not small < large:
        raise ConfigurationError(
            f"{small_name} ({small:g}) must be smaller than {large_name} ({large:g})"
        )
