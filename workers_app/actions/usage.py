"""Node-hours: what workers held, from connected to stopped, and the caps operators set on it.

A worker's nodes are its ``numNodes`` field when it has one, else one. A worker still connected
counts up to now. Periods are half-open, [since, until), and a worker counts only for the part
of its life inside one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone

from core.errors import ParameterError
from workers_app.models import Cluster, UsageCap, Worker
from workers_app.statuses import FINISHED


@dataclass(frozen=True)
class UsageRow:
    user: str
    cluster: str
    account: str  # the cluster account's user name; "" on a shared cluster
    workers: int
    node_seconds: int

    @property
    def node_hours(self) -> float:
        return round(self.node_seconds / 3600, 4)

    @property
    def clock(self) -> str:
        return clock(self.node_seconds)


def clock(seconds: int) -> str:
    """``H:MM:SS``, hours unbounded: usage to the second."""
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(start: datetime) -> datetime:
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def nodes_of(worker: Worker) -> int:
    raw = str(worker.params.get("numNodes", "1"))
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def node_seconds(worker: Worker, since: datetime, until: datetime, now: datetime) -> int:
    if worker.connected_at is None:
        return 0
    end = min(worker.finished_at or now, until, now)
    start = max(worker.connected_at, since)
    return max(0, int((end - start).total_seconds())) * nodes_of(worker)


def _held_between(since: datetime, until: datetime) -> Q:
    return Q(connected_at__isnull=False, connected_at__lt=until) & (
        Q(finished_at__isnull=True) | Q(finished_at__gt=since)
    )


def usage(
    *, since: datetime, until: datetime, users: Iterable[User] | None = None
) -> list[UsageRow]:
    """Node-seconds per user, cluster and cluster account, in [since, until)."""
    now = timezone.now()
    workers = Worker.objects.filter(_held_between(since, until)).select_related(
        "owner", "cluster", "account"
    )
    if users is not None:
        workers = workers.filter(owner__in=list(users))
    totals: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for worker in workers.only(
        "connected_at",
        "finished_at",
        "params",
        "owner__username",
        "cluster__name",
        "account__remote_username",
    ):
        seconds = node_seconds(worker, since, until, now)
        account = worker.account.remote_username if worker.account else ""
        total = totals[(worker.owner.get_username(), worker.cluster.name, account)]
        total[0] += 1
        total[1] += seconds
    return [
        UsageRow(user, cluster, account, count, seconds)
        for (user, cluster, account), (count, seconds) in sorted(totals.items())
    ]


def cap_for(owner: User, cluster: Cluster) -> UsageCap | None:
    """The user's own cap on the cluster, else the cluster's cap for everyone."""
    caps = {
        cap.user_id: cap
        for cap in UsageCap.objects.filter(cluster=cluster).filter(Q(user=owner) | Q(user=None))
    }
    return caps.get(owner.pk) or caps.get(None)


def check_caps(owner: User, cluster: Cluster, *, adding: int) -> None:
    """ParameterError (a 400 naming the cap) if ``adding`` more workers would pass a cap.

    The caller holds a lock on the owner's row, so two requests at once are counted in turn."""
    cap = cap_for(owner, cluster)
    if cap is None:
        return
    if cap.max_workers is not None:
        live = Worker.objects.filter(owner=owner, cluster=cluster).exclude(status__in=FINISHED)
        held = live.count()
        if held + adding > cap.max_workers:
            raise ParameterError(
                "cluster",
                f"cap reached: at most {cap.max_workers} workers at once on {cluster.name} "
                f"(you have {held}; this request asks for {adding}), set by the operators",
            )
    if cap.max_node_hours_month is not None:
        now = timezone.now()
        since = month_start(now)
        used = sum(
            row.node_seconds
            for row in usage(since=since, until=next_month(since), users=[owner])
            if row.cluster == cluster.name
        )
        if used >= cap.max_node_hours_month * 3600:
            raise ParameterError(
                "cluster",
                f"cap reached: {cap.max_node_hours_month} node-hours a month on {cluster.name} "
                f"(used {used / 3600:.2f} this month), set by the operators",
            )


def caps_of(owner: User) -> list[UsageCap]:
    """The cap that applies to ``owner`` on each cluster that has one."""
    clusters = Cluster.objects.filter(usage_caps__isnull=False).distinct()
    return [cap for cluster in clusters if (cap := cap_for(owner, cluster)) is not None]
