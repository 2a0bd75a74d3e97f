"""The files API on the test cluster's real SFTP, as each user's own Unix account: what the OS
lets pwalice read and change, she may through the platform, and nothing more."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from files_app.models import FileRoot
from tests.files import places
from tests.files.places import CLUSTER, owned_by
from workers_app.models import Cluster

pytestmark = [pytest.mark.slurm]
API = f"/api/clusters/{CLUSTER}/files"
# Fixtures, found by pytest under these names.
people = places.people
workspace = places.workspace
# Names a shell or a codec would trip over: spaces, both quotes, a newline, a leading dash, and
# bytes that are no UTF-8 (Latin-1 é and a stray 0xff).
ODD_NAMES = [b"with space", b'it\'s "quoted"', b"new\nline", b"-rf", b"caf\xe9-\xff.txt"]


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


def as_user(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def listed(client: APIClient, folder: Path | bytes) -> dict[str, Any]:
    raw = folder if isinstance(folder, bytes) else os.fsencode(folder)
    answer = client.get(f"{API}/", {"path_b64": b64(raw)})
    assert answer.status_code == 200, answer.content
    body: dict[str, Any] = answer.json()
    return body


def test_a_user_starts_in_their_own_home_then_the_operators_roots(
    people: dict[str, User],
) -> None:
    cluster = Cluster.objects.get(name=CLUSTER)
    FileRoot.objects.create(cluster=cluster, label="Scratch", path="/tmp")

    alice = as_user(people["alice"]).get(f"{API}/roots/")
    bob = as_user(people["bob"]).get(f"{API}/roots/")

    assert alice.status_code == 200, alice.content
    assert alice.json() == [
        {"label": "~", "path": "/home/pwalice", "path_b64": b64(b"/home/pwalice")},
        {"label": "Scratch", "path": "/tmp", "path_b64": b64(b"/tmp")},
    ]
    assert bob.json()[0]["path"] == "/home/pwbob"
    home = as_user(people["alice"]).get(f"{API}/")
    assert home.status_code == 200 and home.json()["path"] == "/home/pwalice"
    assert home.json()["parent_b64"] == b64(b"/home")


def test_folders_are_made_listed_renamed_and_deleted_as_the_users_account(
    people: dict[str, User], workspace: Path
) -> None:
    client = as_user(people["alice"])
    folder = os.fsencode(workspace)
    (workspace / "b.txt").write_bytes(b"hello")
    owned_by(workspace / "b.txt")

    made = client.post(f"{API}/mkdir/", {"path_b64": b64(folder + b"/a dir")}, format="json")
    again = client.post(f"{API}/mkdir/", {"path": f"{workspace}/a dir"}, format="json")
    listing = listed(client, workspace)

    assert made.status_code == 201, made.content
    assert made.json()["type"] == "dir" and made.json()["name"] == "a dir"
    assert (workspace / "a dir").stat().st_uid == (workspace).stat().st_uid  # made as pwalice
    assert again.status_code == 409
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [
        ("a dir", "dir"),
        ("b.txt", "file"),
    ]
    [text] = [e for e in listing["entries"] if e["type"] == "file"]
    assert text["size"] == 5 and text["mode"] == "0644" and text["mtime"].endswith("Z")
    assert listing["parent_b64"] == b64(b"/home/pwalice")

    taken = client.post(
        f"{API}/rename/", {"from": f"{workspace}/b.txt", "to": f"{workspace}/a dir"}, format="json"
    )
    moved = client.post(
        f"{API}/rename/",
        {"from_b64": b64(folder + b"/b.txt"), "to_b64": b64(folder + b"/a dir/c.txt")},
        format="json",
    )
    missing = client.post(
        f"{API}/rename/", {"from": f"{workspace}/nope", "to": f"{workspace}/x"}, format="json"
    )
    assert taken.status_code == 409, taken.content
    assert moved.status_code == 200 and moved.json()["name"] == "c.txt"
    assert (workspace / "a dir" / "c.txt").read_bytes() == b"hello"
    assert missing.status_code == 404
    a_file = client.get(f"{API}/", {"path": f"{workspace}/a dir/c.txt"})
    assert a_file.status_code == 400 and "not a folder" in a_file.json()["detail"]

    not_empty = client.post(f"{API}/delete/", {"path": f"{workspace}/a dir"}, format="json")
    gone = client.post(
        f"{API}/delete/", {"path": f"{workspace}/a dir", "recursive": True}, format="json"
    )
    assert not_empty.status_code == 409 and "not empty" in not_empty.json()["detail"]
    assert gone.status_code == 204 and not (workspace / "a dir").exists()
    bad = client.post(f"{API}/delete/", {"path_b64": "%%%"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "path_b64"


def test_odd_names_list_and_delete_by_their_bytes(people: dict[str, User], workspace: Path) -> None:
    client = as_user(people["alice"])
    folder = os.fsencode(workspace)
    for name in ODD_NAMES:
        path = folder + b"/" + name
        with open(path, "wb") as handle:
            handle.write(name)
        owned_by(Path(os.fsdecode(path)))

    entries = listed(client, workspace)["entries"]

    by_bytes = {base64.urlsafe_b64decode(e["name_b64"]): e for e in entries}
    assert set(by_bytes) == set(ODD_NAMES)
    assert by_bytes[b"caf\xe9-\xff.txt"]["name"] == "caf\ufffd-\ufffd.txt"
    assert by_bytes[b"new\nline"]["name"] == "new\nline"
    for name, entry in by_bytes.items():
        assert base64.urlsafe_b64decode(entry["path_b64"]) == folder + b"/" + name
        assert entry["size"] == len(name)
    for entry in entries:
        deleted = client.post(f"{API}/delete/", {"path_b64": entry["path_b64"]}, format="json")
        assert deleted.status_code == 204, deleted.content
    assert os.listdir(folder) == []


def test_the_os_decides_dotdot_and_links_go_only_where_the_account_may(
    people: dict[str, User], workspace: Path
) -> None:
    alice = as_user(people["alice"])
    link = workspace / "to-bob"
    link.symlink_to("/home/pwbob")
    owned_by(link)

    up = listed(alice, b"/home/pwalice/..")
    through_link = alice.get(f"{API}/", {"path": str(link)})
    straight = alice.get(f"{API}/", {"path": "/home/pwbob"})
    dotted = alice.get(f"{API}/", {"path": f"{workspace}/../../pwbob"})
    download_link = listed(alice, workspace)["entries"]

    assert up["path"] == "/home" and "pwbob" in {e["name"] for e in up["entries"]}
    for refused in (through_link, straight, dotted):
        assert refused.status_code == 403, refused.content
        assert "permission denied by the cluster" in refused.json()["detail"]
    assert [(e["name"], e["type"]) for e in download_link] == [("to-bob", "link")]
    # Deleting the link removes the link, never what it points to.
    deleted = alice.post(f"{API}/delete/", {"path": str(link), "recursive": True}, format="json")
    assert deleted.status_code == 204 and Path("/home/pwbob").is_dir()
    # bob, as pwbob, reads his own home through the same cluster.
    assert listed(as_user(people["bob"]), b"/home/pwbob")["path"] == "/home/pwbob"


def test_someone_who_cannot_see_the_cluster_gets_404_and_one_without_an_account_is_told(
    people: dict[str, User],
) -> None:
    carol = as_user(people["carol"])
    dave = as_user(people["dave"])

    for answer in (
        carol.get(f"{API}/roots/"),
        carol.get(f"{API}/", {"path": "/home/pwalice"}),
        carol.post(f"{API}/mkdir/", {"path": "/tmp/x"}, format="json"),
        as_user(people["alice"]).get("/api/clusters/no-such-cluster/files/"),
    ):
        assert answer.status_code == 404, answer.content
    told = dave.get(f"{API}/")
    assert told.status_code == 400
    assert told.json()["field"] == "cluster"
    assert "no verified account on cluster" in told.json()["detail"]
    assert APIClient().get(f"{API}/").status_code in (401, 403)
