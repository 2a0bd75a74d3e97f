"""API keys the command line gets by signing in: the person an ID token from the provider's
device grant names, and a key for them that expires and cannot make keys."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from identity.oidc import user_for_id_token
from workers_app.models import ApiKey, KeyScope

SIGNED_IN_KEY_NAME = "pw auth login"


def sign_in_command_line(id_token: str) -> tuple[ApiKey, str]:
    """A session-scoped key for the person ``id_token`` names (checked as the browser's sign-in
    checks its token, for the command line's client and with no nonce: the device grant has
    none). Raises identity's TokenRefused, SignInRefused or ProviderUnavailable."""
    user = user_for_id_token(id_token, audience=settings.ACTIVATE_OIDC_CLI_CLIENT_ID, nonce=None)
    expires_at = timezone.now() + timedelta(hours=settings.ACTIVATE_CLI_KEY_HOURS)
    return ApiKey.issue(
        user, name=SIGNED_IN_KEY_NAME, expires_at=expires_at, scope=KeyScope.SESSION
    )
