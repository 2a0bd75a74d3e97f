"""Clusters and the user's accounts on them, API keys, the admin's name, static files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import AbstractUser
from django.test import Client
from django.utils import timezone

from harness.cluster import SshTarget
from tests.factories import ClusterFactory, UserFactory
from workers_app.models import ApiKey, ClusterAccount, Environment

pytestmark = pytest.mark.django_db
APP = Path(__file__).resolve().parents[3] / "workers_app"


def text(response) -> str:
    return response.content.decode()


# Clusters


def test_clusters_list_reachability_environments_and_the_users_account_state(
    alice: Client, user: AbstractUser, other_user: AbstractUser
) -> None:
    shared = ClusterFactory(name="lab", reachability="online", shared=True)
    Environment.objects.create(cluster=shared, name="compute", nodes_available=3, nodes_total=4)
    Environment.objects.create(cluster=shared, name="old", is_active=False)
    ClusterFactory(name="campus", reachability="offline", last_error="connection refused")
    mine = ClusterFactory(name="national", reachability="online")
    ClusterAccount.objects.create(
        user=user,
        cluster=mine,
        remote_username="asmith",
        origin="generated",
        last_error="authentication failed",
    )
    ClusterAccount.objects.create(
        user=other_user,
        cluster=mine,
        remote_username="bobby",
        origin="generated",
        verified_at=timezone.now(),
    )

    page = text(alice.get("/clusters/"))

    lab = _card(page, "lab")
    assert "online" in lab and "shared" in lab and "you need no account of your own" in lab
    assert "3 of 4" in lab and "inactive" in lab
    campus = _card(page, "campus")
    assert "offline" in campus and "connection refused" in campus
    assert "no account" in campus and 'href="/clusters/campus/account/">Connect' in campus
    national = _card(page, "national")
    assert "asmith" in national and "not verified" in national
    assert "authentication failed" in national
    assert "bobby" not in page


def _card(page: str, name: str) -> str:
    start = page.index(f'id="cluster-{name}"')
    return page[start : page.index("</section>", start)]


def test_without_clusters_the_page_says_who_adds_them(alice: Client) -> None:
    page = text(alice.get("/clusters/"))

    assert "No cluster yet" in page and "Ask an operator" in page and "make demo" in page


def test_connecting_with_a_generated_key_shows_the_line_to_install(
    alice: Client, user: AbstractUser
) -> None:
    ClusterFactory(name="national")

    response = alice.post("/clusters/national/account/", {"remote_username": "asmith"})
    assert response.status_code == 302 and response.url == "/clusters/national/account/"
    page = text(alice.get(response.url))

    account = ClusterAccount.objects.get(user=user)
    assert account.remote_username == "asmith" and account.origin == "generated"
    assert account.public_key.startswith("ssh-ed25519 ")
    assert account.public_key in page and "~/.ssh/authorized_keys" in page
    assert f'data-copy="{account.public_key}"' in page
    assert 'action="/clusters/national/account/verify/"' in page
    assert "PRIVATE KEY-----\n" not in page.split("<textarea")[0]


def test_a_bad_user_name_is_named_next_to_its_field(alice: Client) -> None:
    ClusterFactory(name="national")

    page = text(alice.post("/clusters/national/account/", {"remote_username": "no spaces"}))

    assert re.search(r'field has-error">\s*<label for="id_remote_username"', page)
    assert "must be a user name on the cluster" in page
    assert not ClusterAccount.objects.exists()


def test_a_shared_cluster_offers_no_connect_form(alice: Client) -> None:
    ClusterFactory(name="lab", shared=True)

    page = text(alice.get("/clusters/lab/account/"))

    assert "you need no account of your own" in page and "remote_username" not in page


@pytest.mark.slurm
def test_verify_logs_in_to_the_real_cluster_and_says_so(
    alice: Client, user: AbstractUser, make_cluster, ssh_target: SshTarget
) -> None:
    make_cluster("real", shared=False)
    alice.post(
        "/clusters/real/account/",
        {"remote_username": ssh_target.user, "private_key": ssh_target.private_key},
    )

    page = text(alice.post("/clusters/real/account/verify/", follow=True))

    assert "Verified: ACTIVATE logs in to real as you." in page
    assert ClusterAccount.objects.get(user=user).is_verified


def test_verify_against_a_cluster_that_does_not_answer_shows_why(
    alice: Client, user: AbstractUser
) -> None:
    ClusterFactory(
        name="nowhere",
        host="127.0.0.1",
        port=9,
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxT0PnVM7uffJUZ4/vD74Lb0GNvoe52SCCNmnBz/uFQ",
    )
    alice.post("/clusters/nowhere/account/", {"remote_username": "asmith"})

    page = text(alice.post("/clusters/nowhere/account/verify/", follow=True))

    assert "Could not log in to nowhere:" in page
    error = ClusterAccount.objects.get(user=user).last_error
    assert "refused" in error.lower() or "could not connect" in error.lower(), error


def test_disconnect_forgets_the_account(alice: Client, user: AbstractUser) -> None:
    ClusterFactory(name="national")
    alice.post("/clusters/national/account/", {"remote_username": "asmith"})

    response = alice.post("/clusters/national/account/disconnect/")

    assert response.url == "/clusters/"
    assert not ClusterAccount.objects.exists()


def test_account_pages_act_only_on_the_users_own_account(
    alice: Client, other_user: AbstractUser
) -> None:
    cluster = ClusterFactory(name="national")
    ClusterAccount.objects.create(
        user=other_user,
        cluster=cluster,
        remote_username="bobby",
        origin="generated",
        public_key="ssh-ed25519 AAAAbob bob",
    )

    page = text(alice.get("/clusters/national/account/"))
    alice.post("/clusters/national/account/disconnect/")

    assert "bobby" not in page and "AAAAbob" not in page
    assert ClusterAccount.objects.filter(user=other_user).exists()
    assert alice.get("/clusters/nope/account/").status_code == 404


# API keys


def test_a_new_api_key_is_shown_once_then_listed_by_prefix(
    alice: Client, user: AbstractUser
) -> None:
    response = alice.post("/api-keys/", {"name": "laptop"})
    assert response.status_code == 302

    first = text(alice.get("/api-keys/"))
    secret = re.search(r'<code id="new-api-key">(pwk_[^<]+)</code>', first).group(1)
    key = ApiKey.objects.get(user=user)
    assert secret.startswith(key.prefix) and "shown this once" in first

    again = text(alice.get("/api-keys/"))
    assert secret not in again
    assert f"{key.prefix}…" in again and "laptop" in again and "never" in again


def test_a_key_can_be_revoked_by_its_owner_only(
    alice: Client, user: AbstractUser, other_user: AbstractUser
) -> None:
    mine, _ = ApiKey.issue(user, "mine")
    theirs, _ = ApiKey.issue(other_user, "theirs")

    assert alice.post(f"/api-keys/{theirs.pk}/revoke/").status_code == 404
    assert alice.post(f"/api-keys/{mine.pk}/revoke/").status_code == 302

    assert list(ApiKey.objects.values_list("name", flat=True)) == ["theirs"]
    assert "theirs" not in text(alice.get("/api-keys/"))


def test_without_keys_the_page_says_what_they_are_for(alice: Client) -> None:
    assert "No API keys yet" in text(alice.get("/api-keys/"))


# The admin, the static files, nothing from outside


def test_the_admin_carries_the_products_name_and_links_to_the_pages(client: Client) -> None:
    staff = UserFactory(username="op", is_staff=True, is_superuser=True)
    client.force_login(staff)

    page = text(client.get("/admin/"))

    assert "ACTIVATE administration" in page and "Django administration" not in page
    assert 'href="/"' in page


def test_staff_get_an_admin_link_and_users_do_not(alice: Client, client: Client) -> None:
    assert 'href="/admin/"' not in text(alice.get("/workers/"))
    client.force_login(UserFactory(username="op", is_staff=True))
    assert 'href="/admin/"' in text(client.get("/workers/"))


def test_htmx_is_vendored_and_pages_load_nothing_from_outside() -> None:
    htmx = APP / "static" / "workers_app" / "htmx.min.js"
    assert htmx.read_text().startswith("var htmx=function()")
    for template in (APP / "templates").rglob("*.html"):
        assert not re.search(r"(src|href)=\"(https?:)?//", template.read_text()), template
    for asset in (APP / "static" / "workers_app").glob("app.*"):
        assert "http" not in asset.read_text(), asset


def test_every_page_links_its_stylesheet_and_scripts(alice: Client) -> None:
    page = text(alice.get("/workers/"))

    for asset in ("app.css", "htmx.min.js", "app.js"):
        assert f"/static/workers_app/{asset}" in page
    assert 'name="viewport"' in page
