from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import AbstractUser
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from workers_app.api.authentication import LAST_USED_RESOLUTION
from workers_app.models import ApiKey, hash_secret

pytestmark = pytest.mark.django_db


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_request_without_credentials_is_401_with_a_bearer_challenge() -> None:
    response = APIClient().get("/api/workers/")

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json() == {"detail": "Authentication credentials were not provided."}


@pytest.mark.parametrize(
    "header",
    ["Bearer pwk_not-a-real-key", "Bearer", "Bearer two parts", "bearer pwk_x"],
)
def test_a_bad_bearer_header_is_401(header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/me/")

    assert response.status_code == 401
    assert "detail" in response.json()


def test_a_valid_key_authenticates_its_user(user: AbstractUser, api_key: str) -> None:
    response = bearer(api_key).get("/api/me/")

    assert response.status_code == 200
    assert response.json() == {"username": "alice", "is_staff": False}


def test_keys_are_stored_only_as_their_hash(user: AbstractUser, api_key: str) -> None:
    key = ApiKey.objects.get(user=user)

    assert key.key_hash == hash_secret(api_key)
    assert api_key not in {key.key_hash, key.prefix, key.name}


def test_an_inactive_users_key_is_refused(user: AbstractUser, api_key: str) -> None:
    user.is_active = False
    user.save()

    assert bearer(api_key).get("/api/me/").status_code == 401


def test_last_used_is_written_on_first_use_then_only_when_stale(
    user: AbstractUser, api_key: str
) -> None:
    client = bearer(api_key)
    client.get("/api/me/")
    first = ApiKey.objects.get(user=user).last_used_at
    assert first is not None

    with CaptureQueriesContext(connection) as queries:
        client.get("/api/me/")
    assert not any(q["sql"].startswith("UPDATE") for q in queries.captured_queries)
    assert ApiKey.objects.get(user=user).last_used_at == first

    stale = timezone.now() - LAST_USED_RESOLUTION - timedelta(seconds=1)
    ApiKey.objects.filter(user=user).update(last_used_at=stale)
    client.get("/api/me/")
    assert ApiKey.objects.get(user=user).last_used_at > stale  # type: ignore[operator]


def test_browser_session_authenticates_and_is_csrf_protected(
    user: AbstractUser, compute_env: object
) -> None:
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="alice", password="pw-alice-123")

    assert client.get("/api/me/").json()["username"] == "alice"
    response = client.post(
        "/api/workers/", {"cluster": "test-slurm", "environment": "compute"}, format="json"
    )
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]


def test_create_api_key_command_prints_a_working_key_once(user: AbstractUser) -> None:
    out, err = StringIO(), StringIO()

    call_command("create_api_key", "alice", "--name", "laptop", stdout=out, stderr=err)

    secret = out.getvalue().strip()
    assert secret.startswith("pwk_")
    assert ApiKey.objects.get(user=user).name == "laptop"
    assert bearer(secret).get("/api/me/").status_code == 200
    assert "cannot be shown again" in err.getvalue()


def test_create_api_key_command_rejects_an_unknown_user() -> None:
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("create_api_key", "nobody", stdout=StringIO())
    assert not ApiKey.objects.exists()
