"""The Celery worker's watchdog: a consumer that no longer answers through a broker that does
makes the process exit (STUCK) for start.sh to start again; one that answers, or a broker that
is away, does not."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from django.conf import settings

from core import watchdog


class FakeControl:
    def __init__(self, answers: bool) -> None:
        self.answers = answers

    def ping(self, destination: list[str], timeout: float) -> list[dict[str, Any]]:
        return [{destination[0]: {"ok": "pong"}}] if self.answers else []


class FakeApp:
    def __init__(self, broker_url: str, answers: bool) -> None:
        self.conf = type("Conf", (), {"broker_url": broker_url})()
        self.control = FakeControl(answers)


def _watch(broker_url: str, answers: bool) -> None:
    watchdog.watch(FakeApp(broker_url, answers), "worker@test", every=0.05, misses=3)  # type: ignore[arg-type]


def run_for(broker_url: str, *, answers: bool, seconds: float) -> int | None:
    """The watched process's exit code, or None if it was still running after ``seconds``."""
    process = multiprocessing.get_context("fork").Process(target=_watch, args=(broker_url, answers))
    process.start()
    process.join(seconds)
    if process.is_alive():
        process.kill()
        process.join()
        return None
    return process.exitcode


def test_a_consumer_that_does_not_answer_while_the_broker_does_exits_stuck() -> None:
    assert run_for(settings.REDIS_URL, answers=False, seconds=10) == watchdog.STUCK


@pytest.mark.parametrize(
    ("broker_url", "answers"),
    [
        (settings.REDIS_URL, True),  # healthy
        ("redis://127.0.0.1:1/0", False),  # the broker is away: the consumer's retries are due
    ],
    ids=["healthy", "away"],
)
def test_an_answering_consumer_or_an_absent_broker_is_left_alone(
    broker_url: str, answers: bool
) -> None:
    assert run_for(broker_url, answers=answers, seconds=1.5) is None
