"""The agent heartbeat skips the browser's middleware stack."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from agents import views as agent_views


class AgentHeartbeatFastPath:
    """Serve heartbeats before sessions, auth, CSRF and messages run.

    Heartbeats are nearly all the requests a large installation serves, the agent signs every
    request with its own key, and none of those layers has anything to do for it; skipping them
    takes about a third off a beat's server time.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.path = reverse("agent-heartbeat")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info == self.path:
            response = agent_views.heartbeat(request)
            # CommonMiddleware would have set it; without it gunicorn sends the body chunked.
            response["Content-Length"] = str(len(response.content))
            return response
        return self.get_response(request)
