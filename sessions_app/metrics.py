"""Sessions' metrics: bytes and errors of the session proxy as they happen (a counter increment
in its byte loops), and sessions by kind and status when Prometheus asks (``apps.ready`` adds
that to workers_app's scrape)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from sessions_app import kinds
from sessions_app.models import Session
from sessions_app.statuses import LIVE, SessionStatus

PROXY_BYTES = Counter(
    "activate_proxy_bytes",
    "Bytes through the session proxy (HTTP bodies and WebSocket data), by session kind and "
    "direction (to_node, to_browser)",
    ["kind", "direction"],
)
PROXY_ERRORS = Counter(
    "activate_proxy_errors",
    "Proxied requests and WebSockets that could not reach the session's program: unreachable "
    "(no tunnel to the node), program_ended, program_closed (it closed before answering), "
    "handshake (its WebSocket refused)",
    ["kind", "reason"],
)


def to_node(kind: str, count: int) -> None:
    PROXY_BYTES.labels(kind, "to_node").inc(count)


def to_browser(kind: str, count: int) -> None:
    PROXY_BYTES.labels(kind, "to_browser").inc(count)


def proxy_failed(kind: str, reason: str) -> None:
    PROXY_ERRORS.labels(kind, reason).inc()


def sessions_by_kind_and_status() -> Iterator[Metric]:
    counts = {
        (kind, status): n
        for kind, status, n in Session.objects.filter(status__in=LIVE)
        .values_list("session_type", "status")
        .annotate(n=Count("pk"))
        .order_by()
    }
    family = GaugeMetricFamily(
        "activate_sessions",
        "Live sessions by kind and status (ended and failed ones are history)",
        labels=["kind", "status"],
    )
    for kind in kinds.names():
        for status in SessionStatus:
            if status in LIVE:
                family.add_metric([kind, status.value], counts.get((kind, status), 0))
    yield family
