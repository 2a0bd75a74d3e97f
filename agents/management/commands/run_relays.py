from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError
from redis.exceptions import RedisError

from agents.relays.supervisor import RelaySupervisor

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Keep the relays of clusters whose agents go via the login host (scripts/start.sh "
        "relays): one per cluster and installation, however many of these processes run."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        signal.signal(signal.SIGINT, lambda *_: stopping.set())
        supervisor = RelaySupervisor()
        log.info("keeping relays as %s", supervisor.holder)
        try:
            while not stopping.is_set():
                try:
                    supervisor.step()
                except (DatabaseError, RedisError) as exc:
                    # Keepers go on with what they hold; the next step catches up.
                    log.warning("relay supervision step failed: %s", exc)
                stopping.wait(settings.ACTIVATE_RELAY_CHECK_INTERVAL)
        finally:
            supervisor.stop_all()
