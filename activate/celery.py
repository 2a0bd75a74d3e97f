from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "activate.settings.dev")

app = Celery("activate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _watch_consumer(sender: object, **kwargs: object) -> None:
    from activate import watchdog

    watchdog.start(sender, **kwargs)
