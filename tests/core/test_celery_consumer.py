"""core/celery_consumer.py: a collected connection keeps no default channel for Celery's close
after it to close again (the whole failover is drills/redis_failover.py)."""

from __future__ import annotations

import kombu
import pytest

from core.celery_consumer import forget_channel_when_collected


def test_a_collected_connection_forgets_its_default_channel() -> None:
    connection = kombu.Connection("memory://")
    channel = connection.default_channel
    forget_channel_when_collected(connection)

    connection.collect()

    assert connection._default_channel is None
    assert connection.default_channel is not channel  # a new one, if it is used again
    connection.close()


def test_the_channel_is_forgotten_even_when_the_collect_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection = kombu.Connection("memory://")
    connection.default_channel  # noqa: B018 - opened, as a consumer's is
    monkeypatch.setattr(connection, "collect", _failing_collect)
    forget_channel_when_collected(connection)

    with pytest.raises(OSError):
        connection.collect()

    assert connection._default_channel is None


def _failing_collect(*_: object, **__: object) -> None:
    raise OSError("the broker is gone")
