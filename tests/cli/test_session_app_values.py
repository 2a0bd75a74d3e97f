"""pw and operators' apps: `pw sessions types` lists them (and their fields), and
`pw sessions create --type NAME --value FIELD=VALUE` launches one with its values."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AbstractUser

from sessions_app.catalog import yaml_files
from sessions_app.models import Session
from tests.cli.conftest import Pw
from tests.factories import WorkerFactory
from tests.sessions.test_operator_apps import TENSORBOARD
from workers_app.statuses import WorkerStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_pw_lists_an_app_and_launches_it_with_its_values(pw: Pw, user: AbstractUser) -> None:
    yaml_files.import_texts([("tensorboard.yaml", TENSORBOARD)])
    worker = WorkerFactory(owner=user, status=WorkerStatus.CONNECTED, scheduler_job_id="7")

    names = pw("sessions", "types", "--names")
    fields = pw("sessions", "types", "--fields")
    made = pw(
        "sessions", "create", worker.cluster.name, "--type", "tensorboard", "-w",
        worker.public_id, "--value", "logdir=~/runs/a b;$(id)", "-o", "json",
    )  # fmt: skip
    wrong = pw(
        "sessions", "create", worker.cluster.name, "-t", "tensorboard", "-w", worker.public_id,
        "--value", "colour=red",
    )  # fmt: skip

    assert names.stdout.split() == ["desktop", "jupyter", "vscode", "tensorboard"]
    assert fields.stdout.splitlines()[1].split()[:4] == ["tensorboard", "logdir", "Logs", "~/runs"]
    assert made.returncode == 0, made.stderr
    assert Session.objects.get().values == {"logdir": "~/runs/a b;$(id)"}
    assert wrong.returncode == 1 and "values.colour" in wrong.stderr
    assert wrong.stderr.count("\n") == 1
