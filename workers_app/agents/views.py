"""Endpoints the node agent calls. Plain Django views: the heartbeat is the hot path."""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from redis.exceptions import RedisError

from workers_app.agents import service as agent_service
from workers_app.agents.service import AgentRefused
from workers_app.redis_connection import redis_client

MAX_BODY = 4096
HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{0,254}$")
JOB_ID = re.compile(r"^[A-Za-z0-9.\-_\[\]]{0,64}$")
WORKER_ID = re.compile(r"^[a-z0-9]{1,16}$")


def parse_payload(body: bytes, allowed: set[str]) -> dict[str, str]:
    """The allowlisted fields of an agent's JSON body; AgentRefused if it is not acceptable."""
    if len(body) > MAX_BODY:
        raise AgentRefused(400, "request body too large")
    try:
        data: Any = json.loads(body or b"{}")
    except ValueError:
        raise AgentRefused(400, "body must be JSON") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise AgentRefused(400, "body must be a JSON object of strings")
    # Only allowlisted fields are read; anything else the job sends is ignored.
    payload = {k: v for k, v in data.items() if k in allowed}
    if not WORKER_ID.fullmatch(payload.get("worker", "")):
        raise AgentRefused(400, "worker: missing or malformed")
    return payload


def bearer_secret(header: str) -> str:
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret:
        raise AgentRefused(403, "missing bearer secret")
    return secret.strip()


def _payload(request: HttpRequest, allowed: set[str]) -> dict[str, str]:
    return parse_payload(request.body, allowed)


def _secret(request: HttpRequest) -> str:
    return bearer_secret(request.headers.get("Authorization", ""))


def _refused(exc: AgentRefused) -> JsonResponse:
    return JsonResponse({"error": exc.message}, status=exc.status)


@csrf_exempt
@require_POST
def connect(request: HttpRequest) -> JsonResponse:
    try:
        payload = _payload(request, {"worker", "hostname", "job_id"})
        hostname, job_id = payload.get("hostname", ""), payload.get("job_id", "")
        if not HOSTNAME.fullmatch(hostname):
            raise AgentRefused(400, "hostname: missing or malformed")
        if not JOB_ID.fullmatch(job_id):
            raise AgentRefused(400, "job_id: malformed")
        interval = agent_service.connect_agent(
            payload["worker"], _secret(request), hostname=hostname, job_id=job_id
        )
    except AgentRefused as exc:
        return _refused(exc)
    return JsonResponse({"status": "connected", "heartbeat_interval": interval})


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    try:
        payload = _payload(request, {"worker"})
        agent_service.record_heartbeat(payload["worker"], _secret(request))
    except AgentRefused as exc:
        return _refused(exc)
    return JsonResponse({"status": "ok"})


@require_GET
def ping(request: HttpRequest) -> JsonResponse:
    """Whether a heartbeat could be accepted now (this server answers and reaches Redis):
    what the heartbeat sweep asks before it counts anyone's silence."""
    try:
        redis_client().ping()
    except RedisError:
        return JsonResponse({"status": "deaf"}, status=503)
    return JsonResponse({"status": "ok"})
