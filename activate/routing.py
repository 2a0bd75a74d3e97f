"""What the ASGI server serves: Django for every HTTP request, consumers for WebSockets.

Long-lived connections (terminals, session proxies) live on the event loop and never hold one
of the threads that page, API and agent requests run on.
"""

from __future__ import annotations

from typing import Any

from channels.routing import ProtocolTypeRouter, URLRouter
from django.urls import path

from activate.websocket_auth import WebSocketAuthMiddleware
from sessions_app.proxy.http_proxy import SessionHttpProxy
from sessions_app.proxy.target import PREFIX as SESSION_PREFIX
from sessions_app.proxy.websocket_proxy import SessionWebSocketProxy
from workers_app.terminals.consumer import TerminalConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/workers/<str:public_id>/terminal/", TerminalConsumer.as_asgi()),
    path("s/<str:public_id>/<path:rest>", SessionWebSocketProxy.as_asgi()),
    path("s/<str:public_id>/", SessionWebSocketProxy.as_asgi()),
]


class HttpRouter:
    """Session URLs go to the session proxy, on the event loop; everything else to Django."""

    def __init__(self, django_app: Any) -> None:
        self.django_app = django_app
        self.sessions = WebSocketAuthMiddleware(SessionHttpProxy())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["path"].startswith(SESSION_PREFIX):
            await self.sessions(scope, receive, send)
        else:
            await self.django_app(scope, receive, send)


def build_application(django_app: Any) -> Any:
    return ProtocolTypeRouter(
        {
            "http": HttpRouter(django_app),
            "websocket": WebSocketAuthMiddleware(URLRouter(websocket_urlpatterns)),
        }
    )
