from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from core import redis_connection, sweep_lag
from tests.factories import ClusterFactory
from workers_app.models import Cluster

PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "c2VjcmV0LWtleS1tYXRlcmlhbA==\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)


@pytest.mark.django_db
def test_health_reports_database_and_redis(client: Client) -> None:
    response = client.get("/health/")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "database": "ok",
        "redis": "ok",
        "ssh_connections": 0,
        "sweep_lag": dict.fromkeys(sweep_lag.KINDS),
    }


def health_with_redis_down(client: Client, settings: object) -> Any:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]
    redis_connection._client.cache_clear()
    try:
        return client.get("/health/")
    finally:
        redis_connection._client.cache_clear()


@pytest.mark.django_db
def test_health_names_what_is_down_without_its_exception_to_anonymous_callers(
    client: Client, settings: object
) -> None:
    response = health_with_redis_down(client, settings)
    assert response.status_code == 503
    assert response.json() == {
        "status": "error",
        "database": "ok",
        "redis": "error",
        "ssh_connections": None,
        "sweep_lag": None,
    }
    assert "127.0.0.1" not in response.content.decode()


@pytest.mark.django_db
def test_health_shows_staff_the_full_error(admin_client: Client, settings: object) -> None:
    response = health_with_redis_down(admin_client, settings)
    assert response.status_code == 503
    redis = response.json()["redis"]
    assert redis.startswith("error: ") and len(redis) > len("error: ")


@pytest.mark.django_db
def test_the_admin_never_displays_a_clusters_private_key(admin_client: Client) -> None:
    cluster = ClusterFactory()
    cluster.set_private_key(PEM)
    cluster.save()
    for url in (
        f"/admin/workers_app/cluster/{cluster.pk}/change/",
        "/admin/workers_app/cluster/",
    ):
        page = admin_client.get(url).content.decode()
        assert "c2VjcmV0LWtleS1tYXRlcmlhbA" not in page
        assert cluster.private_key_encrypted not in page
    listing = admin_client.get("/admin/workers_app/cluster/").content.decode().lower()
    assert "private key set" in listing


@pytest.mark.django_db
def test_the_admin_stores_a_pasted_key_encrypted_and_keeps_it_when_left_empty(
    admin_client: Client,
) -> None:
    form = {
        "name": "hpc",
        "host": "login.example.org",
        "port": "22",
        "username": "svc",
        "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests",
        "scheduler": "slurm",
        "private_key": PEM,
        "environments-TOTAL_FORMS": "0",
        "environments-INITIAL_FORMS": "0",
    }
    response = admin_client.post("/admin/workers_app/cluster/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    cluster = Cluster.objects.get(name="hpc")
    assert "PRIVATE KEY" not in cluster.private_key_encrypted
    assert cluster.private_key() == PEM
    form["private_key"] = ""
    admin_client.post(f"/admin/workers_app/cluster/{cluster.pk}/change/", form)
    cluster.refresh_from_db()
    assert cluster.private_key() == PEM
