"""`pw workers again`, `pw saved`, and `pw workers create --from NAME` against the live test server:
each worker they make has the stored job of the first."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import Pw
from tests.workers.api.test_request_again import job_spec
from workers_app.models import Environment, SavedRequest, Worker

pytestmark = pytest.mark.django_db(transaction=True)


def made(result: object) -> Worker:
    stdout = getattr(result, "stdout", "")
    assert getattr(result, "returncode", 1) == 0, getattr(result, "stderr", "")
    return Worker.objects.get(public_id=json.loads(stdout)["id"])


def test_a_saved_request_and_request_again_make_the_first_workers_job(
    pw: Pw, compute_env: Environment
) -> None:
    fields = ["-p", "account=proj1", "-p", "walltime=02:00:00", "-p", "qos=high"]
    first = made(pw("workers", "create", "test-slurm", "-e", "compute", *fields, "-o", "json"))

    saved = pw("saved", "create", "long", "test-slurm", "-e", "compute", *fields)
    assert saved.returncode == 0, saved.stderr
    assert "Params       walltime=02:00:00, account=proj1, qos=high" in saved.stdout
    listed = pw("saved", "ls")
    assert listed.stdout.splitlines()[1].split()[:3] == ["long", "test-slurm", "compute"]

    from_saved = made(pw("workers", "create", "--from", "long", "-o", "json"))
    again = made(pw("workers", "again", first.public_id, "-o", "json"))

    assert job_spec(from_saved) == job_spec(first) == job_spec(again)
    assert len({first.pk, from_saved.pk, again.pk}) == 3
    # --param on top of a saved request wins, the rest is the saved one's.
    shorter = made(
        pw("workers", "create", "--from", "long", "-p", "walltime=00:30:00", "-o", "json")
    )
    assert shorter.params == {**first.params, "walltime": "00:30:00"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["workers", "create", "--from", "nope"], "pw: error: no saved request named 'nope'"),
        (["workers", "create"], "pw: error: give CLUSTER and --environment, or --from NAME"),
        (["workers", "create", "other", "--from", "long"], "is saved for cluster 'test-slurm'"),
        (["workers", "again", "wnope"], "pw: error: worker wnope not found"),
        (["saved", "delete", "nope"], "pw: error: no saved request named 'nope'"),
        (["saved", "create", "a b", "test-slurm", "-e", "compute"], "pw: error: name: must be"),
    ],
)
def test_what_cannot_be_requested_again_is_one_line_and_nothing_is_made(
    pw: Pw, compute_env: Environment, args: list[str], message: str
) -> None:
    saved = pw("saved", "create", "long", "test-slurm", "-e", "compute", "-p", "account=p")
    assert saved.returncode == 0, saved.stderr

    result = pw(*args)

    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not Worker.objects.exists()
    assert list(SavedRequest.objects.values_list("name", flat=True)) == ["long"]
