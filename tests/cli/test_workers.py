from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from django.contrib.auth.models import AbstractUser

from tests.cli.conftest import Pw
from workers_app.actions import jobs, lifecycle
from workers_app.models import Environment, Worker
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db(transaction=True)

RequestWorker = Callable[..., Worker]


def column_starts(header: str, names: list[str]) -> list[int]:
    return [header.index(name) for name in names]


def test_create_prints_the_new_worker_with_its_id_first(pw: Pw, compute_env: Environment) -> None:
    result = pw(
        "workers",
        "create",
        "test-slurm",
        "--environment",
        "compute",
        "--param",
        "account=proj1",
        "--param",
        "walltime=02:00:00",
        "--name",
        "my-node",
    )

    assert result.returncode == 0, result.stderr
    worker = Worker.objects.get()
    first, *rest = result.stdout.splitlines()
    assert first.split() == ["ID", worker.public_id]
    assert "Status       pending" in rest
    assert "Name         my-node" in rest
    assert "Params       account=proj1, walltime=02:00:00" in rest
    assert worker.params == {"account": "proj1", "walltime": "02:00:00"}


def test_create_json_is_the_api_json(pw: Pw, compute_env: Environment) -> None:
    result = pw("workers", "create", "test-slurm", "-e", "compute", "-p", "account=p", "-o", "json")

    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    worker = Worker.objects.get()
    assert body["id"] == worker.public_id
    assert (body["cluster"], body["environment"], body["status"]) == (
        "test-slurm",
        "compute",
        "pending",
    )
    assert body["params"] == {"walltime": "01:00:00", "account": "p"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["test-slurm", "-e", "compute", "-p", "account=p", "-p", "walltime=1 hour"],
            # The platform words the reason; pw's part is one line that names the field.
            "pw: error: walltime: ",
        ),
        (["nope", "-e", "compute"], "pw: error: cluster: unknown cluster 'nope'"),
        (["test-slurm", "-e", "compute"], "pw: error: account: is required"),
        (
            ["test-slurm", "-e", "retired"],
            "pw: error: environment: environment 'retired' is inactive",
        ),
    ],
)
def test_a_rejected_request_is_one_line_naming_the_field(
    pw: Pw,
    compute_env: Environment,
    retired_env: Environment,
    args: list[str],
    message: str,
) -> None:
    result = pw("workers", "create", *args)

    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(message)
    assert not Worker.objects.exists()


def test_ls_shows_aligned_columns_and_filters(
    pw: Pw, user: AbstractUser, request_worker: RequestWorker
) -> None:
    pending = request_worker(user, name="first")
    queued = request_worker(user, name="a-much-longer-worker-name")
    lifecycle.mark_submitted(queued, job_id="4242")

    result = pw("workers", "ls")

    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    names = ["ID", "NAME", "CLUSTER", "ENVIRONMENT", "STATUS", "NODE", "JOB", "IDLE", "CREATED"]
    starts = column_starts(header, names)
    assert [row[: starts[1]].strip() for row in rows] == [queued.public_id, pending.public_id]
    status_column = [row[starts[4] : starts[5]].strip() for row in rows]
    assert status_column == ["queued", "pending"]
    assert [row[starts[6] : starts[7]].strip() for row in rows] == ["4242", "-"]
    assert [row[starts[7] : starts[8]].strip() for row in rows] == ["-", "-"]

    only_queued = pw("workers", "ls", "--status", "queued", "-o", "json")
    assert [w["id"] for w in json.loads(only_queued.stdout)] == [queued.public_id]
    assert json.loads(pw("workers", "ls", "--cluster", "elsewhere", "-o", "json").stdout) == []


def test_ls_follows_every_page(pw: Pw, user: AbstractUser, compute_env: Environment) -> None:
    Worker.objects.bulk_create(
        Worker(owner=user, cluster=compute_env.cluster, environment=compute_env, name=f"w{i}")
        for i in range(230)
    )

    result = pw("workers", "ls", "-o", "json")

    assert len({w["id"] for w in json.loads(result.stdout)}) == 230


def test_get_shows_one_worker_and_an_unknown_id_is_one_line(
    pw: Pw, user: AbstractUser, other_user: AbstractUser, request_worker: RequestWorker
) -> None:
    mine = request_worker(user)
    theirs = request_worker(other_user)

    assert json.loads(pw("workers", "get", mine.public_id, "-o", "json").stdout)["id"] == (
        mine.public_id
    )
    for unknown in ("wnope", theirs.public_id):
        result = pw("workers", "get", unknown)
        assert result.returncode == 1
        assert result.stderr == f"pw: error: worker {unknown} not found\n"


def test_delete_of_a_never_submitted_worker_shows_it_stopped(
    pw: Pw, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)

    result = pw("workers", "delete", worker.public_id)

    assert result.returncode == 0, result.stderr
    assert "Status       stopped" in result.stdout.splitlines()
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED


def test_delete_wait_returns_once_the_scheduler_confirms_the_job_gone(
    pw: Pw, user: AbstractUser, request_worker: RequestWorker
) -> None:
    worker = request_worker(user)
    lifecycle.mark_submitted(worker, job_id="88")

    running = pw.start("workers", "delete", worker.public_id, "--wait")
    running.expect(f"{worker.public_id}: stopping")
    worker.refresh_from_db()
    assert worker.cancel_requested
    jobs.confirm_job_gone(worker)
    running.expect(f"{worker.public_id}: stopped")
    code, stdout, _ = running.finish()

    assert code == 0
    assert "Status       stopped" in stdout.splitlines()


def test_create_wait_shows_each_status_and_ends_when_connected(
    pw: Pw, compute_env: Environment
) -> None:
    running = pw.start(
        "workers", "create", "test-slurm", "-e", "compute", "-p", "account=p", "--wait"
    )

    running.expect(": pending")
    worker = Worker.objects.get()
    lifecycle.mark_submitted(worker, job_id="77")
    running.expect(f"{worker.public_id}: queued (job 77)")
    lifecycle.mark_started(worker, hostname="node01")
    running.expect(f"{worker.public_id}: starting on node01")
    lifecycle.mark_connected(worker, hostname="node01")
    running.expect(f"{worker.public_id}: connected on node01")
    code, stdout, rest = running.finish()

    assert code == 0, rest
    assert stdout.splitlines()[0].split() == ["ID", worker.public_id]
    assert "Status       connected" in stdout.splitlines()


def test_create_wait_fails_with_the_reason_when_the_worker_errors(
    pw: Pw, compute_env: Environment
) -> None:
    running = pw.start(
        "workers", "create", "test-slurm", "-e", "compute", "-p", "account=p", "--wait"
    )

    running.expect(": pending")
    worker = Worker.objects.get()
    lifecycle.fail_worker(worker, reason=lifecycle.REASON_PENDING_TIMEOUT)
    code, stdout, rest = running.finish()

    assert code == 1
    assert stdout == ""
    assert rest[-1] == (
        f"pw: error: worker {worker.public_id} failed: {lifecycle.REASON_PENDING_TIMEOUT}"
    )
