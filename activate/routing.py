"""What the ASGI server serves: Django for every HTTP request, consumers for WebSockets.

Long-lived connections (terminals, session proxies) live on the event loop and never hold one
of the threads that page, API and agent requests run on.
"""

from __future__ import annotations

from typing import Any

from channels.routing import ProtocolTypeRouter, URLRouter
from django.urls import path

from sessions_app.origins import (
    RefuseSessionOrigins,
    SessionHttpGate,
    SessionWebSocketGate,
    serves,
)
from sessions_app.proxy.http_proxy import SessionHttpProxy
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


class HttpRouter:
    """Session URLs and sessions' own hosts go to the sessions' gate, on the event loop;
    everything else to Django (never a session's page: sessions_app/origins.py)."""

    def __init__(self, django_app: Any) -> None:
        self.django_app = RefuseSessionOrigins(django_app)
        self.sessions = SessionHttpGate(SessionHttpProxy())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if serves(scope):
            await self.sessions(scope, receive, send)
        else:
            await self.django_app(scope, receive, send)


def build_application(django_app: Any) -> Any:
    return ProtocolTypeRouter(
        {
            "http": HttpRouter(django_app),
            "websocket": SessionWebSocketGate(
                URLRouter(session_websocket_urlpatterns), URLRouter(websocket_urlpatterns)
            ),
        }
    )
