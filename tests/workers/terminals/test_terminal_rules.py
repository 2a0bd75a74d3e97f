"""Who may open a terminal, and what a refusal looks like: the real WebSocket consumer and its
authentication, driven through Channels' communicator. None of these reach a cluster: the
refusals come first (the cluster here does not even exist on the network)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth.models import AbstractUser
from django.test import override_settings
from django.utils import timezone

from activate.asgi import application
from core.login_sessions import SessionStore
from tests.factories import ClusterFactory, WorkerFactory
from workers_app.models import ApiKey, TerminalRecord, Worker
from workers_app.statuses import WorkerStatus
from workers_app.terminals.service import StartRequest, TerminalRefused, open_terminal, parse_start

pytestmark = pytest.mark.django_db(transaction=True)
START = json.dumps({"type": "start", "command": [], "pty": True, "cols": 80, "rows": 24})


def converse(
    path: str, headers: list[tuple[bytes, bytes]], messages: list[str]
) -> tuple[list[dict[str, Any]], int | None]:
    """Connect, send ``messages``, collect what the server says until it closes."""

    async def run() -> tuple[list[dict[str, Any]], int | None]:
        scope = {"type": "websocket", "path": path, "headers": headers, "query_string": b""}
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "websocket.connect"})
        assert (await communicator.receive_output(10))["type"] == "websocket.accept"
        for message in messages:
            await communicator.send_input({"type": "websocket.receive", "text": message})
        said: list[dict[str, Any]] = []
        while True:
            event = await communicator.receive_output(10)
            if event["type"] == "websocket.close":
                await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
                await communicator.wait(10)
                return said, event.get("code")
            said.append(json.loads(event["text"]))

    return async_to_sync(run)()


def bearer(user: AbstractUser) -> list[tuple[bytes, bytes]]:
    _, secret = ApiKey.issue(user)
    return [(b"authorization", f"Bearer {secret}".encode())]


def connected_worker(owner: AbstractUser) -> Worker:
    cluster = ClusterFactory(host="unreachable.invalid")
    return WorkerFactory(
        owner=owner,
        cluster=cluster,
        status=WorkerStatus.CONNECTED,
        scheduler_job_id="4242",
        node_hostname="node1",
    )


def test_without_credentials_the_socket_closes_as_unauthenticated(user: AbstractUser) -> None:
    worker = connected_worker(user)
    said, code = converse(f"/ws/workers/{worker.public_id}/terminal/", [], [START])
    assert code == 4401 and said[0]["code"] == 4401


def test_a_bad_api_key_is_refused(user: AbstractUser) -> None:
    worker = connected_worker(user)
    headers = [(b"authorization", b"Bearer pwk_not-a-key")]
    _said, code = converse(f"/ws/workers/{worker.public_id}/terminal/", headers, [START])
    assert code == 4401


def test_another_users_worker_is_not_found_before_anything_is_opened(
    user: AbstractUser, other_user: AbstractUser
) -> None:
    worker = connected_worker(user)
    said, code = converse(f"/ws/workers/{worker.public_id}/terminal/", bearer(other_user), [])
    assert code == 4404 and "No worker" in said[0]["message"]
    assert not TerminalRecord.objects.exists()


def test_staff_get_no_terminal_on_someone_elses_worker(user: AbstractUser) -> None:
    worker = connected_worker(user)
    staff = type(user).objects.create_user("operator", is_staff=True, is_superuser=True)
    _, code = converse(f"/ws/workers/{worker.public_id}/terminal/", bearer(staff), [START])
    assert code == 4404


def test_a_worker_that_is_not_connected_gets_no_terminal(user: AbstractUser) -> None:
    worker = connected_worker(user)
    Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.QUEUED)
    said, code = converse(f"/ws/workers/{worker.public_id}/terminal/", bearer(user), [START])
    assert code == 4409 and "is queued" in said[0]["message"]
    assert not TerminalRecord.objects.exists()


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ("not json", "must be JSON"),
        (json.dumps({"type": "resize"}), "start"),
        (json.dumps({"type": "start", "command": "ls"}), "list of at most"),
        (json.dumps({"type": "start", "command": ["a\x00b"]}), "without NULs"),
        (json.dumps({"type": "start", "cols": 0}), "cols must be"),
        (json.dumps({"type": "start", "rows": 10_000}), "rows must be"),
        (json.dumps({"type": "start", "pty": "yes"}), "pty must be"),
        (json.dumps({"type": "start", "keep": "a b"}), "keep must be 1-32 letters"),
        (json.dumps({"type": "start", "keep": "x", "command": ["ls"]}), "keep is for"),
        (json.dumps({"type": "start", "keep": "x", "pty": False}), "keep is for"),
    ],
)
def test_a_malformed_start_is_refused_in_words(
    user: AbstractUser, message: str, words: str
) -> None:
    worker = connected_worker(user)
    said, code = converse(f"/ws/workers/{worker.public_id}/terminal/", bearer(user), [message])
    assert code == 4400 and words in said[0]["message"]


def session_cookie(user: AbstractUser) -> bytes:
    store = SessionStore()
    store["_auth_user_id"] = str(user.pk)
    store["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    store["_auth_user_hash"] = user.get_session_auth_hash()
    store.create()
    return f"sessionid={store.session_key}".encode()


def test_a_browser_session_counts_only_from_the_sites_own_origin(user: AbstractUser) -> None:
    worker = connected_worker(user)
    path = f"/ws/workers/{worker.public_id}/terminal/"
    cookie = session_cookie(user)
    for origin in (b"http://evil.example", None):
        headers = [(b"cookie", cookie), (b"host", b"127.0.0.1:8000")]
        headers += [(b"origin", origin)] if origin else []
        said, code = converse(path, headers, [START])
        assert said[0]["code"] == 4403
        assert code == 4403, origin
    # From its own origin the same cookie gets as far as the worker (queued: no terminal).
    Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.QUEUED)
    headers = [(b"cookie", cookie), (b"host", b"127.0.0.1:8000")]
    headers.append((b"origin", b"http://127.0.0.1:8000"))
    _said, code = converse(path, headers, [START])
    assert code == 4409


@override_settings(ACTIVATE_TERMINALS_PER_USER=2, ACTIVATE_TERMINAL_MAX_DURATION=600)
def test_the_cap_counts_open_terminals_and_forgets_records_older_than_any_terminal_lives(
    user: AbstractUser,
) -> None:
    worker = connected_worker(user)
    common = {"worker": worker, "worker_public_id": worker.public_id, "user": user}
    TerminalRecord.objects.create(**common)
    TerminalRecord.objects.create(**common, closed_at=timezone.now())
    # Left open by a server that was killed long ago: not counted.
    TerminalRecord.objects.create(**common, opened_at=timezone.now() - timedelta(hours=1))
    TerminalRecord.objects.create(**common)
    request = StartRequest(argv=[], pty=True, cols=80, rows=24, client="test")
    with pytest.raises(TerminalRefused) as refused:
        open_terminal(user, worker.public_id, request)
    assert refused.value.code == 4429 and "at most 2" in refused.value.message


def test_a_cluster_that_cannot_be_reached_is_a_clear_refusal_and_a_closed_record(
    user: AbstractUser,
) -> None:
    worker = connected_worker(user)
    request = parse_start(START)
    with pytest.raises(TerminalRefused) as refused:
        open_terminal(user, worker.public_id, request)
    assert refused.value.code == 4503 and "Cannot reach worker" in refused.value.message
    record = TerminalRecord.objects.get()
    assert record.closed_at is not None and record.close_reason.startswith("could not start")
