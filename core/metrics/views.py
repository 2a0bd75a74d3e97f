"""/metrics: the Prometheus text format, for staff or the operator's bearer token.

Anyone else gets 403: the counts name clusters and show how busy the site is. Prometheus sends
``Authorization: Bearer <ACTIVATE_METRICS_TOKEN>`` (its ``authorization`` scrape setting); an
empty token turns that way in off, leaving staff's browser sessions.
"""

from __future__ import annotations

import hmac
import os
import re

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from core.metrics.scrape import ScrapeTime

# Read once, as prometheus_client itself does when it decides where values go.
MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]*_(?P<pid>[0-9]+)\.db")


def may_read(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    token = settings.ACTIVATE_METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return (
        bool(token)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(given.strip().encode(), token.encode())
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def forget_dead_processes(path: str) -> list[int]:
    """Drop the live gauges (SSH connections, open terminals) of processes that have ended,
    however they ended (SIGKILL included); their counters stay, being totals. The directory is
    this host's, so a pid is one of this host's processes. Returns the pids forgotten."""
    dead = set()
    for name in os.listdir(path):
        found = LIVE_GAUGE_FILE.fullmatch(name)
        if found and not _alive(int(found["pid"])):
            dead.add(int(found["pid"]))
    for pid in dead:
        mark_process_dead(pid, path)
    return sorted(dead)


def exposition() -> bytes:
    """What every process of this host recorded, then what is read now."""
    if MULTIPROCESS_DIR:
        forget_dead_processes(MULTIPROCESS_DIR)
        recorded = CollectorRegistry()
        MultiProcessCollector(recorded, path=MULTIPROCESS_DIR)
    else:
        recorded = REGISTRY
    now = CollectorRegistry()
    now.register(ScrapeTime())
    return generate_latest(recorded) + generate_latest(now)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not may_read(request):
        return HttpResponse(
            "Metrics are for staff, or a bearer token (ACTIVATE_METRICS_TOKEN).\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(exposition(), content_type=CONTENT_TYPE)
