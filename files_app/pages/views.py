"""The Files page: a folder of a cluster, as the user's own Unix account, over
files_app.services.

The cluster is looked up among those the user may see (any other is a 404, as on every page);
what may be listed is the cluster's OS's to say, and its refusals are said in words on the page.
The listing is rendered here, and again alone for htmx when the user enters a folder; changes
(uploads, new folders, renames, deletes) go through the files API and its streams, from
files.js, which then asks for the listing again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from core.errors import ParameterError
from core.pages import is_htmx, login_required_page
from core.transport.errors import CommandTimeout, SSHError
from core.transport.sftp import FileError, NoSuchFile, PermissionDenied
from files_app import paths, services
from files_app.pages import rows
from workers_app.models import Cluster, Worker
from workers_app.statuses import WorkerStatus

# Terminals offered in a folder, one per connected worker on its cluster, at most.
MAX_TERMINAL_OPENERS = 5


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)  # login_required_page ran
    return request.user


@login_required_page
@require_GET
def files_index(request: HttpRequest) -> HttpResponse:
    """The nav's Files: straight to the one cluster there is, else a choice of them."""
    clusters = list(Cluster.objects.visible_to(_user(request)).order_by("name"))
    if len(clusters) == 1:
        return redirect("files_pages:files", name=clusters[0].name)
    return render(request, "files_app/index.html", {"clusters": clusters})


@dataclass
class Folder:
    """What the page shows of one folder, or why it shows nothing."""

    asked: bytes
    roots: list[dict[str, str]] = field(default_factory=list)
    listing: dict[str, Any] | None = None
    problem: str = ""
    account_missing: bool = False


def _problem(exc: Exception, cluster: Cluster, asked: bytes) -> str:
    where = paths.display(asked)
    if isinstance(exc, PermissionDenied):
        return f"Permission denied: the cluster does not let your account read {where}."
    if isinstance(exc, NoSuchFile):
        return f"Not found: there is no {where} on {cluster.name}."
    if isinstance(exc, FileError):
        return f"{where}: {exc}"
    if isinstance(exc, CommandTimeout):
        return f"{cluster.name} is busy: every channel to it is in use. Try again in a moment."
    return f"{cluster.name} cannot be reached: {exc}"


def _folder(user: User, cluster: Cluster, asked: bytes) -> Folder:
    folder = Folder(asked=asked)
    try:
        place = services.place_for(user, cluster.name)
        with services.open_files(place) as files:
            folder.roots = services.roots(place, files)
            folder.listing = services.listing(files, asked)
    except services.ClusterNotFound:
        raise Http404("No such cluster.") from None
    except ParameterError as exc:  # no account (or Unix name) there
        folder.problem, folder.account_missing = exc.message, True
    except (FileError, SSHError) as exc:
        folder.problem = _problem(exc, cluster, asked)
    return folder


@dataclass(frozen=True)
class Opener:
    """Somewhere the folder shown can be opened: a terminal on a worker, or a session."""

    label: str
    url: str


def _openers(user: User, cluster: Cluster, here: bytes) -> list[Opener]:
    """A terminal in the folder on each of the user's connected workers there, and a session
    launched in it; none for a name that is no UTF-8 (a terminal or session takes text)."""
    try:
        folder = here.decode("utf-8")
    except UnicodeDecodeError:
        return []
    workers = Worker.objects.visible_to(user).filter(
        owner=user, cluster=cluster, status=WorkerStatus.CONNECTED
    )
    openers = [
        Opener(
            f"Terminal on {worker.name}",
            reverse("pages:worker-terminal", args=[worker.public_id])
            + "?"
            + urlencode({"cwd": folder}),
        )
        for worker in workers.order_by("name")[:MAX_TERMINAL_OPENERS]
    ]
    query = urlencode({"cluster": cluster.name, "folder": folder})
    openers.append(Opener("Session…", f"{reverse('sessions:sessions')}?{query}#launch-title"))
    return openers


def _context(request: HttpRequest, cluster: Cluster, folder: Folder) -> dict[str, Any]:
    page_url = reverse("files_pages:files", args=[cluster.name])
    stream_url = f"/files/{cluster.name}/"
    listing = folder.listing
    here = paths.path_from(listing) if listing else folder.asked
    entries = rows.rows(page_url, stream_url, listing["entries"]) if listing else []
    return {
        "cluster": cluster,
        "folder": folder,
        "listing": listing,
        "here": paths.display(here),
        "here_b64": paths.b64(here),
        "crumbs": rows.crumbs(page_url, here),
        "places": rows.places(page_url, folder.roots, here),
        "parent_url": rows.page_link(page_url, listing["parent_b64"])
        if listing and listing["parent_b64"]
        else "",
        "rows": entries,
        "openers": _openers(_user(request), cluster, here) if listing else [],
        "hidden_count": sum(1 for row in entries if row.hidden),
        "page_url": page_url,
        "api_url": reverse("files-list", args=[cluster.name]),
        "stream_url": stream_url,
    }


@login_required_page
@require_GET
def files_page(request: HttpRequest, name: str) -> HttpResponse:
    cluster = get_object_or_404(Cluster.objects.visible_to(_user(request)), name=name)
    try:
        asked = paths.path_from(request.GET, required=False) or b"~"
        folder = _folder(_user(request), cluster, asked)
    except ParameterError as exc:  # a path_b64 that is no base64
        folder = Folder(asked=b"~", problem=f"That address names no path: {exc.message}.")
    context = _context(request, cluster, folder)
    # htmx asks for the listing alone, but for the whole page when restoring history.
    partial = is_htmx(request) and not request.headers.get("HX-History-Restore-Request")
    template = "files_app/_listing.html" if partial else "files_app/browser.html"
    return render(request, template, context)
