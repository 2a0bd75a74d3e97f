"""Endpoints the node agent calls. Plain Django views: the heartbeat is the hot path.

Every request is signed by the agent (``signing``) and every answer to a request that passed
those checks is signed back; a refusal of the signature itself (401) is not.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from redis.exceptions import RedisError

from workers_app.agents import service as agent_service
from workers_app.agents import signing
from workers_app.agents.activity import FIELDS as ACTIVITY_FIELDS
from workers_app.agents.activity import activity_of
from workers_app.agents.errors import AgentRefused
from workers_app.agents.signing import SignedCall
from workers_app.metrics import families
from workers_app.redis_connection import redis_client

MAX_BODY = 4096
HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{0,254}$")
JOB_ID = re.compile(r"^[A-Za-z0-9.\-_\[\]]{0,64}$")
WORKER_ID = re.compile(r"^[a-z0-9]{1,16}$")
SESSION_ID = re.compile(r"^[a-z0-9]{1,32}$")
MAX_SESSIONS_PER_REPORT = 100
BEAT_FIELDS = {"worker"} | ACTIVITY_FIELDS


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


def _same_worker(named: object, call: SignedCall) -> None:
    if named != call.worker:
        raise AgentRefused(400, "worker: not the worker that signed the request")


def _refused(exc: AgentRefused) -> JsonResponse:
    return JsonResponse({"error": exc.message}, status=exc.status)


def _signed_call(
    request: HttpRequest, handle: Callable[[SignedCall], dict[str, Any]], *, nonce: bool = True
) -> JsonResponse:
    """Check the request's signature (and remember its nonce unless ``handle`` does), run
    ``handle``, and sign its answer, whatever its status, unless it is a 401."""
    # Too large to be an agent's call: refused before its signature costs a hash of it.
    length = request.headers.get("Content-Length") or "0"
    if not length.isdigit() or int(length) > MAX_BODY:
        return _refused(AgentRefused(413, "request body too large"))
    try:
        call = signing.verify_request(
            request.headers.get("Authorization", ""),
            request.method or "",
            request.path_info,
            request.body,
            now=time.time(),
        )
        if nonce:
            signing.consume_nonce(call)
    except AgentRefused as exc:
        return _refused(exc)
    try:
        response = JsonResponse(handle(call))
    except AgentRefused as exc:
        response = _refused(exc)
    if response.status_code != 401:
        response[signing.SIGNATURE_HEADER] = signing.sign_answer(
            call, response.status_code, response.content
        )
    return response


@csrf_exempt
@require_POST
def connect(request: HttpRequest) -> JsonResponse:
    def handle(call: SignedCall) -> dict[str, Any]:
        payload = parse_payload(request.body, {"worker", "hostname", "job_id"})
        _same_worker(payload["worker"], call)
        hostname, job_id = payload.get("hostname", ""), payload.get("job_id", "")
        if not HOSTNAME.fullmatch(hostname):
            raise AgentRefused(400, "hostname: missing or malformed")
        if not JOB_ID.fullmatch(job_id):
            raise AgentRefused(400, "job_id: malformed")
        interval = agent_service.connect_agent(
            call.worker, call.key_hash, hostname=hostname, job_id=job_id
        )
        return {
            "status": "connected",
            "heartbeat_interval": interval,
            "activity_interval": settings.ACTIVATE_ACTIVITY_INTERVAL,
        }

    return _signed_call(request, handle)


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    def handle(call: SignedCall) -> dict[str, Any]:
        payload = parse_payload(request.body, BEAT_FIELDS)
        _same_worker(payload["worker"], call)
        # The nonce is remembered in the beat's own Redis round trip.
        nonce = signing.nonce_of(call)
        activity, problem = activity_of(payload)
        agent_service.record_heartbeat(call.worker, call.key_hash, nonce=nonce, activity=activity)
        return {"status": "ok", "activity_error": problem} if problem else {"status": "ok"}

    response = _signed_call(request, handle, nonce=False)
    families.heartbeat_answered(response.status_code)
    return response


def parse_session_ids(body: bytes, call: SignedCall) -> list[str]:
    """The session ids of a report of ended launchers; AgentRefused if it is not acceptable."""
    if len(body) > MAX_BODY:
        raise AgentRefused(400, "request body too large")
    try:
        data: Any = json.loads(body or b"{}")
    except ValueError:
        raise AgentRefused(400, "body must be JSON") from None
    if not isinstance(data, dict):
        raise AgentRefused(400, "body must be a JSON object")
    _same_worker(data.get("worker"), call)
    sessions = data.get("sessions")
    if (
        not isinstance(sessions, list)
        or len(sessions) > MAX_SESSIONS_PER_REPORT
        or not all(isinstance(s, str) and SESSION_ID.fullmatch(s) for s in sessions)
    ):
        raise AgentRefused(400, "sessions: a list of session ids")
    return list(dict.fromkeys(sessions))


@csrf_exempt
@require_POST
def sessions_ended(request: HttpRequest) -> JsonResponse:
    """The agent saw launchers of sessions end on its node."""

    def handle(call: SignedCall) -> dict[str, Any]:
        session_ids = parse_session_ids(request.body, call)
        agent_service.report_sessions_ended(call.worker, call.key_hash, session_ids)
        return {"status": "ok"}

    return _signed_call(request, handle)


@require_GET
def ping(request: HttpRequest) -> JsonResponse:
    """Whether a heartbeat could be accepted now (this server answers and reaches Redis):
    what the heartbeat sweep asks before it counts anyone's silence."""
    try:
        redis_client().ping()
    except RedisError:
        return JsonResponse({"status": "deaf"}, status=503)
    return JsonResponse({"status": "ok"})
