from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "activate.settings.dev")
# Django's apps load here; the routes import models, so they come after.
django_application = get_asgi_application()

from activate.routing import build_application  # noqa: E402

application = build_application(django_application)
