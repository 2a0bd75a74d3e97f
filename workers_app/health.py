from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse

from core.redis_connection import redis_client
from core.sweep_lag import sweep_lag
from workers_app.cluster_access import connections_held_everywhere


def health(request: HttpRequest) -> JsonResponse:
    """Reachability of the database and Redis (503 when either is down), how many SSH
    connections the platform's processes hold, and each sweep's lag (seconds since it last
    completed). A large lag does not make this 503: every web server would then leave the load
    balancer for what is the sweeper's or beat's trouble; monitors alert on the field instead.

    Anyone may ask (load balancers, monitors), so a failure is named but its exception text,
    which can carry hosts, ports and user names, is shown to staff only.
    """
    user = getattr(request, "user", None)
    detailed = bool(user is not None and user.is_active and user.is_staff)

    def failed(exc: Exception) -> str:
        return f"error: {exc}" if detailed else "error"

    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = failed(exc)
    ssh_connections = None
    lag: dict[str, float | None] | None = None
    try:
        redis_client().ping()
        checks["redis"] = "ok"
        ssh_connections = connections_held_everywhere()
        lag = sweep_lag()
    except Exception as exc:
        checks["redis"] = failed(exc)
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {
            "status": "ok" if healthy else "error",
            **checks,
            "ssh_connections": ssh_connections,
            "sweep_lag": lag,
        },
        status=200 if healthy else 503,
    )
