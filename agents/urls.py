from __future__ import annotations

from django.urls import path

from agents import views as agent_views

urlpatterns = [
    path("connect", agent_views.connect, name="agent-connect"),
    path("heartbeat", agent_views.heartbeat, name="agent-heartbeat"),
    path("ping", agent_views.ping, name="agent-ping"),
    path("sessions/ended", agent_views.sessions_ended, name="agent-sessions-ended"),
]
