"""The agent's report of launchers gone ends this worker's running sessions among them, for
that reason, and nothing else: another worker's sessions, or sessions no longer running, stay
as they are; an unsigned report changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from harness.agents import SignedAgent
from sessions_app.models import Session
from sessions_app.services import REASON_PROGRAM_ENDED
from sessions_app.statuses import SessionStatus
from tests.agents.heartbeats.signed import django_post, worker_with_key
from workers_app.models import Worker

S = SessionStatus
pytestmark = pytest.mark.django_db


def session_on(worker: Worker, status: SessionStatus) -> Session:
    session = Session(
        name="desktop_1", owner=worker.owner, session_type="desktop", worker=worker, status=status
    )
    session.set_secret("s3cret")
    session.save()
    return session


def report(client: Client, agent: SignedAgent, sessions: list[str]) -> tuple[int, Any, bool]:
    return django_post(
        client, agent, "sessions/ended", {"worker": agent.public_id, "sessions": sessions}
    )


def test_the_workers_running_sessions_named_end_and_nothing_else(client: Client) -> None:
    worker, agent = worker_with_key()
    other, _ = worker_with_key()
    gone, running = session_on(worker, S.RUNNING), session_on(worker, S.RUNNING)
    stopped, elsewhere = session_on(worker, S.ENDED), session_on(other, S.RUNNING)

    named = [gone.public_id, stopped.public_id, elsewhere.public_id, "snosuchsession"]
    status, _, signed = report(client, agent, named)

    assert (status, signed) == (200, True)
    states = {
        s.public_id: (s.status, s.status_reason)
        for s in Session.objects.filter(pk__in=[gone.pk, running.pk, stopped.pk, elsewhere.pk])
    }
    assert states[gone.public_id] == (S.ENDED, REASON_PROGRAM_ENDED)
    assert states[running.public_id][0] == S.RUNNING
    assert states[stopped.public_id] == (S.ENDED, "")
    assert states[elsewhere.public_id][0] == S.RUNNING


def test_an_unsigned_or_forged_report_ends_nothing(client: Client) -> None:
    worker, agent = worker_with_key()
    session = session_on(worker, S.RUNNING)
    forged = SignedAgent(worker.public_id, agent.key_id, "0" * 64)
    assert report(client, forged, [session.public_id])[0] == 401
    bearer = client.post(
        "/agent/v1/sessions/ended",
        data={"worker": worker.public_id, "sessions": [session.public_id]},
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    assert bearer.status_code == 401
    session.refresh_from_db()
    assert session.status == S.RUNNING


@pytest.mark.parametrize("sessions", [["../x"], "s1", [7], ["s"] * 101])
def test_a_malformed_report_is_a_signed_400(client: Client, sessions: Any) -> None:
    _, agent = worker_with_key()
    status, _, signed = report(client, agent, sessions)
    assert (status, signed) == (400, True)
