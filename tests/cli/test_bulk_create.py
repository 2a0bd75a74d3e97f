"""pw workers create --count N: N workers in one request, listed; --wait waits for them all."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import Pw
from workers_app.actions import lifecycle
from workers_app.models import Environment, Worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_count_makes_n_workers_and_lists_them(pw: Pw, compute_env: Environment) -> None:
    result = pw(
        "workers", "create", "test-slurm", "-e", "compute", "-p", "account=p", "--count", "4",
        "--name", "dask", "-o", "json",
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    workers = Worker.objects.order_by("pk")
    assert [w["id"] for w in body] == [w.public_id for w in workers]
    assert [w.name for w in workers] == ["dask-1", "dask-2", "dask-3", "dask-4"]
    assert len({w.idempotency_key for w in workers}) == 4


@pytest.mark.parametrize("count", ["0", "-2", "lots"])
def test_a_count_that_is_not_a_positive_number_is_refused_before_any_request(
    pw: Pw, compute_env: Environment, count: str
) -> None:
    result = pw("workers", "create", "test-slurm", "-e", "compute", "--count", count)

    assert result.returncode == 2
    assert "--count" in result.stderr
    assert not Worker.objects.exists()


def test_create_count_wait_ends_when_every_worker_is_connected(
    pw: Pw, compute_env: Environment
) -> None:
    running = pw.start(
        "workers", "create", "test-slurm", "-e", "compute", "-p", "account=p", "-n", "3", "--wait"
    )

    running.expect("3 pending")
    workers = list(Worker.objects.order_by("pk"))
    for worker in workers:
        lifecycle.mark_submitted(worker, job_id=str(worker.pk))
    running.expect("3 queued")
    for worker in workers:
        lifecycle.mark_connected(worker, hostname="node01")
    running.expect("3 connected")
    code, stdout, rest = running.finish()

    assert code == 0, rest
    assert stdout.splitlines()[0].split()[:2] == ["ID", "NAME"]
    assert all(w.public_id in stdout for w in workers)


def test_create_count_wait_fails_with_the_first_failure(pw: Pw, compute_env: Environment) -> None:
    running = pw.start(
        "workers", "create", "test-slurm", "-e", "compute", "-p", "account=p", "-n", "2", "--wait"
    )

    running.expect("2 pending")
    worker = Worker.objects.order_by("pk").last()
    assert worker is not None
    lifecycle.fail_worker(worker, reason="The scheduler refused the job: no")
    code, _, rest = running.finish()

    assert code != 0
    assert f"worker {worker.public_id} failed: The scheduler refused the job: no" in "\n".join(rest)
