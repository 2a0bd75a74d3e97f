from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_ready

from core import watchdog

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "activate.settings.dev")

# Every task a leased beat sends is fenced where it lands (core/beat.py).
app = Celery("activate", task_cls="core.beat:FencedTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# A worker whose consumer is stuck after a broker outage exits, to be started again.
worker_ready.connect(watchdog.start, weak=False, dispatch_uid="consumer-watchdog")
