"""The password form against the real directory (scripts/directory.sh's slapd): a person of the
directory logs in and is recorded with their uid and groups; a wrong password is refused; a
local operator still logs in with their own password."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from core.env import EnvReader
from harness.identity import DAVE, DirectorySettings, directory_settings
from identity.ldap import ldap_settings
from identity.models import Identity, Source

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def directory() -> DirectorySettings:
    return directory_settings()


@pytest.fixture
def with_directory(directory: DirectorySettings) -> Iterator[dict[str, Any]]:
    found = ldap_settings(
        EnvReader(
            {
                "ACTIVATE_LDAP_URL": directory.url,
                "ACTIVATE_LDAP_BIND_DN": directory.bind_dn,
                "ACTIVATE_LDAP_BIND_PASSWORD": directory.bind_password,
                "ACTIVATE_LDAP_USER_BASE": directory.people_dn,
                "ACTIVATE_LDAP_GROUP_BASE": directory.groups_dn,
                "ACTIVATE_LDAP_GROUP_TYPE": "groupOfNames",
            }
        )
    )
    backends = [*settings.AUTHENTICATION_BACKENDS, "django_auth_ldap.backend.LDAPBackend"]
    with override_settings(AUTHENTICATION_BACKENDS=backends, **found):
        yield found


def log_in(username: str, password: str) -> tuple[Client, Any]:
    client = Client()
    return client, client.post("/login/", {"username": username, "password": password})


def test_a_person_of_the_directory_logs_in_with_the_password_form(
    with_directory: dict[str, Any], directory: DirectorySettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # When dave logs in with his directory password
    client, response = log_in(DAVE.uid, DAVE.password)
    # Then he lands on Workers, recorded with his DN, his uid and his directory groups
    assert response.status_code == 302 and response.headers["Location"] == "/workers/"
    assert client.get("/workers/").status_code == 200
    user = User.objects.get(username="pwdave")
    assert user.email == "dave@activate.test" and not user.has_usable_password()
    identity = Identity.objects.get(user=user)
    assert identity.source == Source.LDAP
    assert identity.subject == directory.person_dn("pwdave")
    assert identity.site_name == "pwdave" and identity.groups == ["hpc-users"]
    assert list(user.groups.values_list("name", flat=True)) == ["hpc-users"]
    # And the bind password is in no log line
    assert directory.bind_password not in caplog.text


def test_a_second_login_keeps_groups_an_operator_gave(with_directory: dict[str, Any]) -> None:
    log_in(DAVE.uid, DAVE.password)
    user = User.objects.get(username="pwdave")
    user.groups.add(Group.objects.create(name="operators-choice"))
    _, response = log_in(DAVE.uid, DAVE.password)
    assert response.status_code == 302
    assert set(user.groups.values_list("name", flat=True)) == {"hpc-users", "operators-choice"}


def test_a_wrong_directory_password_is_refused(with_directory: dict[str, Any]) -> None:
    client, response = log_in(DAVE.uid, "not-daves")
    assert response.status_code == 200 and "error-summary" in response.content.decode()
    assert not User.objects.filter(username="pwdave").exists()
    assert client.get("/workers/").status_code == 302


def test_a_local_operator_still_logs_in_with_their_own_password(
    with_directory: dict[str, Any],
) -> None:
    User.objects.create_user("operator", password="local-pass-1", is_staff=True)
    client, response = log_in("operator", "local-pass-1")
    assert response.status_code == 302 and response.headers["Location"] == "/workers/"
    assert client.get("/workers/").status_code == 200
    assert not Identity.objects.filter(user__username="operator", source=Source.LDAP).exists()
    _, wrong = log_in("operator", "not-the-password")
    assert wrong.status_code == 200
