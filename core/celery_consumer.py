"""Celery's task consumer (settings CELERY_WORKER_CONSUMER): the stock one, except that losing
the broker with tasks unacknowledged does not end the worker.

When the broker connection breaks, Celery 5.7 collects the connection, then closes it. kombu
5.7's ``collect()`` closes the channels it can and detaches the transport, but keeps the default
channel: when a BRPOP was in flight, that channel's close failed reading the lost server (a
connection error, which collect ignores), so it is still open. The ``close()`` after it closes
that channel again, whose unacknowledged messages are then restored through the detached
transport ("AttributeError: 'NoneType' object has no attribute 'hostname'" in kombu's
``_connparams``); that error is not a connection error, so it ends the worker with status 1.
Here a collected connection forgets its default channel, so the close has nothing left to do
with it. Its unacknowledged messages stay in Redis's unacked set and come back after the
visibility timeout, as they would have had the restore reached the lost server.
"""

from __future__ import annotations

from typing import Any

from celery.worker import consumer
from kombu import Connection


class Consumer(consumer.Consumer):
    def on_connection_error_after_connected(self, exc: Exception) -> None:
        if self.connection is not None:
            forget_channel_when_collected(self.connection)
        super().on_connection_error_after_connected(exc)


def forget_channel_when_collected(connection: Connection) -> None:
    """Make ``connection.collect()`` drop the default channel it leaves behind."""
    collect = connection.collect

    def collect_then_forget(*args: Any, **kwargs: Any) -> None:
        try:
            collect(*args, **kwargs)
        finally:
            # kombu has no public way to say a channel is gone with its transport.
            connection._default_channel = None

    connection.collect = collect_then_forget  # type: ignore[method-assign]  # this one only
