"""The browser UI: thin views over the actions (workers_app/actions).

Each page that names a worker or an account looks it up through the per-user querysets
(``Worker.objects.visible_to``, the user's own accounts and keys), so anything of another
user's is a 404. Requests made by htmx get fragments; the same URLs serve whole pages to a
browser without JavaScript.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.models import User
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import ParameterError
from core.folders import checked_folder
from core.pages import is_htmx, login_required_page, navigate
from identity.unix_names import site_name_of, unix_name_on
from workers_app import idle
from workers_app.actions import cluster_accounts as accounts
from workers_app.actions import deletion, requests, usage
from workers_app.models import ApiKey, Cluster, ClusterAccount, Environment, TerminalRecord, Worker
from workers_app.pages.forms import (
    ApiKeyForm,
    ClusterGroup,
    ConnectAccountForm,
    RequestWorkerForm,
    environment_groups,
)
from workers_app.pages.rows import WorkerRow
from workers_app.statuses import WorkerStatus
from workers_app.terminals.kept import KEEP_NAME

PAGE_SIZE = 50
NEW_API_KEY = "pages-new-api-key"


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)  # login_required_page ran
    return request.user


class LoginPage(auth_views.LoginView):
    """The password form, and beside it the single sign-on's button when it is on."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["sso_label"] = settings.ACTIVATE_OIDC_LABEL if settings.ACTIVATE_OIDC_ISSUER else ""
        return context


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("pages:workers")
    return redirect(settings.LOGIN_URL)


# Workers


def _workers_context(request: HttpRequest) -> dict[str, Any]:
    user = _user(request)
    workers = Worker.objects.visible_to(user).select_related("cluster", "environment", "owner")
    page = Paginator(workers, PAGE_SIZE).get_page(request.GET.get("page"))
    now = timezone.now()
    kept: dict[int, set[str]] = {}
    connected = [w.pk for w in page if w.status == WorkerStatus.CONNECTED and w.owner_id == user.pk]
    if connected:
        names = TerminalRecord.objects.filter(worker_id__in=connected).exclude(keep="")
        for worker_id, name in names.values_list("worker_id", "keep").distinct():
            kept.setdefault(worker_id, set()).add(name)
    idleness = idle.idleness_of(list(page), now)
    return {
        "page": page,
        "rows": [
            WorkerRow.of(worker, now, kept.get(worker.pk, ()), idleness.get(worker.pk))
            for worker in page
        ],
        "show_owner": user.is_staff,
        "has_clusters": Cluster.objects.exists(),
    }


@login_required_page
@require_GET
def workers(request: HttpRequest) -> HttpResponse:
    return render(request, "workers_app/workers/list.html", _workers_context(request))


@login_required_page
@require_GET
def workers_table(request: HttpRequest) -> HttpResponse:
    """The table alone: the Workers page polls it every two seconds."""
    return render(request, "workers_app/workers/_table.html", _workers_context(request))


def _request_form_setup(
    request: HttpRequest, wanted: str | None
) -> tuple[list[ClusterGroup], Environment | None]:
    user = _user(request)
    environments = Environment.objects.visible_to(user).prefetch_related("fields")
    clusters = list(
        Cluster.objects.visible_to(user).prefetch_related(
            Prefetch("environments", queryset=environments)
        )
    )
    held = dict(ClusterAccount.objects.filter(user=user).values_list("cluster_id", "verified_at"))
    connected = {pk for pk, verified_at in held.items() if verified_at}
    # On a certificate cluster a Unix name is all a person needs: the first request makes it.
    named = {
        c.pk: c.pk in held or unix_name_on(user, c) is not None
        for c in clusters
        if c.ca_public_key and not c.shared
    }
    connected |= {pk for pk, ok in named.items() if ok}
    unmapped = frozenset(pk for pk, ok in named.items() if not ok)
    groups = environment_groups(
        clusters, connected_cluster_ids=connected, unmapped_cluster_ids=unmapped
    )
    options = [option for group in groups for option in group.options if option.selectable]
    selected = next((o.environment for o in options if str(o.environment.pk) == wanted), None)
    if selected is None and options and wanted is None:
        selected = options[0].environment
    return groups, selected


def _render_request(request: HttpRequest, form: RequestWorkerForm) -> HttpResponse:
    template = "_request_form.html" if is_htmx(request) else "request.html"
    saved = requests.saved_requests_of(_user(request))
    return render(request, f"workers_app/workers/{template}", {"form": form, "saved": saved})


def _empty_request_form(request: HttpRequest) -> RequestWorkerForm:
    """The dialog as first shown: the environment asked for, or a saved request's settings."""
    saved = requests.saved_requests_of(_user(request)).filter(name=request.GET.get("saved", ""))
    chosen = saved.first()
    wanted = str(chosen.environment_id) if chosen else request.GET.get("environment")
    groups, selected = _request_form_setup(request, wanted)
    form = RequestWorkerForm(groups=groups, selected=selected)
    if chosen is not None and selected is not None and selected.pk == chosen.environment_id:
        form.prefill(chosen.params)
        form.fields["save_as"].initial = chosen.name
    return form


@login_required_page
@require_http_methods(["GET", "POST"])
def request_worker(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _render_request(request, _empty_request_form(request))
    groups, selected = _request_form_setup(request, request.POST.get("environment"))
    form = RequestWorkerForm(request.POST, groups=groups, selected=selected)
    if form.is_valid() and form.selected is not None:
        env = form.selected
        count = form.cleaned_data["count"] or 1
        asked = {
            "owner": _user(request),
            "cluster": env.cluster.name,
            "environment": env.name,
            "params": form.params(),
            "name": form.cleaned_data["name"],
        }
        idle_minutes = form.cleaned_data["idle_minutes"] or 0
        try:
            if save_as := form.cleaned_data["save_as"]:
                _save_request(asked, save_as)
            if count == 1:
                worker = requests.request_worker(**asked, idle_minutes=idle_minutes)
                done = f"Worker {worker.name} requested."
            else:
                requests.request_workers(**asked, count=count, idle_minutes=idle_minutes)
                done = f"{count} workers requested."
        except ParameterError as exc:
            form.add_parameter_error(exc)
        else:
            messages.success(request, done)
            return navigate(request, reverse("pages:workers"))
    return _render_request(request, form)


def _save_request(asked: dict[str, Any], save_as: str) -> None:
    try:
        requests.save_request(
            owner=asked["owner"],
            name=save_as,
            cluster=asked["cluster"],
            environment=asked["environment"],
            params=asked["params"],
        )
    except ParameterError as exc:
        # The saved request's own name is the one field of its not shared with the request.
        raise ParameterError("save_as", exc.message) if exc.field == "name" else exc from None


@login_required_page
@require_POST
def request_again(request: HttpRequest, public_id: str) -> HttpResponse:
    worker = get_object_or_404(
        Worker.objects.select_related("cluster", "environment"),
        public_id=public_id,
        owner=_user(request),
    )
    try:
        again = requests.request_again(worker, owner=_user(request))
    except ParameterError as exc:
        messages.error(request, f"Worker {worker.name} cannot be requested again: {exc.message}")
    else:
        messages.success(request, f"Worker {again.name} requested again.")
    return navigate(request, reverse("pages:workers"))


@login_required_page
@require_POST
def keep_worker(request: HttpRequest, public_id: str) -> HttpResponse:
    worker = get_object_or_404(Worker, public_id=public_id, owner=_user(request))
    idle.keep_worker(worker, owner=_user(request))
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse({"kept": worker.public_id})
    messages.success(request, f"Worker {worker.name} kept: its idle clock starts again.")
    return navigate(request, reverse("pages:workers"))


@login_required_page
@require_GET
def request_fields(request: HttpRequest) -> HttpResponse:
    """The scheduling fields of the environment just chosen in the request dialog."""
    groups, selected = _request_form_setup(request, request.GET.get("environment", ""))
    form = RequestWorkerForm(groups=groups, selected=selected)
    return render(request, "workers_app/workers/_env_fields.html", {"form": form})


@login_required_page
@require_http_methods(["GET", "POST"])
def delete_worker(request: HttpRequest, public_id: str) -> HttpResponse:
    worker = get_object_or_404(
        Worker.objects.visible_to(_user(request)).select_related("cluster"), public_id=public_id
    )
    if request.method == "POST":
        if deletion.delete_worker(worker):
            messages.success(request, f"Worker {worker.name} is being deleted.")
        else:
            messages.info(request, f"Worker {worker.name} had already ended.")
        return navigate(request, reverse("pages:workers"))
    template = "_delete_confirm.html" if is_htmx(request) else "delete.html"
    return render(request, f"workers_app/workers/{template}", {"worker": worker})


@login_required_page
@require_GET
def worker_terminal(request: HttpRequest, public_id: str) -> HttpResponse:
    # The owner's alone, staff included: a shell acts as the owner's cluster account.
    worker = get_object_or_404(
        Worker.objects.select_related("cluster"), public_id=public_id, owner=_user(request)
    )
    keep = request.GET.get("keep", "main")
    if not KEEP_NAME.fullmatch(keep):
        raise Http404("no such kept terminal")
    try:
        cwd = checked_folder(request.GET.get("cwd", ""), "cwd")
    except ParameterError as exc:
        return HttpResponseBadRequest(f"The folder to open in {exc.message}.")
    context = {"worker": worker, "keep": keep, "cwd": cwd}
    return render(request, "workers_app/workers/terminal.html", context)


# Clusters and the user's accounts on them


@login_required_page
@require_GET
def clusters(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    environments = Prefetch("environments", queryset=Environment.objects.visible_to(user))
    found = list(Cluster.objects.visible_to(user).prefetch_related(environments))
    mine = {a.cluster_id: a for a in ClusterAccount.objects.filter(user=user)}
    rows = [(cluster, mine.get(cluster.pk), _unix_name(user, cluster, mine)) for cluster in found]
    return render(
        request,
        "workers_app/clusters/list.html",
        {"rows": rows, "site_name": site_name_of(user)},
    )


def _unix_name(user: User, cluster: Cluster, mine: dict[int, ClusterAccount]) -> str | None:
    if cluster.pk in mine:
        return str(mine[cluster.pk].remote_username)
    return unix_name_on(user, cluster) if cluster.ca_public_key else None


def _cluster_and_account(request: HttpRequest, name: str) -> tuple[Cluster, ClusterAccount | None]:
    cluster = get_object_or_404(Cluster.objects.visible_to(_user(request)), name=name)
    return cluster, accounts.account_of(_user(request), cluster)


@login_required_page
@require_http_methods(["GET", "POST"])
def cluster_account(request: HttpRequest, name: str) -> HttpResponse:
    """The user's account on one cluster: connect (or replace) it, see what to do next."""
    cluster, account = _cluster_and_account(request, name)
    form = ConnectAccountForm(
        request.POST or None,
        initial={"remote_username": account.remote_username if account else ""},
    )
    if request.method == "POST" and form.is_valid():
        try:
            accounts.connect_account(
                _user(request),
                cluster,
                remote_username=form.cleaned_data["remote_username"],
                private_key=form.cleaned_data["private_key"],
            )
        except ParameterError as exc:
            form.add_parameter_error(exc)
        else:
            messages.success(request, f"Account connected on {cluster.name}; verify it next.")
            return redirect("pages:cluster-account", name=cluster.name)
    return render(
        request,
        "workers_app/clusters/account.html",
        {"cluster": cluster, "account": account, "form": form},
    )


@login_required_page
@require_POST
def verify_account(request: HttpRequest, name: str) -> HttpResponse:
    cluster, account = _cluster_and_account(request, name)
    if account is None:
        messages.error(request, f"You have no account on {cluster.name} to verify.")
    elif accounts.verify_account(account):
        messages.success(request, f"Verified: ACTIVATE logs in to {cluster.name} as you.")
    else:
        messages.error(request, f"Could not log in to {cluster.name}: {account.last_error}")
    return redirect("pages:cluster-account", name=cluster.name)


@login_required_page
@require_POST
def disconnect_account(request: HttpRequest, name: str) -> HttpResponse:
    cluster, account = _cluster_and_account(request, name)
    if account is not None:
        try:
            accounts.disconnect_account(account)
        except ParameterError as exc:
            messages.error(request, exc.message)
            return redirect("pages:cluster-account", name=cluster.name)
        messages.success(request, f"Account on {cluster.name} disconnected.")
    return redirect("pages:clusters")


# API keys


@login_required_page
@require_http_methods(["GET", "POST"])
def api_keys(request: HttpRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        _, secret = ApiKey.issue(_user(request), name=form.cleaned_data["name"])
        # Shown on the next page view only: the plain key is never stored.
        request.session[NEW_API_KEY] = secret
        return redirect("pages:api-keys")
    keys = ApiKey.objects.filter(user=_user(request))
    secret = request.session.pop(NEW_API_KEY, None)
    return render(
        request, "workers_app/api_keys/list.html", {"form": form, "keys": keys, "secret": secret}
    )


@login_required_page
@require_POST
def revoke_api_key(request: HttpRequest, pk: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, pk=pk, user=_user(request))
    key.delete()
    messages.success(request, f"API key {key.prefix}… revoked.")
    return redirect("pages:api-keys")


# Usage


@login_required_page
@require_GET
def usage_page(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    now = timezone.now()
    try:
        since = usage.month_start(
            datetime.strptime(request.GET["month"], "%Y-%m").replace(tzinfo=UTC)
        )
    except (KeyError, ValueError):
        since = usage.month_start(now)
    until = usage.next_month(since)
    everyone = user.is_staff and request.GET.get("all") == "1"
    rows = usage.usage(since=since, until=until, users=None if everyone else [user])
    total = sum(row.node_seconds for row in rows)
    previous = usage.month_start(since - timedelta(days=1))
    context = {
        "since": since,
        "previous": previous,
        "next": until if until <= now else None,
        "everyone": everyone,
        "rows": rows,
        "total_hours": total / 3600,
        "total_clock": usage.clock(total),
        "caps": usage.caps_of(user),
    }
    return render(request, "workers_app/usage/page.html", context)
