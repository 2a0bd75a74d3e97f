"""API keys sent as ``Authorization: Bearer <key>``; only their SHA-256 is stored. A key past
its expiry is refused, and a key `pw auth login` got by signing in (scope "session") may do
everything but manage API keys."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Q
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from core.api.bearer import KEYWORD
from workers_app.models import ApiKey, KeyScope, hash_secret

__all__ = ["KEYWORD", "ApiKeyAuthentication", "FullKeyOnly", "user_for_api_key"]
EXPIRED = "API key expired; run pw auth login"
# last_used_at answers "is this key still in use?"; writing it on every request would turn
# each read into a write, so it moves only when it is older than this.
LAST_USED_RESOLUTION = timedelta(minutes=5)


def touch_last_used(key: ApiKey) -> None:
    now = timezone.now()
    if key.last_used_at is not None and key.last_used_at > now - LAST_USED_RESOLUTION:
        return
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_RESOLUTION)
    ApiKey.objects.filter(stale, pk=key.pk).update(last_used_at=now)
    key.last_used_at = now


def user_for_api_key(secret: str) -> tuple[AbstractBaseUser, ApiKey] | None:
    """The active user a key belongs to, or None. Used by the API and the WebSockets alike."""
    key = ApiKey.objects.select_related("user").filter(key_hash=hash_secret(secret)).first()
    if key is None or not key.user.is_active or key.has_expired():
        return None
    touch_last_used(key)
    return key.user, key


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, ApiKey] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD.lower().encode():
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Invalid Authorization header: expected 'Bearer <key>'.")
        try:
            secret = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid API key.") from None
        found = user_for_api_key(secret)
        if found is None:
            expired = ApiKey.objects.filter(
                key_hash=hash_secret(secret), expires_at__lte=timezone.now()
            )
            raise AuthenticationFailed(EXPIRED if expired.exists() else "Invalid API key.")
        return found

    def authenticate_header(self, request: Request) -> str:
        return f'{KEYWORD} realm="api"'


class FullKeyOnly(BasePermission):
    """Refuses keys of the "session" scope: a key got by signing in cannot make keys that
    outlive it. The browser's session is not a key and passes."""

    message = "This API key, from `pw auth login`, cannot manage API keys; use the web UI."

    def has_permission(self, request: Request, view: Any) -> bool:
        key = request.auth
        return not (isinstance(key, ApiKey) and key.scope == KeyScope.SESSION)


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = ApiKeyAuthentication
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        definition = build_bearer_security_scheme_object(
            header_name="Authorization", token_prefix=KEYWORD
        )
        definition["description"] = "An API key from `manage.py create_api_key` or the web UI."
        return definition
