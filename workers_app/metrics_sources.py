"""The workers' sources for /metrics (core/metrics/scrape.py): counts from the database and the
sweeps' marks in Redis, added by the app's ready()."""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from core.sweep_lag import sweep_lag
from workers_app.liveness import Breakers, ShedRecord
from workers_app.models import AgentRelay, Cluster, Reachability, RelayState, Worker
from workers_app.statuses import LIVE, WorkerStatus


def _clusters() -> dict[int, tuple[str, str]]:
    return {
        pk: (name, reachability)
        for pk, name, reachability in Cluster.objects.values_list("pk", "name", "reachability")
    }


def workers_and_clusters() -> Iterator[Metric]:
    clusters = _clusters()
    reachable = GaugeMetricFamily(
        "activate_cluster_reachability",
        "1 for the cluster's reachability as the platform last found it (probes, polls, "
        "submissions); offline: its login host did not answer",
        labels=["cluster", "state"],
    )
    for name, state in clusters.values():
        for choice in Reachability:
            reachable.add_metric([name, choice.value], 1.0 if state == choice else 0.0)
    yield reachable
    counts = {
        (cluster_id, status): n
        for cluster_id, status, n in Worker.objects.filter(status__in=LIVE)
        .values_list("cluster_id", "status")
        .annotate(n=Count("pk"))
        .order_by()
    }
    workers = GaugeMetricFamily(
        "activate_workers",
        "Live workers by cluster and status (finished ones are history: see the admin)",
        labels=["cluster", "status"],
    )
    for cluster_id, (name, _) in clusters.items():
        for status in WorkerStatus:
            if status in LIVE:
                workers.add_metric([name, status.value], counts.get((cluster_id, status), 0))
    yield workers
    yield from _relays()


def _relays() -> Iterator[Metric]:
    now = timezone.now()
    state = GaugeMetricFamily(
        "activate_relay_state",
        "1 for the state of each via-login-host cluster's relay (unknown: no run_relays "
        "confirmed it within its lease)",
        labels=["cluster", "state"],
    )
    repairs = CounterMetricFamily(
        "activate_relay_repairs",
        "Times a relay was set up again after it was lost",
        labels=["cluster"],
    )
    for relay in AgentRelay.objects.select_related("cluster"):
        current = relay.state_now(now)
        for choice in RelayState:
            state.add_metric([relay.cluster.name, choice.value], 1.0 if current == choice else 0.0)
        repairs.add_metric([relay.cluster.name], relay.repairs)
    yield state
    yield repairs


def sweeps_and_breakers() -> Iterator[Metric]:
    lag = GaugeMetricFamily(
        "activate_sweep_lag_seconds",
        "Seconds since the sweep of this kind last completed (absent: never, as far as Redis "
        "knows)",
        labels=["kind"],
    )
    for kind, seconds in sweep_lag().items():
        if seconds is not None:
            lag.add_metric([kind], seconds)
    yield lag
    yield GaugeMetricFamily(
        "activate_sweep_interval_seconds",
        "ACTIVATE_SWEEP_INTERVAL: a lag of a few of these means sweeps stopped",
        value=settings.ACTIVATE_SWEEP_INTERVAL,
    )
    names = dict(Cluster.objects.values_list("pk", "name"))
    held = GaugeMetricFamily(
        "activate_breaker_silent_workers",
        "Workers the heartbeat sweep keeps although silent, because too many of their "
        "cluster's went silent at once (the breaker is held until an operator confirms)",
        labels=["cluster"],
    )
    for cluster_id, breaker in Breakers().all_open().items():
        held.add_metric([names.get(cluster_id, str(cluster_id))], breaker.get("silent", 0))
    yield held
    sheds = ShedRecord()
    yield CounterMetricFamily(
        "activate_agent_beats_shed",
        "Beats the agents' server shed (answered a signed retry-after, nothing done)",
        value=sheds.total(),
    )
    yield GaugeMetricFamily(
        "activate_agent_beats_shed_window",
        "Beats shed within a heartbeat timeout of the last: while above 0 the heartbeat sweep "
        "counts nobody's silence",
        value=sheds.window()[0],
    )
