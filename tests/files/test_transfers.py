"""Downloads and uploads through the live web server (uvicorn on the test settings), streamed
to and from the test cluster's SFTP as the user's own account; and `pw files` against it."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client

from harness.cluster import SshTarget
from harness.platform import Platform
from tests.e2e.conftest import pw_runner
from tests.files import places
from tests.files.places import CLUSTER, people_on
from tests.platforms import module_platform
from workers_app.models import ApiKey, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.live]
LIMIT = 8 * 1024 * 1024
UPLOAD_MARK = ".activate-upload-"
workspace = places.workspace  # a fixture

shared_transfer_platform = module_platform(knobs={"ACTIVATE_FILES_MAX_UPLOAD": str(LIMIT)})


@pytest.fixture
def platform(transactional_db: None, shared_transfer_platform: Platform) -> Platform:
    return shared_transfer_platform


@pytest.fixture
def people(platform: Platform, make_cluster: Any, ssh_target: SshTarget) -> dict[str, User]:
    cluster: Cluster = make_cluster(name=CLUSTER, shared=False)
    return people_on(cluster, ssh_target)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


def api(platform: Platform, user: User) -> httpx.Client:
    _, key = ApiKey.issue(user)
    return platform.api(key, timeout=60)


def test_an_upload_downloads_back_byte_identical_whatever_its_name(
    platform: Platform, people: dict[str, User], workspace: Path
) -> None:
    body = os.urandom(3 * 1024 * 1024 + 123)
    target = os.fsencode(workspace) + b'/caf\xe9 "it\'s" -x\n.bin'
    with api(platform, people["alice"]) as alice:
        put = alice.put(f"/files/{CLUSTER}/upload", params={"path_b64": b64(target)}, content=body)
        again = alice.put(
            f"/files/{CLUSTER}/upload", params={"path_b64": b64(target)}, content=b"x"
        )
        got = alice.get(f"/files/{CLUSTER}/download", params={"path_b64": b64(target)})
        replaced = alice.put(
            f"/files/{CLUSTER}/upload",
            params={"path_b64": b64(target), "overwrite": "1"},
            content=b"short",
        )
        short = alice.get(f"/files/{CLUSTER}/download", params={"path_b64": b64(target)})
        folder = alice.get(f"/files/{CLUSTER}/download", params={"path": str(workspace)})
        nothing = alice.get(f"/files/{CLUSTER}/download", params={"path": f"{workspace}/none"})
        theirs = alice.get(f"/files/{CLUSTER}/download", params={"path": "/home/pwbob/.bashrc"})

    assert put.status_code == 201, put.text
    assert put.json()["name_b64"] == b64(target.rsplit(b"/", 1)[1])
    assert put.json()["size"] == len(body)
    assert Path(os.fsdecode(target)).stat().st_uid == workspace.stat().st_uid  # as pwalice
    assert again.status_code == 409
    assert got.status_code == 200 and got.content == body
    assert got.headers["content-length"] == str(len(body))
    disposition = got.headers["content-disposition"]
    assert disposition.startswith('attachment; filename="caf_ _it\'s_ -x_.bin"')
    assert "filename*=UTF-8''caf%EF%BF%BD%20%22it%27s%22%20-x%0A.bin" in disposition
    assert replaced.status_code == 200 and short.content == b"short"
    assert folder.status_code == 400
    assert nothing.status_code == 404
    assert theirs.status_code == 403 and "permission denied by the cluster" in theirs.text
    assert [n for n in os.listdir(workspace) if UPLOAD_MARK in n] == []


def test_an_interrupted_upload_leaves_no_file_under_its_name_and_no_temporary_one(
    platform: Platform, people: dict[str, User], workspace: Path
) -> None:
    _, key = ApiKey.issue(people["alice"])
    path = f"{workspace}/half.bin"
    query = f"path_b64={b64(path.encode())}"
    with socket.create_connection(("127.0.0.1", platform.port)) as sock:
        sock.sendall(
            (
                f"PUT /files/{CLUSTER}/upload?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {key}\r\nContent-Length: {6 * 1024 * 1024}\r\n\r\n"
            ).encode()
        )
        sock.sendall(os.urandom(2 * 1024 * 1024))
        deadline = time.monotonic() + 10
        while not [n for n in os.listdir(workspace) if UPLOAD_MARK in n]:
            assert time.monotonic() < deadline, "the upload never started writing"
            time.sleep(0.05)
    # The client is gone mid-body: nothing may stay, neither the name nor the hidden file.
    deadline = time.monotonic() + 15
    while os.listdir(workspace):
        assert time.monotonic() < deadline, os.listdir(workspace)
        time.sleep(0.1)
    assert not Path(path).exists()


def test_over_the_limit_is_413_before_or_when_reached_and_leaves_nothing(
    platform: Platform, people: dict[str, User], workspace: Path
) -> None:
    path = b64(f"{workspace}/big.bin".encode())

    def chunks() -> Any:
        for _ in range(LIMIT // 65536 + 8):
            yield b"\0" * 65536

    _, key = ApiKey.issue(people["alice"])
    with socket.create_connection(("127.0.0.1", platform.port)) as sock:
        # Said before a byte of the body is read: the answer comes with none sent.
        sock.sendall(
            (
                f"PUT /files/{CLUSTER}/upload?path_b64={path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {key}\r\nContent-Length: {LIMIT + 1}\r\n\r\n"
            ).encode()
        )
        sock.settimeout(30)
        said = ""
        while "at most" not in said and (piece := sock.recv(65536)):
            said += piece.decode()
    with api(platform, people["alice"]) as alice:
        try:
            reached = alice.put(
                f"/files/{CLUSTER}/upload", params={"path_b64": path}, content=chunks()
            )
            status = reached.status_code
        except httpx.HTTPError:
            status = 413  # answered mid-body: some clients see the closed connection first
        fits = alice.put(
            f"/files/{CLUSTER}/upload", params={"path_b64": path}, content=b"\1" * LIMIT
        )

    assert said.startswith("HTTP/1.1 413") and "at most 8,388,608 bytes" in said
    assert status == 413
    assert fits.status_code == 201, fits.text
    assert os.listdir(workspace) == ["big.bin"]


def test_a_browser_uploads_with_its_login_and_csrf_token_and_others_get_404(
    platform: Platform, people: dict[str, User], workspace: Path
) -> None:
    browser = Client()
    browser.force_login(people["alice"])
    login = browser.cookies["sessionid"].value
    token = "a" * 32
    path = b64(f"{workspace}/from-browser.txt".encode())
    url = f"/files/{CLUSTER}/upload"
    with httpx.Client(base_url=platform.url, timeout=30) as client:
        client.cookies.set("sessionid", login)
        client.cookies.set("csrftoken", token)
        forged = client.put(url, params={"path_b64": path}, content=b"hi")
        foreign = client.put(
            url,
            params={"path_b64": path},
            content=b"hi",
            headers={"X-CSRFToken": token, "Origin": "https://elsewhere.example"},
        )
        done = client.put(
            url, params={"path_b64": path}, content=b"hi", headers={"X-CSRFToken": token}
        )
        read = client.get(f"/files/{CLUSTER}/download", params={"path_b64": path})
    anonymous = httpx.get(f"{platform.url}/files/{CLUSTER}/download", params={"path_b64": path})
    with api(platform, people["carol"]) as carol:
        hidden = carol.get(f"/files/{CLUSTER}/download", params={"path_b64": path})

    assert forged.status_code == 403 and "CSRF" in forged.text
    assert foreign.status_code == 403
    assert done.status_code == 201, done.text
    assert read.content == b"hi"
    assert anonymous.status_code == 401
    assert hidden.status_code == 404


def test_pw_files_lists_copies_both_ways_and_deletes(
    platform: Platform, people: dict[str, User], workspace: Path, tmp_path: Path
) -> None:
    pw = pw_runner(platform, people["alice"], tmp_path)
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(2 * 1024 * 1024 + 5))
    remote = f"{CLUSTER}:{workspace}"

    made = pw("files", "mkdir", f"{remote}/-sub dir")
    up = pw("files", "cp", str(local), f"{remote}/-sub dir")
    listing = pw("files", "ls", f"{remote}/-sub dir")
    down = pw("files", "cp", f"{remote}/-sub dir/data.bin", str(tmp_path / "back.bin"))
    clobber = pw("files", "cp", "-n", str(local), f"{remote}/-sub dir/data.bin")
    refused = pw("files", "rm", f"{remote}/-sub dir")
    removed = pw("files", "rm", "-r", f"{remote}/-sub dir")
    home = pw("files", "ls", CLUSTER, "-o", "json")

    for done in (made, up, listing, down, removed, home):
        assert done.returncode == 0, done.stderr
    assert "data.bin" in listing.stdout and str(2 * 1024 * 1024 + 5) in listing.stdout
    assert (
        hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest()
        == hashlib.sha256(local.read_bytes()).digest()
    )
    assert clobber.returncode == 1 and "taken" in clobber.stderr
    assert refused.returncode == 1 and "not empty" in refused.stderr
    assert os.listdir(workspace) == []
    assert '"path": "/home/pwalice"' in home.stdout
