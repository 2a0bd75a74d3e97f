"""The request dialog offers a count: that many workers alike, in one request."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from workers_app.models import Environment, Worker

pytestmark = pytest.mark.django_db


def form(env: Environment, **fields: str) -> dict[str, str]:
    return {"environment": str(env.pk), "param_account": "proj-1", **fields}


def test_the_dialog_offers_a_count_of_one_by_default(
    alice: Client, compute_env: Environment
) -> None:
    page = alice.get("/workers/new/").content.decode()

    [count] = re.findall(r'<input[^>]*name="count"[^>]*>', page)
    assert 'value="1"' in count


def test_a_count_requests_that_many_workers_named_in_turn(
    alice: Client, compute_env: Environment
) -> None:
    response = alice.post("/workers/new/", form(compute_env, name="class", count="3"), follow=True)

    assert response.status_code == 200
    assert sorted(Worker.objects.values_list("name", flat=True)) == [
        "class-1",
        "class-2",
        "class-3",
    ]
    assert "3 workers requested." in response.content.decode()


def test_without_a_count_one_worker_is_requested(alice: Client, compute_env: Environment) -> None:
    alice.post("/workers/new/", form(compute_env, name="solo"))

    assert list(Worker.objects.values_list("name", flat=True)) == ["solo"]


@pytest.mark.parametrize("count", ["0", "501", "many"])
def test_a_bad_count_is_shown_on_the_form_and_nothing_is_requested(
    alice: Client, compute_env: Environment, count: str
) -> None:
    response = alice.post("/workers/new/", form(compute_env, count=count))

    assert response.status_code == 200
    # The error stands next to the count field itself, in words.
    page = response.content.decode()
    assert re.search(r'<p class="field-error" id="id_count_error">[^<]+</p>', page), page
    assert not Worker.objects.exists()
