"""What the ASGI server serves: Django for every HTTP request, consumers for WebSockets.

Long-lived connections (terminals, session proxies) live on the event loop and never hold one
of the threads that page, API and agent requests run on.
"""

from __future__ import annotations

from typing import Any

from channels.routing import ProtocolTypeRouter, URLRouter
from django.urls import path

from activate.websocket_auth import WebSocketAuthMiddleware
from workers_app.terminals.consumer import TerminalConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/workers/<str:public_id>/terminal/", TerminalConsumer.as_asgi()),
]


def build_application(django_app: Any) -> Any:
    return ProtocolTypeRouter(
        {
            "http": django_app,
            "websocket": WebSocketAuthMiddleware(URLRouter(websocket_urlpatterns)),
        }
    )
