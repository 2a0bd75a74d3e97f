"""Endpoints the node agent calls. Plain Django views: the heartbeat is the hot path.

Every request is signed by the agent (``signing``) and every answer to a request that passed
those checks is signed back; a refusal of the signature itself (401) is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from redis.exceptions import RedisError

from agents import service as agent_service
from agents import signing
from agents.beats import AgentBeats
from agents.errors import AgentRefused, server_time
from agents.payloads import MAX_BODY, beat_answer, parse_beat, parse_connect, parse_session_ids
from agents.signing import SignedCall
from core import metrics as families
from core.redis_connection import redis_client


def _refused(exc: AgentRefused) -> JsonResponse:
    return JsonResponse(exc.answer(), status=exc.status)


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
        )
    except AgentRefused as exc:
        return _refused(exc)
    try:
        # Its time is checked here, against Redis's clock: a refusal for it alone is signed.
        if nonce:
            signing.consume_nonce(call)
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
        hostname, job_id = parse_connect(request.body, call.worker)
        interval = agent_service.connect_agent(
            call.worker, call.key_hash, hostname=hostname, job_id=job_id
        )
        return {
            "status": "connected",
            "heartbeat_interval": interval,
            "activity_interval": settings.ACTIVATE_ACTIVITY_INTERVAL,
            "server_time": server_time(AgentBeats().server_time()),
        }

    return _signed_call(request, handle)


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    """A beat sent to the web server (an installation whose agents call it): the agents' own
    server answers beats before Django (agents/asgi.py); both do the same beat, the service's."""

    def handle(call: SignedCall) -> dict[str, Any]:
        activity, problem = parse_beat(request.body, call.worker)
        # The nonce is remembered in the beat's own Redis round trip.
        agent_service.record_heartbeat(
            call.worker, call.key_hash, nonce=signing.nonce_of(call), activity=activity
        )
        return beat_answer(problem)

    response = _signed_call(request, handle, nonce=False)
    families.heartbeat_answered(response.status_code)
    return response


@csrf_exempt
@require_POST
def sessions_ended(request: HttpRequest) -> JsonResponse:
    """The agent saw launchers of sessions end on its node."""

    def handle(call: SignedCall) -> dict[str, Any]:
        session_ids = parse_session_ids(request.body, call.worker)
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
