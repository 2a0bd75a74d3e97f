"""A new scheduler needs its module and its tests only: the registry finds each module of
``schedulers/``, and an adapter registered from the tests' tree is at once a cluster's
scheduler in the model, the admin, the API and `add_cluster`, with no migration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client

import schedulers
from schedulers.base import SchedulerAdapter
from tests.schedulers.fake_adapter import FakeAdapter
from workers_app.admin import ClusterForm
from workers_app.api.serializers import ClusterSerializer
from workers_app.models import Cluster

REPO = Path(__file__).resolve().parents[2]
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests"
FAKE = (FakeAdapter.name, FakeAdapter.label)


@contextmanager
def registered(adapter: type[SchedulerAdapter]) -> Iterator[type[SchedulerAdapter]]:
    schedulers.register(adapter)
    try:
        yield adapter
    finally:
        schedulers.unregister(adapter.name)


SCHEMA_OF_A_NEW_PROCESS = """
import json, sys
import django
django.setup()
import schedulers
from tests.schedulers.fake_adapter import FakeAdapter
if sys.argv[1] == "register":
    schedulers.register(FakeAdapter)
from drf_spectacular.generators import SchemaGenerator  # what /api/schema/ serves
schema = SchemaGenerator().get_schema(request=None, public=True)
print(json.dumps(schema["components"]["schemas"]["SchedulerEnum"]["enum"]))
"""


def documented_schedulers(*, register: bool) -> list[str]:
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "activate.settings.test"}
    argv = [sys.executable, "-c", SCHEMA_OF_A_NEW_PROCESS, "register" if register else "no"]
    done = subprocess.run(argv, cwd=REPO, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.splitlines()[-1]))


@pytest.fixture
def fake_scheduler() -> Iterator[type[SchedulerAdapter]]:
    before = schedulers.registry()
    with registered(FakeAdapter) as adapter:
        yield adapter
    assert schedulers.registry() == before


def model_choices() -> list[tuple[str, str]]:
    return list(Cluster._meta.get_field("scheduler").choices or [])


def add_cluster(name: str, scheduler: str) -> str:
    out = StringIO()
    call_command(
        "add_cluster", name, "--host", "login.example.org", "--scheduler", scheduler,
        "--host-key", HOST_KEY, stdout=out,
    )  # fmt: skip
    return out.getvalue()


def test_the_registry_finds_each_module_of_the_package_but_base() -> None:
    # Given the package's modules as the disk has them (the registry asks pkgutil)
    package = Path(schedulers.__file__).parent
    on_disk = {path.stem for path in package.glob("*.py")} - {"__init__", "base"}
    assert {"slurm", "pbs", "gridengine", "host"} <= on_disk

    # Then each is a scheduler, named after its module, and a cluster's choice
    assert schedulers.names() == sorted(on_disk)
    for name in on_disk:
        adapter = schedulers.adapter_class(name)
        assert (adapter.name, adapter.__module__) == (name, f"schedulers.{name}")
    assert ("gridengine", "Grid Engine") in schedulers.choices()
    assert model_choices() == schedulers.choices()
    with pytest.raises(ValueError, match="unknown scheduler 'fake'"):
        schedulers.adapter_class("fake")


def test_unregistering_restores_the_registry_and_the_models_choices() -> None:
    # Given the registry and the choices before
    before = (schedulers.registry(), model_choices())

    # When a test's adapter is registered, then unregistered
    with registered(FakeAdapter):
        assert schedulers.adapter_class("fake") is FakeAdapter
        assert FAKE in model_choices()

    # Then nothing of it is left
    assert (schedulers.registry(), model_choices()) == before


@pytest.mark.django_db
def test_a_test_only_scheduler_is_offered_by_the_model_the_admin_and_the_api(
    fake_scheduler: type[SchedulerAdapter], admin_client: Client
) -> None:
    # Given the fake scheduler registered (fixture), then every place that offers a choice has it
    assert FAKE in model_choices()
    assert FAKE in list(ClusterForm().fields["scheduler"].choices)  # type: ignore[attr-defined]
    page = admin_client.get("/admin/workers_app/cluster/add/").content.decode()
    assert f'<option value="{FAKE[0]}">{FAKE[1]}</option>' in page
    assert FAKE[0] in ClusterSerializer().fields["scheduler"].choices  # type: ignore[attr-defined]
    # The API's documents are built once per process (its views hold serializer instances
    # made at import): a process that registers the adapter first documents it.
    assert FAKE[0] in documented_schedulers(register=True)
    assert FAKE[0] not in documented_schedulers(register=False)


@pytest.mark.django_db
def test_a_cluster_on_a_test_only_scheduler_validates_and_is_added(
    fake_scheduler: type[SchedulerAdapter],
) -> None:
    # Given the fake scheduler registered (fixture), a cluster on it is valid
    Cluster(name="on-fake", host="login.example.org", scheduler="fake").full_clean()

    # When an operator adds one
    add_cluster("fake-lab", "fake")

    # Then it is stored on that scheduler, which the platform then speaks to
    cluster = Cluster.objects.get(name="fake-lab")
    assert (cluster.scheduler, cluster.get_scheduler_display()) == FAKE
    assert schedulers.adapter_class(cluster.scheduler) is FakeAdapter


@pytest.mark.django_db
def test_a_scheduler_nobody_registered_is_refused() -> None:
    # Given no fake scheduler: the same cluster is refused, by the model and by add_cluster
    with pytest.raises(ValidationError) as refused:
        Cluster(name="on-fake", host="login.example.org", scheduler="fake").full_clean()
    assert set(refused.value.message_dict) == {"scheduler"}
    with pytest.raises(CommandError, match="invalid choice: 'fake'"):
        add_cluster("fake-lab", "fake")
    assert not Cluster.objects.filter(name="fake-lab").exists()


@pytest.mark.django_db
def test_no_migration_while_a_test_only_scheduler_is_registered(
    fake_scheduler: type[SchedulerAdapter],
) -> None:
    # Given the fake scheduler registered (fixture), then the models match the migrations
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)  # exits 1 on a change
    assert "No changes detected" in out.getvalue()


def test_the_registry_refuses_a_taken_name_and_keeps_its_modules() -> None:
    class AnotherSlurm(FakeAdapter):
        name = "slurm"

    with pytest.raises(ValueError, match="already"):
        schedulers.register(AnotherSlurm)
    with pytest.raises(KeyError):
        schedulers.unregister("slurm")
    assert schedulers.adapter_class("slurm").__name__ == "SlurmAdapter"
