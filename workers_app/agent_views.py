from __future__ import annotations

from django.http import HttpRequest, JsonResponse


def connect(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"error": "not ready"}, status=503)


def heartbeat(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"error": "not ready"}, status=503)
