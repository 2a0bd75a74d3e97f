"""Workers with agent keys, and agent calls signed as the node agent signs them."""

from __future__ import annotations

import json

from django.test import Client

from harness.agents import SignedAgent
from node import activate_agent
from tests.factories import WorkerFactory
from workers_app.actions import lifecycle
from workers_app.agent_keys import issue_agent_key
from workers_app.models import Worker


def worker_with_key(*, submitted: bool = True) -> tuple[Worker, SignedAgent]:
    """A worker whose job was given a key and runs on node7 as the scheduler says (starting),
    or, if not ``submitted``, whose submission is not recorded yet (pending)."""
    worker = WorkerFactory()
    key = issue_agent_key(worker.public_id)
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=key.key_hash)
    worker.refresh_from_db()
    if submitted:
        lifecycle.mark_submitted(worker, job_id="123")
        lifecycle.mark_started(worker, hostname="node7")
    return worker, SignedAgent(worker.public_id, key.key_id, key.key)


def django_post(
    client: Client, agent: SignedAgent, path: str, body: dict[str, object] | bytes
) -> tuple[int, dict[str, object], bool]:
    """POST /agent/v1/<path> signed: status, JSON answer, and whether the answer is signed."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    url = f"/agent/v1/{path}"
    header, nonce = agent.signed(url, raw)
    response = client.post(
        url, data=raw, content_type="application/json", headers={"Authorization": header}
    )
    signed = activate_agent.verified(
        agent.key,
        response.status_code,
        nonce,
        response.content,
        response.get(activate_agent.SIGNATURE_HEADER, ""),
    )
    return response.status_code, response.json(), signed
