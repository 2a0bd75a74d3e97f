"""URLs of the agents' own server (`scripts/start.sh agents`): the agent endpoints only.

Every other path is a 404 there, so the process that keeps heartbeats flowing while users'
requests pile up on the web server offers no way into the API, the pages or the admin.
"""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [
    path("agent/v1/", include("agents.urls")),
]
