from __future__ import annotations

from urllib.parse import urlsplit

from core.env import ConfigurationError, EnvReader, is_published_secret

# Before the base settings load: unset, they would make a key of their own in data/.
if EnvReader().optional_string("ACTIVATE_SECRET_KEY") is None:
    raise ConfigurationError("ACTIVATE_SECRET_KEY must be set in production")

from .base import *  # noqa: F403
from .base import ACTIVATE_AGENT_URL, SECRET_KEY, env

# Long enough that it cannot be guessed: it signs sessions and derives the key that encrypts
# stored SSH keys.
MIN_SECRET_KEY_LENGTH = 50

if is_published_secret(SECRET_KEY):
    raise ConfigurationError(
        "ACTIVATE_SECRET_KEY is a published key: set a secret of your own in production"
    )
if len(SECRET_KEY) < MIN_SECRET_KEY_LENGTH:
    raise ConfigurationError(
        f"ACTIVATE_SECRET_KEY must be at least {MIN_SECRET_KEY_LENGTH} characters, "
        f"got {len(SECRET_KEY)}"
    )
# Agents' calls are signed (nothing in them works twice), but what they carry (hostnames, job
# ids) is readable on the way: over plain HTTP only when the operator says so.
if urlsplit(ACTIVATE_AGENT_URL).scheme != "https" and not env.boolean(
    "ACTIVATE_AGENT_PLAIN_HTTP", False
):
    raise ConfigurationError(
        f"ACTIVATE_AGENT_URL must start with https:// in production, got {ACTIVATE_AGENT_URL!r}"
        " (set ACTIVATE_AGENT_PLAIN_HTTP=true to allow plain HTTP)"
    )
DEBUG = False

# TLS ends at a proxy in front of gunicorn, which says so in this header; nothing else may set it.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env.integer("ACTIVATE_HSTS_SECONDS", 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.boolean("ACTIVATE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = False
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = env.boolean("ACTIVATE_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
if SESSION_COOKIE_SECURE:
    # Sessions' hosts may share the platform's site (sessions.example.org, activate.example.org):
    # browsers take a __Host- cookie only from the platform's own host, so a session's page
    # cannot plant a login of its choosing on the platform.
    SESSION_COOKIE_NAME = "__Host-sessionid"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
