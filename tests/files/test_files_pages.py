"""The Files page rendered by Django's test client, over the test cluster's real SFTP as each
user's own Unix account (the browser's part is in test_files_page.py)."""

from __future__ import annotations

import base64
import os
import re
from html import escape, unescape
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
from django.contrib.auth.models import User
from django.test import Client

from files_app.models import FileRoot
from tests.factories import WorkerFactory
from tests.files import places
from tests.files.places import CLUSTER, owned_by
from workers_app.models import Cluster
from workers_app.statuses import WorkerStatus

pytestmark = [pytest.mark.slurm]
PAGE = f"/clusters/{CLUSTER}/files/"
# Fixtures, found by pytest under these names.
people = places.people
workspace = places.workspace


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_page_opens_on_the_users_home_with_the_operators_places(
    people: dict[str, User],
) -> None:
    FileRoot.objects.create(cluster=Cluster.objects.get(name=CLUSTER), label="Scratch", path="/tmp")

    page = logged_in(people["alice"]).get(PAGE)

    assert page.status_code == 200
    html = page.content.decode()
    assert '<span id="files-here" aria-current="location" tabindex="-1">pwalice</span>' in html
    assert f'data-path-b64="{b64(b"/home/pwalice")}"' in html
    assert 'title="/home/pwalice" aria-current="location">Home</a>' in html
    assert 'title="/tmp">Scratch</a>' in html
    assert 'data-name=".bashrc"' in html and "data-readable" in html


def test_names_are_shown_as_text_and_linked_by_their_bytes(
    people: dict[str, User], workspace: Path
) -> None:
    names = [b"<img src=x onerror=alert(1)>", b"-rf \"x\" 'y'", b"caf\xe9", b"two\nlines"]
    for name in names:
        path = Path(os.fsdecode(os.fsencode(workspace) + b"/" + name))
        path.write_bytes(b"x")
        owned_by(path)
    os.mkdir(workspace / "sub dir")
    owned_by(workspace / "sub dir")

    page = logged_in(people["alice"]).get(PAGE, {"path_b64": b64(os.fsencode(workspace))})

    html = page.content.decode()
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "-rf &quot;x&quot; &#x27;y&#x27;" in html
    assert "caf\ufffd" in html  # what a person reads of a byte that is no UTF-8
    for name in names:
        assert b64(os.fsencode(workspace) + b"/" + name) in html  # downloads by the bytes
    # A folder is entered by the page (htmx swapping the listing), a file downloads.
    sub = b64(os.fsencode(workspace) + b"/sub dir")
    assert f'href="{PAGE}?path_b64={sub.replace("=", "%3D")}"' in html
    assert f"/files/{CLUSTER}/download?path_b64=" in html


def test_htmx_gets_the_listing_alone(people: dict[str, User], workspace: Path) -> None:
    client = logged_in(people["alice"])
    wanted = {"path_b64": b64(os.fsencode(workspace))}

    partial = client.get(PAGE, wanted, headers={"HX-Request": "true"}).content.decode()
    restored = client.get(
        PAGE, wanted, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}
    ).content.decode()

    assert '<div id="files-listing"' in partial and "<html" not in partial
    assert "<html" in restored


def test_the_neighbours_home_is_said_to_be_refused_by_the_cluster(
    people: dict[str, User],
) -> None:
    page = logged_in(people["bob"]).get(PAGE, {"path_b64": b64(b"/home/pwalice")})

    html = page.content.decode()
    assert page.status_code == 200
    assert "Permission denied: the cluster does not let your account read /home/pwalice." in html
    assert ".bashrc" not in html and "data-readable" not in html


def test_a_missing_folder_and_a_broken_address_are_said_in_words(
    people: dict[str, User],
) -> None:
    client = logged_in(people["alice"])

    missing = client.get(PAGE, {"path_b64": b64(b"/home/pwalice/no such folder")})
    broken = client.get(PAGE, {"path_b64": "abcde"})

    assert "Not found: there is no /home/pwalice/no such folder on" in missing.content.decode()
    assert "That address names no path" in broken.content.decode()


def test_someone_without_an_account_there_is_sent_to_connect_one(
    people: dict[str, User],
) -> None:
    page = logged_in(people["dave"]).get(PAGE)

    html = page.content.decode()
    assert page.status_code == 200
    assert "You have no verified account on cluster" in html
    assert f'href="/clusters/{CLUSTER}/account/">Connect your account</a>' in html


def test_a_cluster_outside_the_users_groups_is_a_404_and_anonymous_users_log_in(
    people: dict[str, User],
) -> None:
    assert logged_in(people["carol"]).get(PAGE).status_code == 404
    assert logged_in(people["alice"]).get("/clusters/nowhere/files/").status_code == 404
    anonymous = Client().get(PAGE)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")


def test_the_clusters_page_and_the_nav_lead_to_files(people: dict[str, User]) -> None:
    client = logged_in(people["alice"])

    clusters = client.get("/clusters/").content.decode()
    index = client.get("/files/")

    assert f'href="{PAGE}">Files</a>' in clusters
    assert 'href="/files/"' in clusters  # the nav
    assert index.status_code == 302 and index["Location"] == PAGE


def test_files_in_the_nav_offers_each_cluster_when_there_are_several(
    people: dict[str, User], make_cluster: Any
) -> None:
    make_cluster(name="campus")

    index = logged_in(people["alice"]).get("/files/")

    html = index.content.decode()
    assert index.status_code == 200
    assert 'href="/clusters/campus/files/">campus</a>' in html
    assert f'href="{PAGE}">{CLUSTER}</a>' in html


def test_a_folder_opens_in_a_terminal_on_each_connected_worker_there_or_in_a_session(
    people: dict[str, User], workspace: Path
) -> None:
    cluster = Cluster.objects.get(name=CLUSTER)
    mine = WorkerFactory(owner=people["alice"], cluster=cluster, status=WorkerStatus.CONNECTED)
    WorkerFactory(owner=people["alice"], cluster=cluster, status=WorkerStatus.QUEUED)
    WorkerFactory(owner=people["bob"], cluster=cluster, status=WorkerStatus.CONNECTED)
    odd = workspace / "a b & 'c'"
    odd.mkdir()
    owned_by(odd)

    html = logged_in(people["alice"]).get(PAGE, {"path_b64": b64(os.fsencode(odd))})
    links = re.findall(r'<a class="chip" href="([^"]+)"[^>]*>([^<]+)</a>', html.content.decode())

    openers = [
        (unescape(url), label) for url, label in links if "Terminal" in label or "…" in label
    ]
    folder = quote_plus(str(odd))
    assert openers == [
        (f"/workers/{mine.public_id}/terminal/?cwd={folder}", f"Terminal on {mine.name}"),
        (f"/sessions/?cluster={CLUSTER}&folder={folder}#launch-title", "Session…"),
    ]
    terminal = logged_in(people["alice"]).get(openers[0][0])
    assert f'data-cwd="{escape(str(odd))}"' in terminal.content.decode()
    refused = logged_in(people["alice"]).get(f"/workers/{mine.public_id}/terminal/?cwd=rel")
    assert refused.status_code == 400 and b"must be absolute" in refused.content
    assert logged_in(people["bob"]).get(openers[0][0]).status_code == 404
    # A name that is no UTF-8 cannot be a terminal's or a session's folder: nothing offered.
    raw = os.fsencode(workspace) + b"/caf\xe9"
    os.mkdir(raw)
    owned_by(Path(os.fsdecode(raw)))
    html = logged_in(people["alice"]).get(PAGE, {"path_b64": b64(raw)}).content.decode()
    assert "Open here" not in html and "data-readable" in html
