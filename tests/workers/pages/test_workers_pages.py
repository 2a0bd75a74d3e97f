"""The Workers pages through Django's test client: list, live table, request dialog, delete."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import AbstractUser
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.factories import ClusterFactory, EnvironmentFactory, UserFactory, WorkerFactory
from workers_app.models import Cluster, Environment, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db


def text(response) -> str:
    return response.content.decode()


def test_the_root_sends_visitors_to_login_and_users_to_their_workers(
    client: Client, user: AbstractUser
) -> None:
    assert client.get("/").url == "/login/"
    client.force_login(user)
    assert client.get("/").url == "/workers/"


def test_logging_in_lands_on_workers(client: Client, user: AbstractUser) -> None:
    page = client.get("/login/")
    assert page.status_code == 200 and 'name="password"' in text(page)

    response = client.post("/login/", {"username": "alice", "password": "pw-alice-123"})

    assert response.status_code == 302 and response.url == "/workers/"


def test_logging_out_returns_to_the_login_page(alice: Client) -> None:
    response = alice.post("/logout/")

    assert response.status_code == 302 and response.url == "/login/"
    assert alice.get("/workers/").status_code == 302


def test_a_wrong_password_says_so_on_the_login_page(client: Client, user: AbstractUser) -> None:
    response = client.post("/login/", {"username": "alice", "password": "nope"})

    assert response.status_code == 200
    assert "enter a correct username and password" in text(response)


@pytest.mark.parametrize(
    "url", ["/workers/", "/workers/table/", "/workers/new/", "/clusters/", "/api-keys/"]
)
def test_every_page_asks_anonymous_visitors_to_log_in(client: Client, url: str) -> None:
    response = client.get(url)

    assert response.status_code == 302 and response.url.startswith("/login/?next=")


def test_a_poll_from_a_logged_out_browser_reloads_to_the_login_page(client: Client) -> None:
    response = client.get(
        "/workers/table/", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="/workers/?page=2"
    )

    assert response.status_code == 200
    assert response["HX-Redirect"].startswith("/login/?next=")
    assert response.content == b""


def test_without_a_cluster_the_workers_page_says_to_ask_an_operator(alice: Client) -> None:
    page = text(alice.get("/workers/"))

    assert "No cluster yet" in page
    assert "Ask an operator to add one" in page and "make demo" in page
    assert "Create</a>" not in page


def test_without_workers_the_page_invites_to_create_one(
    alice: Client, compute_env: Environment
) -> None:
    page = text(alice.get("/workers/"))

    assert "No workers yet" in page and "Create one" in page
    assert 'href="/workers/new/"' in page


def test_a_row_shows_what_the_worker_is_doing(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    now = timezone.now()
    WorkerFactory(
        owner=user,
        cluster=compute_env.cluster,
        environment=compute_env,
        name="analysis",
        public_id="wabcdefghij",
        status=WorkerStatus.CONNECTED,
        status_reason="Agent connected",
        scheduler_job_id="4242",
        node_hostname="node07",
        params={"walltime": "04:00:00"},
        created_at=now - timedelta(minutes=50),
        started_at=now - timedelta(minutes=47, seconds=30),
        connected_at=now - timedelta(minutes=47),
    )

    page = text(alice.get("/workers/"))

    row = page[page.index('id="worker-wabcdefghij"') :]
    for expected in ("analysis", "hpc", "compute", "4242", "node07", "50m", "3h 12m left"):
        assert expected in row
    assert 'class="badge status-connected">connected<' in row
    assert '<div class="reason">Agent connected</div>' in row
    assert 'data-copy="pw ssh wabcdefghij"' in row
    assert 'href="/workers/wabcdefghij/delete/"' in row
    # The table swaps itself whole (outerHTML); the dialog's content must not inherit that.
    assert 'hx-target="#dialog-body" hx-swap="innerHTML">Delete worker' in row
    # Connected and hers: a terminal, opened in a tab of its own.
    assert 'href="/workers/wabcdefghij/terminal/" target="_blank"' in row


def test_the_table_polls_itself_every_two_seconds(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    WorkerFactory(owner=user, cluster=compute_env.cluster, environment=compute_env, name="w1")

    fragment = text(alice.get("/workers/table/?page=1", HTTP_HX_REQUEST="true"))

    assert 'id="workers-table"' in fragment and "<html" not in fragment
    assert 'hx-get="/workers/table/?page=1"' in fragment
    assert 'hx-trigger="every 2s' in fragment
    assert "w1" in fragment


def test_users_see_only_their_workers_and_staff_see_everyones(
    client: Client, user: AbstractUser, other_user: AbstractUser, compute_env: Environment
) -> None:
    cluster = compute_env.cluster
    WorkerFactory(owner=user, cluster=cluster, environment=compute_env, name="alices-worker")
    WorkerFactory(owner=other_user, cluster=cluster, environment=compute_env, name="bobs-worker")

    client.force_login(user)
    page = text(client.get("/workers/"))
    assert "alices-worker" in page and "bobs-worker" not in page
    assert ">Owner<" not in page

    staff = UserFactory(username="operator", is_staff=True)
    client.force_login(staff)
    page = text(client.get("/workers/"))
    assert "alices-worker" in page and "bobs-worker" in page
    assert ">Owner<" in page


def test_the_list_is_paginated_fifty_to_a_page(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    for n in range(52):
        WorkerFactory(
            owner=user, cluster=compute_env.cluster, environment=compute_env, name=f"n{n}"
        )

    first = text(alice.get("/workers/"))
    second = text(alice.get("/workers/?page=2"))

    assert first.count('<tr id="worker-') == 50
    assert second.count('<tr id="worker-') == 2
    assert "Page 1 of 2 · 52 workers" in first
    assert 'hx-get="/workers/table/?page=2"' in second


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured.captured_queries)


def test_the_list_costs_the_same_queries_for_three_workers_or_fifty(
    alice: Client, user: AbstractUser
) -> None:
    """No query per row: cluster, environment and owner come with the workers."""
    for n in range(3):
        env = EnvironmentFactory(cluster=ClusterFactory())
        WorkerFactory(owner=user, cluster=env.cluster, environment=env, name=f"few-{n}")
    few = _queries(alice, "/workers/")

    for n in range(60):
        env = EnvironmentFactory(cluster=ClusterFactory())
        WorkerFactory(owner=user, cluster=env.cluster, environment=env, name=f"many-{n}")
    many = _queries(alice, "/workers/")
    table = _queries(alice, "/workers/table/")

    # The whole page also reads the id of the user's last notice; the polled table does not.
    assert few == many == table + 1
    # session, user, count, the page of workers with their relations, "any cluster?"
    assert table <= 5


def test_thousands_of_workers_still_make_one_page_of_fifty_in_the_same_queries(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    cluster = compute_env.cluster
    WorkerFactory(owner=user, cluster=cluster, environment=compute_env, name="first")
    before = _queries(alice, "/workers/table/")
    Worker.objects.bulk_create(
        Worker(owner=user, cluster=cluster, environment=compute_env, name=f"bulk-{n}")
        for n in range(3000)
    )

    assert _queries(alice, "/workers/table/?page=60") == before
    page = text(alice.get("/workers/table/?page=60"))
    assert page.count('<tr id="worker-') == 50 and "Page 60 of 61 · 3001 workers" in page


def test_finished_workers_show_no_delete_and_purged_ones_leave(
    alice: Client, user: AbstractUser, compute_env: Environment, settings
) -> None:
    now = timezone.now()
    common = {"owner": user, "cluster": compute_env.cluster, "environment": compute_env}
    WorkerFactory(
        **common,
        name="just-ended",
        public_id="wended23456",
        status=WorkerStatus.ERROR,
        status_reason="Job TIMEOUT with exit code 0:0",
        finished_at=now - timedelta(minutes=5),
    )
    WorkerFactory(
        **common,
        name="long-gone",
        status=WorkerStatus.STOPPED,
        finished_at=now - timedelta(hours=2),
    )

    page = text(alice.get("/workers/"))

    assert "just-ended" in page and "Job TIMEOUT with exit code 0:0" in page
    assert "/workers/wended23456/delete/" not in page
    assert "long-gone" not in page


# The request dialog


def test_the_dialog_groups_environments_by_cluster_with_nodes_available(
    alice: Client, compute_env: Environment
) -> None:
    Environment.objects.create(cluster=compute_env.cluster, name="retired", is_active=False)
    down = ClusterFactory(name="down", reachability="offline")
    Environment.objects.create(cluster=down, name="gpu", nodes_available=2, nodes_total=2)

    page = text(alice.get("/workers/new/", HTTP_HX_REQUEST="true"))

    assert "<html" not in page and 'id="dialog-title">Request worker<' in page
    order = [page.index(s) for s in ("<h3>down", ">gpu<", "<h3>hpc", ">compute<")]
    assert order == sorted(order)
    assert "3 of 4 nodes available" in page
    retired = _option(page, "retired")
    assert "disabled" in retired and "inactive" in retired
    gpu = _option(page, "gpu")
    assert "disabled" in gpu and "cluster offline" in gpu
    assert "checked" in _option(page, "compute")


def _option(page: str, env_name: str) -> str:
    match = re.search(
        rf'<label class="env-option[^"]*">((?:(?!</label>).)*?>{env_name}<.*?)</label>', page, re.S
    )
    assert match, f"no option for {env_name}"
    return match.group(1)


def test_required_fields_without_default_stand_outside_advanced_which_is_collapsed(
    alice: Client, compute_env: Environment
) -> None:
    page = text(alice.get("/workers/new/"))

    advanced = page.index('<details class="advanced">')
    assert page.index('name="param_account"') < advanced
    assert "Account (required)" in page
    assert advanced < page.index('name="param_walltime"')
    assert advanced < page.index('name="param_qos"')
    assert "Example: 04:00:00" in page and "Default: 01:00:00" in page
    assert 'placeholder="proj-42"' in page


def test_choosing_another_environment_loads_its_fields(
    alice: Client, compute_env: Environment
) -> None:
    other = Environment.objects.create(cluster=compute_env.cluster, name="plain")

    fragment = text(alice.get(f"/workers/new/fields/?environment={other.pk}"))
    assert "param_" not in fragment and "<html" not in fragment

    fragment = text(alice.get(f"/workers/new/fields/?environment={compute_env.pk}"))
    assert 'name="param_account"' in fragment and 'name="param_walltime"' in fragment


def test_a_request_creates_a_pending_worker_and_returns_to_the_list(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    response = alice.post(
        "/workers/new/",
        {
            "environment": compute_env.pk,
            "name": "my-node",
            "param_account": "proj-42",
            "param_walltime": "02:00:00",
            "param_qos": "normal",
        },
    )

    assert response.status_code == 302 and response.url == "/workers/"
    worker = Worker.objects.get()
    assert (worker.owner, worker.name, worker.status) == (user, "my-node", WorkerStatus.PENDING)
    assert worker.params == {"walltime": "02:00:00", "account": "proj-42", "qos": "normal"}
    assert "Worker my-node requested." in text(alice.get("/workers/"))


def test_from_the_dialog_a_request_navigates_out_of_it(
    alice: Client, compute_env: Environment
) -> None:
    response = alice.post(
        "/workers/new/",
        {"environment": compute_env.pk, "param_account": "p"},
        HTTP_HX_REQUEST="true",
    )

    assert response.status_code == 200 and response["HX-Redirect"] == "/workers/"


def test_a_required_field_left_empty_is_named_next_to_it(
    alice: Client, compute_env: Environment
) -> None:
    response = alice.post(
        "/workers/new/",
        {"environment": compute_env.pk, "param_account": "", "param_walltime": "01:00:00"},
        HTTP_HX_REQUEST="true",
    )

    page = text(response)
    assert response.status_code == 200 and not Worker.objects.exists()
    field = _field_block(page, "param_account")
    assert "Account is required; example: proj-42" in field
    assert '<details class="advanced">' in page  # nothing wrong in there: stays collapsed


def test_a_malformed_value_says_so_with_an_example_and_opens_advanced(
    alice: Client, compute_env: Environment
) -> None:
    page = text(
        alice.post(
            "/workers/new/",
            {"environment": compute_env.pk, "param_account": "p", "param_walltime": "abc"},
        )
    )

    field = _field_block(page, "param_walltime")
    assert "Wall time: &#x27;abc&#x27; is not a valid value; example: 04:00:00" in field
    assert '<details class="advanced" open>' in page
    assert r"\d" not in page  # never the regular expression
    assert 'value="abc"' in field  # what was typed stays


def test_the_page_and_the_api_say_a_wrong_value_in_the_same_words(
    alice: Client, compute_env: Environment
) -> None:
    body = {"cluster": "hpc", "environment": "compute"}
    api = alice.post(
        "/api/workers/",
        {**body, "params": {"account": "p", "walltime": "abc"}},
        content_type="application/json",
    ).json()
    page = alice.post(
        "/workers/new/",
        {"environment": compute_env.pk, "param_account": "p", "param_walltime": "abc"},
    )

    assert api == {
        "field": "walltime",
        "detail": "Wall time: 'abc' is not a valid value; example: 04:00:00",
    }
    assert api["detail"] in html.unescape(_field_block(text(page), "param_walltime"))


def _field_block(page: str, name: str) -> str:
    start = page.rindex('<div class="field', 0, page.index(f'name="{name}"'))
    return page[start : page.index("</div>", page.index(f'name="{name}"'))]


def test_an_inactive_environment_cannot_be_requested(
    alice: Client, compute_env: Environment
) -> None:
    retired = Environment.objects.create(
        cluster=compute_env.cluster, name="retired", is_active=False
    )

    page = text(alice.post("/workers/new/", {"environment": retired.pk}))

    assert "Choose an active environment on a cluster that is not offline." in page
    assert not Worker.objects.exists()


def test_a_refusal_about_the_cluster_goes_on_top_of_the_form(
    alice: Client, compute_env: Environment
) -> None:
    Cluster.objects.filter(pk=compute_env.cluster_id).update(shared=False)

    page = text(alice.post("/workers/new/", {"environment": compute_env.pk, "param_account": "p"}))

    summary = page[page.index('class="error-summary"') :]
    assert "no verified account on cluster hpc" in summary.split("</div>")[0]
    assert not Worker.objects.exists()


def test_the_dialog_without_clusters_says_what_to_do(alice: Client) -> None:
    page = text(alice.get("/workers/new/", HTTP_HX_REQUEST="true"))

    assert "No cluster is registered yet" in page and "make demo" in page
    assert "Request worker</button>" not in page


# Deleting


def test_delete_asks_first_and_says_sessions_go_with_it(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    worker = WorkerFactory(owner=user, cluster=compute_env.cluster, environment=compute_env)

    page = text(alice.get(f"/workers/{worker.public_id}/delete/", HTTP_HX_REQUEST="true"))

    assert "deletes every session running on it" in page
    assert 'name="csrfmiddlewaretoken"' in page
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING


def test_delete_stops_the_worker_through_the_lifecycle(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    worker = WorkerFactory(owner=user, cluster=compute_env.cluster, environment=compute_env)

    response = alice.post(f"/workers/{worker.public_id}/delete/", HTTP_HX_REQUEST="true")

    assert response["HX-Redirect"] == "/workers/"
    worker.refresh_from_db()
    assert worker.status in {WorkerStatus.STOPPING, WorkerStatus.STOPPED}
    assert worker.events.filter(new_status=worker.status).exists()


def test_delete_needs_a_post_with_csrf(user: AbstractUser, compute_env: Environment) -> None:
    worker = WorkerFactory(owner=user, cluster=compute_env.cluster, environment=compute_env)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    assert client.post(f"/workers/{worker.public_id}/delete/").status_code == 403
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING


@pytest.mark.parametrize(
    ("method", "page"),
    [
        ("get", "delete"),
        ("post", "delete"),
        ("get", "terminal"),
        ("post", "again"),
        ("post", "keep"),
    ],
)
def test_another_users_worker_is_not_found(
    alice: Client, other_user: AbstractUser, compute_env: Environment, method: str, page: str
) -> None:
    theirs = WorkerFactory(
        owner=other_user,
        cluster=compute_env.cluster,
        environment=compute_env,
        status=WorkerStatus.PENDING,
    )

    response = getattr(alice, method)(f"/workers/{theirs.public_id}/{page}/")

    assert response.status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == WorkerStatus.PENDING


def test_every_url_naming_a_worker_is_covered_by_the_404_test() -> None:
    """A new page naming a worker must join test_another_users_worker_is_not_found."""
    from workers_app.pages.urls import urlpatterns

    naming_a_worker = [str(p.pattern) for p in urlpatterns if "public_id" in str(p.pattern)]
    assert naming_a_worker == [
        "workers/<str:public_id>/delete/",
        "workers/<str:public_id>/again/",
        "workers/<str:public_id>/keep/",
        "workers/<str:public_id>/terminal/",
    ]


def test_staff_get_no_terminal_page_for_someone_elses_worker(
    user: AbstractUser, compute_env: Environment
) -> None:
    worker = WorkerFactory(owner=user, cluster=compute_env.cluster, environment=compute_env)
    staff = Client()
    staff.force_login(type(user).objects.create_user("operator", is_staff=True))
    assert staff.get(f"/workers/{worker.public_id}/terminal/").status_code == 404
    mine = Client()
    mine.force_login(user)
    page = text(mine.get(f"/workers/{worker.public_id}/terminal/"))
    assert f'data-socket="/ws/workers/{worker.public_id}/terminal/"' in page


def test_settings_saved_from_the_dialog_come_back_filled_in_and_request_the_same_job(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    # Given: alice requests a worker and saves its settings as "long" from the dialog.
    asked = {
        "environment": compute_env.pk,
        "param_account": "proj-42",
        "param_walltime": "03:00:00",
        "param_qos": "high",
    }
    response = alice.post("/workers/new/", {**asked, "save_as": "long"})
    assert response.status_code == 302, text(response)
    first = Worker.objects.get()

    # When: she opens the dialog again and picks "long" from its saved settings.
    dialog = text(alice.get("/workers/new/", HTTP_HX_REQUEST="true"))
    assert 'href="/workers/new/?saved=long"' in dialog
    filled = text(alice.get("/workers/new/?saved=long", HTTP_HX_REQUEST="true"))

    # Then: its fields hold the saved values, and sending it makes the first worker's job.
    assert 'value="proj-42"' in _field_block(filled, "param_account")
    assert 'value="03:00:00"' in _field_block(filled, "param_walltime")
    assert 'value="high" selected' in _field_block(filled, "param_qos")
    assert alice.post("/workers/new/", asked).status_code == 302
    second = Worker.objects.exclude(pk=first.pk).get()
    assert (second.job_partition, second.job_directives, second.params) == (
        first.job_partition,
        first.job_directives,
        first.params,
    )


def test_a_bad_name_to_save_under_is_said_next_to_it_and_nothing_is_made(
    alice: Client, compute_env: Environment
) -> None:
    page = text(
        alice.post(
            "/workers/new/",
            {"environment": compute_env.pk, "param_account": "p", "save_as": "two words"},
        )
    )
    assert "must be 1-64 letters" in _field_block(page, "save_as")
    assert not Worker.objects.exists()


def test_request_again_from_a_finished_workers_row_makes_the_same_job(
    alice: Client, user: AbstractUser, compute_env: Environment
) -> None:
    alice.post(
        "/workers/new/",
        {"environment": compute_env.pk, "name": "run", "param_account": "p", "param_qos": "high"},
    )
    first = Worker.objects.get()
    Worker.objects.filter(pk=first.pk).update(
        status=WorkerStatus.STOPPED, finished_at=timezone.now()
    )
    row = text(alice.get("/workers/table/"))
    assert f'action="/workers/{first.public_id}/again/"' in row

    response = alice.post(f"/workers/{first.public_id}/again/")

    assert response.status_code == 302 and response.url == "/workers/"
    again = Worker.objects.exclude(pk=first.pk).get()
    assert (again.name, again.job_directives, again.params) == (
        "run",
        first.job_directives,
        first.params,
    )
    assert "Worker run requested again." in text(alice.get("/workers/"))
