"""What every room's pages share: htmx-aware navigation and the login check."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, resolve_url

View = Callable[..., HttpResponseBase]


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def navigate(request: HttpRequest, url: str) -> HttpResponse:
    """Go to ``url``: a redirect, or for htmx a full navigation (out of any dialog)."""
    if is_htmx(request):
        response = HttpResponse()
        response["HX-Redirect"] = url
        return response
    return redirect(url)


def login_required_page(view: View) -> View:
    """login_required that also covers htmx: a poll from a logged-out browser loads the login
    page as a whole page instead of swapping the login form into a table."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        if is_htmx(request):
            current = request.headers.get(
                "HX-Current-URL", resolve_url(settings.LOGIN_REDIRECT_URL)
            )
            return navigate(request, redirect_to_login(current).url)
        return redirect_to_login(request.get_full_path())

    return wrapped
