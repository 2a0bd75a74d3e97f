"""Waiting for a condition that real processes make true sooner or later."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(predicate: Callable[[], T], *, timeout: float, interval: float = 0.25) -> T:
    """``predicate``'s first true value, or its last (false) one once ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_for(predicate: Callable[[], T], *, timeout: float, interval: float = 0.25) -> T:
    """``predicate``'s first true value; TimeoutError when there is none within ``timeout``."""
    value = poll(predicate, timeout=timeout, interval=interval)
    if not value:
        raise TimeoutError(f"condition not met within {timeout:g}s")
    return value


def wait_until(predicate: Callable[[], object], *, timeout: float, interval: float = 0.2) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds."""
    return bool(poll(predicate, timeout=timeout, interval=interval))
