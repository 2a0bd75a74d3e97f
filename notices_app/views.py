"""The page's notice feed (polled by notices.js) and each user's choice of what to be told."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from core.pages import login_required_page
from notices_app import services
from notices_app.models import NoticePrefs

FEED_MAX = 20


class PrefsForm(forms.ModelForm):
    class Meta:
        model = NoticePrefs
        fields = [
            "connected_page",
            "connected_email",
            "walltime_page",
            "walltime_email",
            "idle_page",
            "idle_email",
        ]


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


@login_required_page
@require_GET
def feed(request: HttpRequest) -> HttpResponse:
    try:
        after = max(0, int(request.GET.get("after", "0")))
    except ValueError:
        return JsonResponse({"detail": "after: must be a notice id"}, status=400)
    shown = services.shown_to(_user(request), after=after)[:FEED_MAX]
    return JsonResponse(
        {
            "notices": [
                {
                    "id": n.id,
                    "kind": n.kind,
                    "title": n.title,
                    "body": n.body,
                    "keep": services.keep_url(n),
                }
                for n in shown
            ]
        }
    )


@login_required_page
@require_http_methods(["GET", "POST"])
def settings_page(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    prefs = services.prefs_of(user)
    form = PrefsForm(request.POST or None, instance=prefs)
    if request.method == "POST" and form.is_valid():
        services.save_prefs(user, form.cleaned_data)
        messages.success(request, "Saved: what you are told, and how.")
        return redirect("notices:settings")
    recent = user.notices.select_related("worker").order_by("-id")[:20]
    return render(
        request, "notices_app/settings.html", {"form": form, "recent": recent, "email": user.email}
    )
