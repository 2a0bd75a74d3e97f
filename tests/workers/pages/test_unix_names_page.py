"""The Clusters page tells each person their Unix name on a certificate cluster, or plainly
that they have none there."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import AbstractUser
from django.test import Client

from identity.models import Identity, Source
from workers_app.models import AccountOrigin, Cluster, ClusterAccount

pytestmark = pytest.mark.django_db


@pytest.fixture
def ca_cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    cluster = make_cluster(
        "certs", shared=False, ca_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO test"
    )
    cluster.unix_name_rule, cluster.unix_name_match = "regex", r"^(\w+)@example\.org$"
    cluster.unix_name_replace = r"\1"
    cluster.save()
    return cluster


def test_a_mapped_person_sees_their_unix_name_and_needs_connect_nothing(
    client: Client, user: AbstractUser, ca_cluster: Cluster
) -> None:
    Identity.objects.create(user=user, source=Source.OIDC, subject="1", site_name="pc@example.org")
    client.force_login(user)

    page = client.get("/clusters/").content.decode()

    assert "Your Unix name: <code>pc</code>" in page
    assert "You connect nothing" in page


def test_an_unmapped_person_is_told_plainly_and_an_operator_override_wins(
    client: Client, user: AbstractUser, ca_cluster: Cluster
) -> None:
    Identity.objects.create(user=user, source=Source.OIDC, subject="1", site_name="pc@else.org")
    client.force_login(user)

    page = client.get("/clusters/").content.decode()
    assert "maps to no Unix name on this cluster" in page
    assert "pc@else.org" in page

    ClusterAccount.objects.create(
        user=user, cluster=ca_cluster, remote_username="pcarol", origin=AccountOrigin.OPERATOR
    )
    assert "Your Unix name: <code>pcarol</code>" in client.get("/clusters/").content.decode()


def test_the_request_dialog_offers_a_certificate_cluster_to_a_mapped_person_only(
    client: Client, user: AbstractUser, ca_cluster: Cluster
) -> None:
    env = ca_cluster.environments.create(name="compute", partition="debug")
    identity = Identity.objects.create(
        user=user, source=Source.OIDC, subject="1", site_name="pc@example.org"
    )
    client.force_login(user)

    dialog = client.get("/workers/new/").content.decode()
    assert "connect and verify it" not in dialog
    assert f'value="{env.pk}" checked' in dialog or f'value="{env.pk}"' in dialog
    assert "no Unix name for you here" not in dialog

    identity.site_name = "pc@else.org"
    identity.save()
    dialog = client.get("/workers/new/").content.decode()
    assert "no Unix name for you here" in dialog
    assert "maps to no Unix name on this cluster" in dialog
