"""The agents' server as `scripts/start.sh agents` runs it (uvicorn): heartbeats answered by a
lean ASGI callable, every other agent path by Django's ASGI application."""

from __future__ import annotations

import gc
import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "activate.settings.dev")
# The agents' server serves the agent endpoints only (activate/agent_server_urls.py).
os.environ.setdefault("ACTIVATE_AGENT_SERVER", "true")
# Django's apps load here; the heartbeat path imports models, so it comes after.
django_application = get_asgi_application()

# Under ASGI every request's sync code runs in a thread of its own, so a connection kept for
# reuse (CONN_MAX_AGE) is kept by a thread that is gone: they pile up until PostgreSQL refuses
# new clients. Django's advice for ASGI: no persistent connections.
settings.DATABASES["default"]["CONN_MAX_AGE"] = 0

from agents.asgi import AgentServer  # noqa: E402

application = AgentServer(django_application)
# Django's modules and objects stay for the life of the process: out of the collector's sight,
# so its full collections (every few thousand beats) do not walk them each time.
gc.freeze()
