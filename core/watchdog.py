"""A Celery worker that no longer consumes exits, so that what runs it starts it again.

After a broker outage, a worker's consumer can fail to come back while the process lives on
(seen here with Redis killed and restarted: "Connection to broker lost", then never "Connected"
again): no sweep, poll or submission runs, silently. The watchdog asks the worker through the
broker, every WATCH_EVERY seconds, whether it answers (a remote-control ping its own consumer
replies to); when the broker answers but the worker has not for MISSES asks in a row, the
process exits with STUCK, which scripts/start.sh restarts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import redis
from celery import Celery

from core.redis_connection import broker_client

log = logging.getLogger(__name__)

WATCH_EVERY = 10.0
MISSES = 3
STUCK = 70


def watch(app: Celery, hostname: str, *, every: float = WATCH_EVERY, misses: int = MISSES) -> None:
    url = app.conf.broker_url
    # Only kombu's sentinel form needs the options (the master's name, the sentinels' password).
    options = app.conf.broker_transport_options if url.startswith("sentinel://") else {}
    broker = broker_client(url, options)
    missed = 0
    while True:
        time.sleep(every)
        try:
            broker.ping()
        except redis.RedisError:
            missed = 0  # the broker itself is away: the consumer's own retries are due
            continue
        try:
            answered = bool(app.control.ping(destination=[hostname], timeout=min(5.0, every)))
        except Exception:
            answered = False
        missed = 0 if answered else missed + 1
        if missed >= misses:
            log.critical(
                "worker %s has not answered through the broker for %d checks while the broker "
                "answers: its consumer is stuck; exiting to be started again",
                hostname,
                missed,
            )
            logging.shutdown()
            os._exit(STUCK)


def start(sender: Any, **kwargs: Any) -> None:
    """worker_ready: watch this worker from a thread of its main process."""
    app, hostname = sender.app, sender.hostname
    threading.Thread(
        target=watch, args=(app, hostname), name="consumer-watchdog", daemon=True
    ).start()
    log.info("watching that worker %s answers through the broker", hostname)
