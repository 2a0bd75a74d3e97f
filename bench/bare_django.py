"""The baseline of the heartbeat benchmark: a bare Django view doing one Redis SET (WSGI).

    gunicorn bench.bare_django:application   (REDIS_URL from the environment)

No middleware, no database, no authentication: what Django itself costs per request, so the
agents' server is compared with the cheapest a Django view can be.
"""

from __future__ import annotations

import os

import django
import redis
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-only-" + "x" * 50,
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
    INSTALLED_APPS=[],
)
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

client = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=5)


@csrf_exempt
def beat(request: HttpRequest) -> JsonResponse:
    client.set("bench:bare-django-beat", 1, px=30_000)
    return JsonResponse({"status": "ok"})


urlpatterns = [path("agent/v1/heartbeat", beat)]
application = get_wsgi_application()
