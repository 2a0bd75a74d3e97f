from __future__ import annotations

import gc
import os
from typing import Any, cast

from a2wsgi import WSGIMiddleware
from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "activate.settings.dev")
# Pages and the API run as WSGI on a fixed pool of threads: Django's own ASGI handler starts a
# thread per request, which cost 20 ms a request on a busy machine. Django's apps load here;
# the routes import models, so they come after.
# (The stubs type a WSGI response as HttpResponseBase; it is the iterable of bytes WSGI wants.)
wsgi_application = cast(Any, get_wsgi_application())
django_application = WSGIMiddleware(wsgi_application, workers=settings.ACTIVATE_WEB_THREADS)
# A command run through the API holds its thread until it ends (minutes): such requests have a
# pool of their own, so they can never take the threads pages and the API answer on.
exec_application = WSGIMiddleware(wsgi_application, workers=settings.ACTIVATE_EXEC_THREADS)

from activate.routing import build_application  # noqa: E402

application = build_application(django_application, exec_application)
# Django's modules and objects stay for the life of the process: out of the collector's sight.
# Walking them took each full collection some 80 ms with the whole process stopped, pages,
# API and WebSockets alike (seen as a stall in the exec_flood drill).
gc.freeze()
