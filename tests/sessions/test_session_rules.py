"""Session rules without a cluster: the status table, the lifecycle following its worker, the
API's refusals, and the proxy refusing another user's session before any tunnel is opened."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth.models import AbstractUser
from django.utils import timezone
from rest_framework.test import APIClient

from activate.asgi import application
from core.transport.errors import SSHError
from sessions_app import launch, lifecycle, services
from sessions_app.models import Session, SessionEvent
from sessions_app.proxy.target import cookie_header
from sessions_app.statuses import FINISHED, TRANSITIONS, SessionStatus, can_transition
from tests.factories import WorkerFactory
from workers_app.actions import lifecycle as worker_lifecycle
from workers_app.actions.deletion import delete_worker
from workers_app.models import ApiKey, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db(transaction=True)
S = SessionStatus


def connected_worker(owner: AbstractUser) -> Worker:
    worker: Worker = WorkerFactory(
        owner=owner, status=WorkerStatus.CONNECTED, scheduler_job_id="41", node_hostname="n1"
    )
    return worker


def session_on(worker: Worker, **fields: Any) -> Session:
    session = Session(
        name="desktop_1", owner=worker.owner, session_type="desktop", worker=worker, **fields
    )
    session.set_secret("s3cret")
    session.save()
    return session


def test_finished_statuses_are_final_and_every_live_one_can_end_or_fail() -> None:
    for status in FINISHED:
        assert TRANSITIONS[status] == frozenset()
    for status in set(S) - FINISHED:
        assert can_transition(status, S.ENDED) and can_transition(status, S.FAILED)
    assert not can_transition(S.RUNNING, S.PENDING)


def test_only_one_caller_claims_a_start_and_each_change_leaves_an_event(user: Any) -> None:
    session = session_on(connected_worker(user))
    twin = Session.objects.get(pk=session.pk)
    assert lifecycle.claim_start(session) is True
    assert lifecycle.claim_start(twin) is False
    assert lifecycle.mark_running(session, node_host="n1", node_port=5901, node_pid=7)
    assert lifecycle.end_session(session, reason="Stopped by user")
    assert not lifecycle.fail_session(twin, reason="late")
    history = list(
        SessionEvent.objects.filter(session=session).values_list("new_status", flat=True)
    )
    assert history == [S.STARTING, S.RUNNING, S.ENDED]


def test_a_disconnected_worker_fails_its_sessions_and_an_ended_job_ends_them(user: Any) -> None:
    lost, ended = connected_worker(user), connected_worker(user)
    on_lost, on_ended = session_on(lost, status=S.RUNNING), session_on(ended, status=S.RUNNING)
    worker_lifecycle.mark_disconnected(lost)
    worker_lifecycle.mark_job_ended(ended, state="TIMEOUT", exit_code="0:0", failed=False)
    on_lost.refresh_from_db()
    on_ended.refresh_from_db()
    assert (on_lost.status, on_lost.status_reason) == (S.FAILED, "Worker disconnected")
    assert (on_ended.status, on_ended.status_reason) == (S.ENDED, "Job TIMEOUT with exit code 0:0")


def test_deleting_a_worker_ends_its_sessions(user: Any) -> None:
    worker = connected_worker(user)
    session = session_on(worker, status=S.RUNNING)
    delete_worker(worker)
    session.refresh_from_db()
    assert (session.status, session.status_reason) == (S.ENDED, "Its worker was deleted")


def test_stopping_a_dedicated_session_deletes_its_worker(user: Any) -> None:
    worker = connected_worker(user)
    session = session_on(worker, status=S.PENDING, dedicated_worker=True)
    services.stop_session(session)
    worker.refresh_from_db()
    assert session.status == S.ENDED
    assert (worker.status, worker.cancel_requested) == (WorkerStatus.STOPPING, True)


def api(user: AbstractUser) -> APIClient:
    client = APIClient()
    _, key = ApiKey.issue(user)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_the_api_refuses_a_worker_that_is_not_connected_or_not_yours(
    user: Any, other_user: Any
) -> None:
    mine = WorkerFactory(owner=user, status=WorkerStatus.QUEUED)
    theirs = connected_worker(other_user)
    for worker, words in ((mine, "not connected"), (theirs, "no worker")):
        answer = api(user).post(
            "/api/sessions/",
            {"type": "desktop", "cluster": worker.cluster.name, "worker": worker.public_id},
            format="json",
        )
        assert answer.status_code == 400, answer.json()
        assert answer.json()["field"] == "worker" and words in answer.json()["detail"]
    both = api(user).post(
        "/api/sessions/",
        {"type": "vscode", "cluster": "c", "worker": "w", "environment": "e"},
        format="json",
    )
    assert both.status_code == 400 and both.json()["field"] == "environment"
    bad_name = api(user).post(
        "/api/sessions/",
        {"type": "vscode", "cluster": mine.cluster.name, "worker": "w", "name": "a b"},
        format="json",
    )
    assert bad_name.json()["field"] == "name"


def test_another_users_session_is_a_404_in_the_api(user: Any, other_user: Any) -> None:
    session = session_on(connected_worker(user), status=S.RUNNING)
    for method in ("get", "delete"):
        answer = getattr(api(other_user), method)(f"/api/sessions/{session.public_id}/")
        assert answer.status_code == 404
    session.refresh_from_db()
    assert session.status == S.RUNNING
    mine = api(user).get(f"/api/sessions/{session.public_id}/").json()
    assert mine["url"].endswith(f"/s/{session.public_id}/") and mine["node"] == "n1"


def proxied(path: str, headers: list[tuple[bytes, bytes]], kind: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        scope: dict[str, Any] = {"type": kind, "path": path, "headers": headers}
        scope.update(query_string=b"", method="GET", http_version="1.1", scheme="http")
        communicator = ApplicationCommunicator(application, scope)
        if kind == "http":
            await communicator.send_input({"type": "http.request", "body": b""})
        else:
            await communicator.send_input({"type": "websocket.connect"})
            accepted = await communicator.receive_output(10)
            assert accepted["type"] == "websocket.accept"
        answer: dict[str, Any] = await communicator.receive_output(10)
        return answer

    return async_to_sync(run)()


def test_the_proxy_answers_404_for_another_users_session_and_opens_no_tunnel(
    user: Any, other_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = session_on(connected_worker(user), status=S.RUNNING, node_host="n1", node_port=5901)

    def no_tunnel(*args: object) -> None:
        raise AssertionError("a tunnel was opened for someone else's session")

    monkeypatch.setattr("sessions_app.proxy.target.open_tunnel", no_tunnel)
    _, key = ApiKey.issue(other_user)
    headers = [(b"authorization", f"Bearer {key}".encode()), (b"host", b"testserver")]
    page = proxied(f"/s/{session.public_id}/vnc.html", headers, "http")
    assert (page["type"], page["status"]) == ("http.response.start", 404)
    socket = proxied(f"/s/{session.public_id}/websockify", headers, "websocket")
    assert (socket["type"], socket["code"]) == ("websocket.close", 4404)
    anonymous = proxied(f"/s/{session.public_id}/vnc.html", [(b"host", b"testserver")], "http")
    assert anonymous["status"] == 302


def test_the_sessions_pages_list_launch_targets_and_hide_other_users_sessions(
    user: Any, other_user: Any, client: Any
) -> None:
    worker = connected_worker(user)
    session = session_on(worker, status=S.RUNNING)
    client.force_login(user)
    listing = client.get("/sessions/").content.decode()
    assert f"{worker.name} (connected)" in listing and "Run on existing worker" in listing
    assert f"env:{worker.cluster.name}/{worker.environment.name}" in listing
    details = client.get(f"/sessions/{session.public_id}/").content.decode()
    for label in ("Environment", "Partition", "Node hostname", "Scheduler job ID", "Worker"):
        assert f"<dt>{label}</dt>" in details
    assert f'href="/s/{session.public_id}/"' in details
    client.force_login(other_user)
    assert client.get(f"/sessions/{session.public_id}/").status_code == 404
    assert client.post(f"/sessions/{session.public_id}/stop/").status_code == 404
    assert session.public_id not in client.get("/sessions/").content.decode()


def test_a_start_that_died_fails_its_session_at_the_next_sweep(user: Any) -> None:
    session = session_on(connected_worker(user), status=S.STARTING)
    later = timezone.now() + services.START_TIMEOUT + timedelta(seconds=1)
    services.sweep_sessions(now=timezone.now())
    session.refresh_from_db()
    assert session.status == S.STARTING
    services.sweep_sessions(now=later)
    session.refresh_from_db()
    assert (session.status, session.status_reason) == (
        S.FAILED,
        "Could not start: the start was interrupted",
    )


def test_the_platforms_cookies_never_reach_the_node_and_the_programs_login_is_added() -> None:
    browser = [b"sessionid=platform-session; csrftoken=platform-csrf; theme=dark"]
    assert cookie_header(browser, {}) == "theme=dark"
    sent = cookie_header([*browser, b"code-server-session=stale"], {"code-server-session": "fresh"})
    assert sent == "theme=dark; code-server-session=fresh"


def test_a_sessions_history_is_in_the_api_oldest_first(user: Any) -> None:
    session = session_on(connected_worker(user))
    lifecycle.record_requested(session)
    lifecycle.claim_start(session)
    lifecycle.fail_session(session, reason="Could not start: no X server")
    events = api(user).get(f"/api/sessions/{session.public_id}/events/").json()["results"]
    assert [(e["new_status"], e["reason"]) for e in events] == [
        ("pending", "Requested"),
        ("starting", ""),
        ("failed", "Could not start: no X server"),
    ]


def test_a_start_that_keeps_breaking_off_is_tried_again_as_often_as_set_then_fails(
    user: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SSH connection itself is proven in tests/sessions/test_session_start_retry.py; here
    # only how often: a start that breaks off every time must not loop for ever.
    settings.ACTIVATE_SESSION_START_RETRIES = 2
    session = session_on(connected_worker(user))
    tries: list[str] = []

    def broken(session: Session) -> None:
        tries.append("launch")
        raise SSHError("connection to n1 broke during a command: EOF")

    monkeypatch.setattr(services.launch, "launch", broken)
    monkeypatch.setattr(services.launch, "end_earlier_launchers", lambda s: tries.append("clean"))

    outcomes = [services.start_session(session.pk) for _ in range(3)]

    assert outcomes == ["retrying", "retrying", "failed"]
    assert tries == ["launch", "clean", "launch", "clean", "launch"]
    session.refresh_from_db()
    assert (session.status, session.status_reason) == (
        S.FAILED,
        "Could not start: connection to n1 broke during a command: EOF",
    )


def test_launch_again_from_an_ended_sessions_page_starts_one_like_it(
    user: Any, client: Any
) -> None:
    worker = connected_worker(user)
    ended = session_on(worker, status=S.ENDED)
    client.force_login(user)
    listing = client.get("/sessions/").content.decode()
    assert f'action="/sessions/{ended.public_id}/again/"' in listing

    response = client.post(f"/sessions/{ended.public_id}/again/")

    again = Session.objects.exclude(pk=ended.pk).get()
    assert response.status_code == 302 and response.url == f"/sessions/{again.public_id}/"
    assert (again.session_type, again.worker_id, again.status) == ("desktop", worker.pk, S.PENDING)
    Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.STOPPED)
    refused = client.post(f"/sessions/{ended.public_id}/again/", follow=True).content.decode()
    assert "cannot be launched again" in refused and "not connected" in refused
    assert Session.objects.count() == 2


def test_a_session_opens_in_the_folder_asked_through_the_api_the_page_and_again(
    user: Any, client: Any
) -> None:
    worker = connected_worker(user)
    where = {"type": "desktop", "cluster": worker.cluster.name, "worker": worker.public_id}
    for folder, said in (("data", "must be absolute"), ("/a\x00b", "Null characters")):
        refused = api(user).post("/api/sessions/", {**where, "folder": folder}, format="json")
        assert refused.status_code == 400, refused.json()
        assert said in str(refused.json())
    assert not Session.objects.exists()
    folder = "~/runs/it's $(here)"
    made = api(user).post("/api/sessions/", {**where, "folder": folder}, format="json").json()
    assert made["folder"] == folder
    session = Session.objects.get(public_id=made["id"])
    argv = launch._launcher_argv(session)
    assert argv[-2:] == ["--folder", folder]  # one argument, read by no shell
    assert "--folder" not in launch._launcher_argv(session_on(worker))
    again = services.create_again(session)
    assert again.folder == folder
    client.force_login(user)
    page = client.get("/sessions/", {"cluster": worker.cluster.name, "folder": "/scratch/x"})
    text = page.content.decode()
    assert 'value="/scratch/x"' in text
    chosen = re.search(r'<option value="([^"]+)" data-kinds="[^"]*" selected>', text)
    assert chosen is not None and chosen[1] == f"worker:{worker.cluster.name}/{worker.public_id}"
    target = f"worker:{worker.cluster.name}/{worker.public_id}"
    posted = client.post(
        "/sessions/new/", {"type": "desktop", "target": target, "folder": "/scratch/x"}
    )
    launched = Session.objects.order_by("-pk").first()
    assert posted.status_code == 302 and launched is not None and launched.folder == "/scratch/x"
    details = client.get(f"/sessions/{launched.public_id}/").content.decode()
    assert "<dt>Folder</dt><dd><code>/scratch/x</code>" in details
