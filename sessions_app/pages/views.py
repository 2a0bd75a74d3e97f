"""The Sessions pages: thin views over sessions_app.services.

Sessions are looked up through the user's own queryset, so another user's session is a 404.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.models import User
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.errors import ParameterError
from core.pages import login_required_page
from sessions_app import idle, kinds, services
from sessions_app.kinds.base import SessionKind
from sessions_app.models import Session
from workers_app.models import Cluster, Environment, Worker
from workers_app.statuses import WorkerStatus

LIST_SIZE = 100


@dataclass(frozen=True)
class Choice:
    """An environment or connected worker in the Target list, and the kinds offered there."""

    value: str
    label: str
    kinds: str


@dataclass(frozen=True)
class TargetGroup:
    """One cluster in the launch form's Target list: its environments and connected workers."""

    cluster: Cluster
    environments: list[Environment]
    workers: list[Worker]
    choices: list[Choice]


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)  # login_required_page ran
    return request.user


def _connected_workers(user: User) -> list[Worker]:
    workers = Worker.objects.visible_to(user).filter(owner=user, status=WorkerStatus.CONNECTED)
    ordered = workers.select_related("cluster", "environment").order_by("cluster__name", "name")
    return list(ordered)


def _offered(launchable: list[SessionKind], cluster: str, environment: str | None) -> str:
    return " ".join(k.name for k in launchable if k.offered_on(cluster, environment))


def target_groups(user: User, launchable: list[SessionKind] | None = None) -> list[TargetGroup]:
    launchable = kinds.seen_by(user) if launchable is None else launchable
    workers = _connected_workers(user)
    groups = []
    visible = Prefetch("environments", queryset=Environment.objects.visible_to(user))
    for cluster in Cluster.objects.visible_to(user).order_by("name").prefetch_related(visible):
        environments = sorted(
            (e for e in cluster.environments.all() if e.is_active), key=lambda e: e.name
        )
        mine = [w for w in workers if w.cluster_id == cluster.pk]
        name = cluster.name
        choices = [
            Choice(f"env:{name}/{e.name}", e.name, _offered(launchable, name, e.name))
            for e in environments
        ] + [
            Choice(
                f"worker:{name}/{w.public_id}",
                f"{w.name} (connected)",
                _offered(launchable, name, w.environment.name if w.environment else None),
            )
            for w in mine
        ]
        if environments or mine:
            groups.append(TargetGroup(cluster, environments, mine, choices))
    return groups


def _target_on(groups: list[TargetGroup], cluster: str) -> str:
    """The target chosen first for a cluster: a connected worker (no wait), else its first
    environment."""
    for group in groups:
        if group.cluster.name == cluster and group.choices:
            workers = [c for c in group.choices if c.value.startswith("worker:")]
            return (workers or group.choices)[0].value
    return ""


def _find(user: User, public_id: str) -> Session:
    session = services.find_session(user, public_id)
    if session is None:
        raise Http404("No such session.")
    return session


@require_GET
@login_required_page
def sessions(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    launchable = kinds.seen_by(user)
    groups = target_groups(user, launchable)
    return render(
        request,
        "sessions_app/list.html",
        {
            "sessions": services.sessions_visible_to(user).order_by("-created_at")[:LIST_SIZE],
            "groups": groups,
            # Launched from a folder of the Files page: that folder, on its cluster.
            "folder": request.GET.get("folder", "")[:4096],
            "target": _target_on(groups, request.GET.get("cluster", "")),
            "workers": _connected_workers(user),
            "kinds": launchable,
            # Quick Launch offers what needs no values and runs anywhere.
            "quick_kinds": [k for k in launchable if not k.fields and k.offered_on("", None)],
        },
    )


@require_GET
@login_required_page
def sessions_table(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    listed = services.sessions_visible_to(user).order_by("-created_at")[:LIST_SIZE]
    return render(request, "sessions_app/_table.html", {"sessions": listed})


@require_POST
@login_required_page
def launch(request: HttpRequest) -> HttpResponse:
    """Target is ``env:<cluster>/<environment>`` or ``worker:<cluster>/<worker id>``."""
    kind, _, where = request.POST.get("target", "").partition(":")
    cluster, _, name = where.partition("/")
    session_type = request.POST.get("type", "")
    # The chosen type's fields, named value:<type>:<field> (each type's inputs are apart).
    prefix = f"value:{session_type}:"
    values = {
        key.removeprefix(prefix): value
        for key, value in request.POST.items()
        if key.startswith(prefix)
    }
    try:
        if kind not in ("env", "worker") or not cluster or not name:
            raise ParameterError("target", "choose an environment or a connected worker")
        session = services.create_session(
            owner=_user(request),
            session_type=session_type,
            cluster=cluster,
            environment=name if kind == "env" else "",
            worker_id=name if kind == "worker" else "",
            name=request.POST.get("name", ""),
            values=values,
            folder=request.POST.get("folder", ""),
        )
    except ParameterError as exc:
        messages.error(request, f"{exc.field.capitalize()}: {exc.message}")
        return redirect(reverse("sessions:sessions"))
    return redirect(reverse("sessions:session", args=[session.public_id]))


@require_GET
@login_required_page
def session_details(request: HttpRequest, public_id: str) -> HttpResponse:
    session = _find(_user(request), public_id)
    template = (
        "sessions_app/_details.html" if request.GET.get("part") else "sessions_app/details.html"
    )
    return render(request, template, {"session": session})


@require_POST
@login_required_page
def stop(request: HttpRequest, public_id: str) -> HttpResponse:
    session = _find(_user(request), public_id)
    services.stop_session(session)
    messages.info(request, f"Session {session.name} stopped.")
    return redirect(reverse("sessions:session", args=[session.public_id]))


@require_POST
@login_required_page
def keep(request: HttpRequest, public_id: str) -> HttpResponse:
    session = _find(_user(request), public_id)
    idle.keep_session(session, owner=_user(request))
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse({"kept": session.public_id})
    messages.success(request, f"Session {session.name} kept: its idle clock starts again.")
    return redirect(reverse("sessions:session", args=[session.public_id]))


@require_POST
@login_required_page
def again(request: HttpRequest, public_id: str) -> HttpResponse:
    earlier = _find(_user(request), public_id)
    try:
        session = services.create_again(earlier)
    except ParameterError as exc:
        messages.error(request, f"Session {earlier.name} cannot be launched again: {exc.message}")
        return redirect(reverse("sessions:session", args=[earlier.public_id]))
    return redirect(reverse("sessions:session", args=[session.public_id]))
