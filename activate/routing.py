"""What the ASGI server serves: Django for every HTTP request, consumers for WebSockets.

Long-lived connections (terminals, session proxies) live on the event loop and never hold one
of the threads that page, API and agent requests run on.
"""

from __future__ import annotations

import re
from typing import Any

from channels.routing import ProtocolTypeRouter, URLRouter
from django.urls import path

from files_app.transfers import PATH as FILES_PATH
from files_app.transfers import FileTransfers
from sessions_app.proxy.http_proxy import SessionHttpProxy
from sessions_app.proxy.origins import (
    RefuseSessionOrigins,
    SessionHttpGate,
    SessionWebSocketGate,
    serves,
)
from sessions_app.proxy.websocket_proxy import SessionWebSocketProxy
from workers_app.terminals.consumer import TerminalConsumer

session_websocket_urlpatterns: list[Any] = [
    path("s/<str:public_id>/<path:rest>", SessionWebSocketProxy.as_asgi()),
    path("s/<str:public_id>/", SessionWebSocketProxy.as_asgi()),
]
websocket_urlpatterns: list[Any] = [
    path("ws/workers/<str:public_id>/terminal/", TerminalConsumer.as_asgi()),
    *session_websocket_urlpatterns,
]


# Commands run on a worker's node through the API: Django's too, on threads of their own.
EXEC_PATH = re.compile(r"^/api/workers/[^/]+/exec/?$")


class HttpRouter:
    """Session URLs and sessions' own hosts go to the sessions' gate, on the event loop;
    files' downloads and uploads stream on the event loop too; commands run through the API to
    Django's own pool for them; everything else to Django (never a session's page:
    sessions_app/proxy/origins.py)."""

    def __init__(self, django_app: Any, exec_app: Any | None = None) -> None:
        self.django_app = RefuseSessionOrigins(django_app)
        self.exec_app = RefuseSessionOrigins(exec_app) if exec_app is not None else None
        self.sessions = SessionHttpGate(SessionHttpProxy())
        self.files = RefuseSessionOrigins(FileTransfers())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if serves(scope):
            await self.sessions(scope, receive, send)
        elif FILES_PATH.match(scope["path"]):
            await self.files(scope, receive, send)
        elif self.exec_app is not None and EXEC_PATH.match(scope["path"]):
            await self.exec_app(scope, receive, send)
        else:
            await self.django_app(scope, receive, send)


def build_application(django_app: Any, exec_app: Any | None = None) -> Any:
    return ProtocolTypeRouter(
        {
            "http": HttpRouter(django_app, exec_app),
            "websocket": SessionWebSocketGate(
                URLRouter(session_websocket_urlpatterns), URLRouter(websocket_urlpatterns)
            ),
        }
    )
