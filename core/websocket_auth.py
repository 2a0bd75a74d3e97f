"""Who is on the other end of a WebSocket: an API key's user, or the browser session's.

A browser sends its session cookie to any page that opens a WebSocket to us, so a cookie counts
only when the Origin is this site's own (the WebSocket twin of the CSRF check). A client with an
API key (`pw`) sends no cookie and needs no Origin.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from asgiref.typing import ASGIReceiveCallable, ASGISendCallable
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import validate_host
from django.utils.module_loading import import_string

from core.api.bearer import KEYWORD

Scope = dict[str, Any]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def origin_allowed(scope: Scope) -> bool:
    origin = _header(scope, b"origin")
    if origin is None:
        return False
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parsed = urlsplit(origin)
    host = _header(scope, b"host") or ""
    # The page and the socket on one host and port, and that host one we serve.
    return parsed.netloc == host and validate_host(parsed.hostname or "", settings.ALLOWED_HOSTS)


@database_sync_to_async
def _key_user(secret: str) -> Any:
    # The key store is the accounts' own (settings.ACTIVATE_API_KEY_USER names it), so the
    # ground floor reads keys without importing an app.
    found = import_string(settings.ACTIVATE_API_KEY_USER)(secret)
    return found[0] if found else AnonymousUser()


class WebSocketAuthMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.with_session = AuthMiddlewareStack(self._check_origin)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        parts = (_header(scope, b"authorization") or "").split()
        # Only the API's own scheme is a key, as for the REST API: another one (JupyterLab sends
        # its server's token with each request) is a session program's, and the cookie counts.
        if parts and parts[0].lower() == KEYWORD.lower():
            valid = len(parts) == 2
            user = await _key_user(parts[1]) if valid else AnonymousUser()
            await self.app(dict(scope, user=user, auth="api_key"), receive, send)
            return
        await self.with_session(scope, receive, send)

    async def _check_origin(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        refused = not origin_allowed(scope)
        await self.app(dict(scope, auth="session", origin_refused=refused), receive, send)
