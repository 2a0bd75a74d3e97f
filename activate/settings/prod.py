from __future__ import annotations

from .base import *  # noqa: F403
from .base import SECRET_KEY, ConfigurationError, env

if SECRET_KEY.startswith("insecure-"):
    raise ConfigurationError("ACTIVATE_SECRET_KEY must be set in production")
DEBUG = False
SESSION_COOKIE_SECURE = env.boolean("ACTIVATE_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
