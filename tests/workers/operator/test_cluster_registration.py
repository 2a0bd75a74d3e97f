"""Registering a cluster: the admin and `add_cluster` go through one service, refuse the same
wrong input in the same words, and lose nothing when they refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from tests.broker import queued_messages
from workers_app import effects
from workers_app.actions import clusters
from workers_app.actions.clusters import ClusterRegistration
from workers_app.models import Cluster

pytestmark = pytest.mark.django_db

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests"
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "c2VjcmV0LWtleS1tYXRlcmlhbA==\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
STORED = ClusterRegistration(
    name="lab",
    host="login.example.org",
    scheduler="slurm",
    host_key=HOST_KEY,
    username="svc",
    private_key=PEM,
)

# (add_cluster's arguments, the admin form's fields, the field named, its words)
WRONG = [
    pytest.param(
        ["--host-key", "ssh-ed25519 not-base64!", "--user", "svc", "--key-file", "KEY"],
        {"host_key": "ssh-ed25519 not-base64!"},
        "host_key",
        "Not a usable host key: host key is not valid base64",
        id="host key",
    ),
    pytest.param(
        ["--host-key", HOST_KEY, "--user", "svc", "--key-file", "NOT-A-KEY"],
        {"private_key": "hello"},
        "private_key",
        "This does not look like a private key.",
        id="private key",
    ),
    pytest.param(
        ["--host-key", HOST_KEY, "--key-file", "KEY"],
        {"username": "", "private_key": PEM},
        "username",
        "A private key needs the user it logs in as.",
        id="key without its user",
    ),
    pytest.param(
        ["--host-key", HOST_KEY, "--shared"],
        {"username": "", "shared": "on"},
        "shared",
        "A shared cluster needs its own account",
        id="shared without an account",
    ),
]
OPTION = {"host_key": "--host-key", "private_key": "--key-file", "username": "--user"}


def stored_lab() -> Cluster:
    return clusters.register_cluster(STORED).cluster


def snapshot(cluster: Cluster) -> dict[str, Any]:
    cluster.refresh_from_db()
    return {
        "host_key": cluster.host_key,
        "username": cluster.username,
        "shared": cluster.shared,
        "key": cluster.private_key(),
    }


def admin_form(cluster: Cluster, **fields: str) -> dict[str, str]:
    form = {
        "name": cluster.name,
        "host": cluster.host,
        "port": str(cluster.port),
        "username": cluster.username,
        "host_key": cluster.host_key,
        "scheduler": cluster.scheduler,
        "agent_route": cluster.agent_route,
        "relay_port": "0",
        "environments-TOTAL_FORMS": "0",
        "environments-INITIAL_FORMS": "0",
    }
    form.update(fields)
    return {name: value for name, value in form.items() if name != "shared" or value}


def key_files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "key").write_text(PEM)
    (tmp_path / "not-a-key").write_text("hello\n")
    return {"KEY": str(tmp_path / "key"), "NOT-A-KEY": str(tmp_path / "not-a-key")}


@pytest.mark.parametrize(("arguments", "fields", "field", "words"), WRONG)
def test_add_cluster_refuses_wrong_input_naming_the_option_and_keeps_the_stored_cluster(
    arguments: list[str], fields: dict[str, str], field: str, words: str, tmp_path: Path
) -> None:
    # Given a registered cluster
    before = snapshot(stored_lab())
    files = key_files(tmp_path)
    arguments = [files.get(argument, argument) for argument in arguments]

    # When it is registered again with something wrong
    with pytest.raises(CommandError) as refused:
        call_command("add_cluster", "lab", "--host", "login.example.org", "--scheduler", "slurm",
                     *arguments)  # fmt: skip

    # Then the refusal names the option in the service's words, and nothing changed
    assert f"{OPTION.get(field, '--' + field)}: {words}" in str(refused.value)
    assert snapshot(Cluster.objects.get(name="lab")) == before


@pytest.mark.parametrize(("arguments", "fields", "field", "words"), WRONG)
def test_the_admin_refuses_the_same_input_at_its_field_and_keeps_the_stored_cluster(
    admin_client: Client, arguments: list[str], fields: dict[str, str], field: str,
    words: str,
) -> None:  # fmt: skip
    cluster = stored_lab()
    before = snapshot(cluster)

    answer = admin_client.post(
        f"/admin/workers_app/cluster/{cluster.pk}/change/", admin_form(cluster, **fields)
    )

    assert answer.status_code == 200
    assert words in " ".join(answer.context["adminform"].form.errors[field])
    assert snapshot(cluster) == before


def test_a_cluster_added_in_the_admin_is_stored_encrypted_and_probed(
    admin_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    new = Cluster(name="campus", host="login.example.org", scheduler="slurm", host_key=HOST_KEY)
    with django_capture_on_commit_callbacks(execute=True):
        answer = admin_client.post(
            "/admin/workers_app/cluster/add/",
            admin_form(new, username="svc", private_key=PEM),
        )

    assert answer.status_code == 302
    cluster = Cluster.objects.get(name="campus")
    assert cluster.private_key() == PEM and PEM not in cluster.private_key_encrypted
    assert queued_messages() == [(effects.PROBE, [cluster.pk])]


def test_an_account_given_up_takes_its_stored_key_with_it(admin_client: Client) -> None:
    cluster = stored_lab()

    admin_client.post(
        f"/admin/workers_app/cluster/{cluster.pk}/change/", admin_form(cluster, username="")
    )

    cluster.refresh_from_db()
    assert not cluster.username and not cluster.has_private_key
