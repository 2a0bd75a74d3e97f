from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse

from workers_app.redis_connection import redis_client


def health(request: HttpRequest) -> JsonResponse:
    """Reachability of the database and Redis; 503 when either is down."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {exc}"
    try:
        redis_client().ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {exc}"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503
    )
