"""Bad operator input is refused where it is typed, in words next to the field; oversized
request bodies are refused with a 400, never a server error."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AbstractUser
from django.test import Client

from core.errors import ParameterError
from schedulers import adapter_class
from schedulers.base import JobSpec, SchedulerError
from schedulers.host import MAX_WALLTIME, HostAdapter
from tests.factories import ClusterFactory, EnvironmentFactory
from tests.schedulers.conftest import FakeRunner
from workers_app.models import ApiKey, Environment, EnvironmentField, FieldKind, Worker
from workers_app.params import validate_params


def field_form(environment: Environment, **field: str) -> dict[str, Any]:
    """The admin's environment change form with one new field in its inline."""
    form: dict[str, Any] = {
        "cluster": str(environment.cluster_id),
        "name": environment.name,
        "partition": environment.partition,
        "source": environment.source,
        "is_active": "on",
        "fields-TOTAL_FORMS": "1",
        "fields-INITIAL_FORMS": "0",
        "fields-MIN_NUM_FORMS": "0",
        "fields-MAX_NUM_FORMS": "1000",
        "fields-0-name": "walltime",
        "fields-0-kind": FieldKind.VALUE,
        "fields-0-position": "0",
        "fields-0-choices": "[]",
    }
    form.update({f"fields-0-{key}": value for key, value in field.items()})
    return form


def inline_errors(response: Any) -> dict[str, list[str]]:
    formset = response.context["inline_admin_formsets"][0].formset
    return {name: list(messages) for name, messages in formset.forms[0].errors.items()}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "named", "words"),
    [
        ({"pattern": "[0-9"}, "pattern", "Not a valid regular expression"),
        ({"pattern": "(?P<x"}, "pattern", "Not a valid regular expression"),
        ({"choices": '"normal"'}, "choices", "JSON list of strings"),
        ({"choices": "[1, 2]"}, "choices", "JSON list of strings"),
        ({"choices": '{"a": "b"}'}, "choices", "JSON list of strings"),
    ],
)
def test_the_admin_refuses_an_environment_field_that_could_never_validate_a_value(
    admin_client: Client, field: dict[str, str], named: str, words: str
) -> None:
    environment = EnvironmentFactory()
    url = f"/admin/workers_app/environment/{environment.pk}/change/"

    response = admin_client.post(url, field_form(environment, **field))

    assert response.status_code == 200  # the form again, not a redirect
    errors = inline_errors(response)
    assert list(errors) == [named]
    assert words in errors[named][0]
    assert not EnvironmentField.objects.filter(environment=environment).exists()


@pytest.mark.django_db
def test_the_admin_saves_an_environment_field_with_a_good_pattern_and_choices(
    admin_client: Client,
) -> None:
    environment = EnvironmentFactory()
    url = f"/admin/workers_app/environment/{environment.pk}/change/"
    form = field_form(environment, pattern=r"\d{2}:\d{2}:\d{2}", choices='["01:00:00"]')

    response = admin_client.post(url, form)

    assert response.status_code == 302
    saved = EnvironmentField.objects.get(environment=environment)
    assert (saved.pattern, saved.choices) == (r"\d{2}:\d{2}:\d{2}", ["01:00:00"])


def host_job(walltime: str) -> JobSpec:
    return JobSpec(name="job-1", partition="", directives=[f"--time={walltime}"], command="true")


@pytest.mark.parametrize("walltime", ["00:00:00", "0:00:00", "720:00:01", "9999:59:59"])
def test_the_host_adapter_refuses_a_zero_or_endless_wall_time_before_running_anything(
    walltime: str,
) -> None:
    runner = FakeRunner()
    with pytest.raises(SchedulerError, match="more than zero and at most 720:00:00"):
        HostAdapter(runner).submit(host_job(walltime))
    assert runner.calls == []


def test_the_host_adapter_accepts_wall_times_up_to_its_maximum() -> None:
    for walltime in ("00:00:01", "720:00:00"):
        assert HostAdapter.directive_problem(f"--time={walltime}", set_by_fields={}) is None
    assert MAX_WALLTIME == 720 * 3600


@pytest.mark.django_db
def test_a_users_raw_host_wall_time_of_zero_is_refused_when_the_worker_is_requested() -> None:
    environment = EnvironmentFactory(cluster=ClusterFactory(scheduler="host"))
    EnvironmentField.objects.create(
        environment=environment, name="directives", kind=FieldKind.DIRECTIVES
    )

    with pytest.raises(ParameterError) as refused:
        validate_params(environment, {"directives": "--time=00:00:00"}, scheduler=HostAdapter)

    assert refused.value.field == "directives"
    assert "more than zero" in refused.value.message


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("scheduler", "typed"),
    [("host", "0:00:00"), ("host", "0000:00:00"), ("slurm", "0"), ("slurm", "0-0:00:00")],
)
def test_a_wall_time_of_zero_typed_in_the_field_is_refused_at_request_time(
    client: Client, user: AbstractUser, scheduler: str, typed: str
) -> None:
    # Shared, with a key that is never used: the request is refused before anything connects.
    environment = EnvironmentFactory(
        cluster=ClusterFactory(scheduler=scheduler, shared=True, private_key_encrypted="unused")
    )
    syntax = adapter_class(scheduler).field_syntax["walltime"]
    EnvironmentField.objects.create(
        environment=environment,
        name="walltime",
        label="Wall Time",
        kind=FieldKind.VALUE,
        directive=syntax.directive,
        pattern=syntax.pattern,
        default="01:00:00",
    )
    _, key = ApiKey.issue(user)

    response = client.post(
        "/api/workers/",
        {
            "cluster": environment.cluster.name,
            "environment": environment.name,
            "params": {"walltime": typed},
        },
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )

    assert response.status_code == 400, response.content
    assert response.json()["field"] == "walltime"
    assert response.json()["detail"] == "Wall Time: the wall time must be more than zero"
    assert not Worker.objects.exists()
    accepted = validate_params(
        environment, {"walltime": "00:00:01"}, scheduler=adapter_class(scheduler)
    )
    assert accepted == {"walltime": "00:00:01"}


@pytest.mark.django_db
def test_an_oversized_api_body_answers_400_not_a_server_error(
    client: Client, user: AbstractUser, settings: Any
) -> None:
    _, key = ApiKey.issue(user)
    body = b'{"name": "' + b"x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1) + b'"}'

    response = client.post(
        "/api/workers/",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )

    assert response.status_code in {400, 413}


@pytest.mark.django_db
def test_an_oversized_login_form_answers_400_not_a_server_error(
    client: Client, settings: Any
) -> None:
    padding = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    response = client.post("/login/", {"username": "alice", "password": padding})
    assert response.status_code in {400, 413}


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/agent/v1/heartbeat", "/agent/v1/connect"])
@pytest.mark.parametrize("size", [5000, 2 * 1024 * 1024])
def test_an_oversized_agent_body_answers_400_whatever_its_size(
    client: Client, path: str, size: int
) -> None:
    body = b'{"worker": "' + b"a" * size + b'"}'
    response = client.post(path, body, content_type="application/json")
    assert response.status_code in {400, 413}
