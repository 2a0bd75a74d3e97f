"""Requesting workers: one, many alike, again, and the saved requests they may start from.

A request is validated and recorded as pending here; its submission follows after commit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.bulk import insert_all
from core.errors import ParameterError
from schedulers import adapter_class
from workers_app import effects, idle
from workers_app.actions import NotOwner, lifecycle, usage
from workers_app.actions.cluster_accounts import acting_account
from workers_app.models import Cluster, Environment, SavedRequest, Worker
from workers_app.params import directives_for, validate_params

NAME_MAX = 128
# Workers one request may ask for.
BULK_MAX = 500
SAVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def request_worker(
    *,
    owner: User,
    cluster: str,
    environment: str,
    params: Mapping[str, object] | None = None,
    name: str = "",
    idempotency_key: str = "",
    idle_minutes: float | None = None,
) -> Worker:
    """Validate a worker request and record it as pending; submission follows after commit.

    What will be submitted (partition and directives) is fixed here, from what was validated.
    Raises ParameterError naming the offending field; nothing is stored then. With an
    ``idempotency_key`` already used by this owner, the worker made then is the answer.
    """
    if idempotency_key:
        earlier = worker_requested_with(owner, idempotency_key)
        if earlier is not None:
            return earlier
    [worker] = _record_requests(
        owner=owner,
        cluster=cluster,
        environment=environment,
        params=params,
        names=[name.strip()],
        keys=[idempotency_key],
        idle_minutes=idle_minutes,
    )
    return worker


def request_workers(
    *,
    owner: User,
    cluster: str,
    environment: str,
    count: int,
    params: Mapping[str, object] | None = None,
    name: str = "",
    idempotency_key: str = "",
    idle_minutes: float | None = None,
) -> list[Worker]:
    """``count`` workers alike, in one transaction and with one message to submit them all.

    Named ``<name>-1`` ... ``<name>-N`` when a name is given. An ``idempotency_key`` covers the
    whole request: repeated, it answers the workers made then (whatever the count says now).
    """
    if not 1 <= count <= BULK_MAX:
        raise ParameterError("count", f"must be from 1 to {BULK_MAX}")
    if idempotency_key:
        earlier = workers_requested_with(owner, idempotency_key)
        if earlier:
            return earlier
    name = name.strip()
    names = [f"{name}-{n}" if name else "" for n in range(1, count + 1)]
    keys = [_bulk_key(idempotency_key, n) if idempotency_key else "" for n in range(1, count + 1)]
    return _record_requests(
        owner=owner,
        cluster=cluster,
        environment=environment,
        params=params,
        names=names,
        keys=keys,
        idle_minutes=idle_minutes,
    )


def _bulk_key(idempotency_key: str, n: int) -> str:
    # Each worker keeps the request's key with its place in the request, so a retry finds all.
    return f"{idempotency_key}#{n}"


def _active_environment(owner: User, cluster: str, environment: str) -> Environment:
    # What a user's groups keep from them is unknown to them, not forbidden: nothing to probe.
    found_cluster = Cluster.objects.visible_to(owner).filter(name=cluster).first()
    if found_cluster is None:
        raise ParameterError("cluster", f"unknown cluster {cluster!r}")
    env = (
        Environment.objects.visible_to(owner)
        .filter(cluster=found_cluster, name=environment)
        .select_related("cluster")
        .prefetch_related("fields")
        .first()
    )
    if env is None:
        raise ParameterError("environment", f"unknown environment {environment!r} on {cluster}")
    if not env.is_active:
        raise ParameterError("environment", f"environment {environment!r} is inactive")
    return env


def _record_requests(
    *,
    owner: User,
    cluster: str,
    environment: str,
    params: Mapping[str, object] | None,
    names: list[str],
    keys: list[str],
    idle_minutes: float | None,
) -> list[Worker]:
    """``idle_minutes``: the idle policy (0: none; None: the site's default)."""
    env = _active_environment(owner, cluster, environment)
    found_cluster = env.cluster
    for name in names:
        if len(name) > NAME_MAX or not name.isprintable():
            raise ParameterError(
                "name", f"must be at most {NAME_MAX} printable characters (no control characters)"
            )
    problem = idle.policy_problem(idle_minutes)
    if problem:
        raise ParameterError("idle_minutes", problem)
    if idle_minutes is None:
        idle_minutes = idle.site_default(env)
    account = acting_account(owner, found_cluster)
    resolved = validate_params(env, params or {}, scheduler=adapter_class(found_cluster.scheduler))
    directives = directives_for(env, resolved)
    now = timezone.now()
    workers = []
    for name, key in zip(names, keys, strict=True):
        worker = Worker(
            owner=owner,
            cluster=found_cluster,
            environment=env,
            account=account,
            params=resolved,
            job_partition=env.partition,
            job_directives=list(directives),
            idempotency_key=key,
            idle_minutes=idle_minutes or None,
            **lifecycle.initial_timing(now),
        )
        worker.name = name or f"{env.name}-{worker.public_id}"
        workers.append(worker)
    try:
        with transaction.atomic():
            # One request of this user at a time past here: caps count what is already held.
            User.objects.select_for_update().filter(pk=owner.pk).first()
            usage.check_caps(owner, found_cluster, adding=len(workers))
            if len(workers) == 1:
                workers[0].save()
            else:
                insert_all(workers, key="public_id")
            lifecycle.record_events(workers, "Requested")
            effects.submit_workers([w.pk for w in workers])
    except IntegrityError:
        # The same key, sent twice at once: the other request made the workers.
        key = keys[0]
        if not key:
            raise
        earlier = (
            [w for w in [worker_requested_with(owner, key)] if w is not None]
            if len(keys) == 1
            else workers_requested_with(owner, key.rpartition("#")[0])
        )
        if not earlier:
            raise
        return earlier
    return workers


def worker_requested_with(owner: User, idempotency_key: str) -> Worker | None:
    return (
        Worker.objects.select_related("cluster", "environment")
        .filter(owner=owner, idempotency_key=idempotency_key)
        .first()
    )


def workers_requested_with(owner: User, idempotency_key: str) -> list[Worker]:
    """The workers of an earlier bulk request with this key, in the order they were asked."""
    workers = (
        Worker.objects.select_related("cluster", "environment")
        .filter(owner=owner, idempotency_key__startswith=f"{idempotency_key}#")
        .filter(idempotency_key__regex=rf"^{re.escape(idempotency_key)}#[0-9]+$")
    )
    return sorted(workers, key=lambda w: int(w.idempotency_key.rpartition("#")[2]))


def request_again(worker: Worker, *, owner: User, idempotency_key: str = "") -> Worker:
    """Another worker like ``worker``: its cluster, environment, fields and name, the fields
    validated as the environment has them now."""
    if worker.owner_id != owner.pk:
        raise NotOwner("only the worker's owner may request it again")
    env = worker.environment
    if env is None:
        raise ParameterError(
            "environment", f"the environment worker {worker.public_id} came from was removed"
        )
    # A name the platform gave (ENV-ID) would carry the old id: the new one gets its own.
    name = "" if worker.name == f"{env.name}-{worker.public_id}" else worker.name
    return request_worker(
        owner=owner,
        cluster=worker.cluster.name,
        environment=env.name,
        params=worker.params,
        name=name,
        idempotency_key=idempotency_key,
        idle_minutes=worker.idle_minutes or 0,
    )


def save_request(
    *, owner: User, name: str, cluster: str, environment: str, params: Mapping[str, object]
) -> tuple[SavedRequest, bool]:
    """Keep a request under ``name`` (replacing one of that name): the fields are validated
    now and kept with their defaults filled in. Returns it and whether it is new."""
    if not SAVED_NAME.fullmatch(name):
        raise ParameterError(
            "name", "must be 1-64 letters, digits, '-' or '_', starting with a letter or digit"
        )
    env = _active_environment(owner, cluster, environment)
    resolved = validate_params(env, params, scheduler=adapter_class(env.cluster.scheduler))
    return SavedRequest.objects.update_or_create(
        owner=owner, name=name, defaults={"environment": env, "params": resolved}
    )


def saved_requests_of(owner: User) -> QuerySet[SavedRequest]:
    return SavedRequest.objects.filter(owner=owner).select_related("environment__cluster")


def delete_saved_request(saved: SavedRequest) -> None:
    saved.delete()
