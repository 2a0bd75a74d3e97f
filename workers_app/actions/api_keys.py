"""API keys the command line gets by signing in: the person an ID token from the provider's
device grant names, and a key for them that expires and cannot make keys."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from core.redis_connection import redis_client
from identity.oidc import TokenRefused, user_for_id_token
from workers_app.models import ApiKey, KeyScope, hash_secret

SIGNED_IN_KEY_NAME = "pw auth login"
# An ID token buys one key: one read from a log or a proxy's memory buys none. Kept longer than
# any provider lets such a token live.
SPENT_PREFIX = "activate:spent-id-token:"
SPENT_FOR = 48 * 3600


def sign_in_command_line(id_token: str) -> tuple[ApiKey, str]:
    """A session-scoped key for the person ``id_token`` names (checked as the browser's sign-in
    checks its token, for the command line's client and with no nonce: the device grant has
    none), once. Raises identity's TokenRefused, SignInRefused or ProviderUnavailable."""
    user = user_for_id_token(id_token, audience=settings.ACTIVATE_OIDC_CLI_CLIENT_ID, nonce=None)
    if not redis_client().set(SPENT_PREFIX + hash_secret(id_token), 1, nx=True, ex=SPENT_FOR):
        raise TokenRefused("it was already exchanged for a key; sign in again")
    expires_at = timezone.now() + timedelta(hours=settings.ACTIVATE_CLI_KEY_HOURS)
    return ApiKey.issue(
        user, name=SIGNED_IN_KEY_NAME, expires_at=expires_at, scope=KeyScope.SESSION
    )
