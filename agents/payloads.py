"""What an agent's request body may say: the allowlisted fields of each call, checked.

Both ways a beat comes in (the agents' server's ASGI path, agents/asgi.py, and Django's view on
the web server, agents/views.py) read its body here, as the other calls' views do theirs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agents.activity import FIELDS as ACTIVITY_FIELDS
from agents.activity import ActivityReport, activity_of
from agents.errors import AgentRefused

MAX_BODY = 4096
HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{0,254}$")
JOB_ID = re.compile(r"^[A-Za-z0-9.\-_\[\]]{0,64}$")
WORKER_ID = re.compile(r"^[a-z0-9]{1,16}$")
SESSION_ID = re.compile(r"^[a-z0-9]{1,32}$")
MAX_SESSIONS_PER_REPORT = 100
BEAT_FIELDS = {"worker"} | ACTIVITY_FIELDS
CONNECT_FIELDS = {"worker", "hostname", "job_id"}


def _json(body: bytes) -> Any:
    if len(body) > MAX_BODY:
        raise AgentRefused(400, "request body too large")
    try:
        return json.loads(body or b"{}")
    except ValueError:
        raise AgentRefused(400, "body must be JSON") from None


def parse_payload(body: bytes, allowed: set[str]) -> dict[str, str]:
    """The allowlisted fields of an agent's JSON body; AgentRefused if it is not acceptable."""
    data = _json(body)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise AgentRefused(400, "body must be a JSON object of strings")
    # Only allowlisted fields are read; anything else the job sends is ignored.
    payload = {k: v for k, v in data.items() if k in allowed}
    if not WORKER_ID.fullmatch(payload.get("worker", "")):
        raise AgentRefused(400, "worker: missing or malformed")
    return payload


def same_worker(named: object, signer: str) -> None:
    if named != signer:
        raise AgentRefused(400, "worker: not the worker that signed the request")


def parse_beat(body: bytes, signer: str) -> tuple[ActivityReport | None, str]:
    """A beat's activity report, if it carries one, and why a malformed one was left out."""
    payload = parse_payload(body, BEAT_FIELDS)
    same_worker(payload["worker"], signer)
    return activity_of(payload)


def parse_connect(body: bytes, signer: str) -> tuple[str, str]:
    """The host name and job id a connecting agent names."""
    payload = parse_payload(body, CONNECT_FIELDS)
    same_worker(payload["worker"], signer)
    hostname, job_id = payload.get("hostname", ""), payload.get("job_id", "")
    if not HOSTNAME.fullmatch(hostname):
        raise AgentRefused(400, "hostname: missing or malformed")
    if not JOB_ID.fullmatch(job_id):
        raise AgentRefused(400, "job_id: malformed")
    return hostname, job_id


def parse_session_ids(body: bytes, signer: str) -> list[str]:
    """The session ids of a report of ended launchers; AgentRefused if it is not acceptable."""
    data = _json(body)
    if not isinstance(data, dict):
        raise AgentRefused(400, "body must be a JSON object")
    same_worker(data.get("worker"), signer)
    sessions = data.get("sessions")
    if (
        not isinstance(sessions, list)
        or len(sessions) > MAX_SESSIONS_PER_REPORT
        or not all(isinstance(s, str) and SESSION_ID.fullmatch(s) for s in sessions)
    ):
        raise AgentRefused(400, "sessions: a list of session ids")
    return list(dict.fromkeys(sessions))


def beat_answer(problem: str) -> dict[str, str]:
    """What a beat is answered: ok, and why its activity report was left out if it was."""
    return {"status": "ok", "activity_error": problem} if problem else {"status": "ok"}
