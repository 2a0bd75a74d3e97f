"""A transfer the client walks away from gives its SFTP session back: the user's connection has
no channel slot held afterwards, and an upload's hidden file is gone. Driven in process through
the ASGI app, on the test cluster's real SFTP."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import connections

from files_app.transfers import FileTransfers
from harness.cluster import SshTarget
from tests.files import places
from tests.files.places import CLUSTER, owned_by, people_on
from workers_app.cluster_access import connection_for
from workers_app.models import ApiKey, Cluster, ClusterAccount

pytestmark = [pytest.mark.slurm]
workspace = places.workspace  # a fixture


@pytest.fixture
def alice(transactional_db: None, make_cluster: Any, ssh_target: SshTarget) -> User:
    cluster: Cluster = make_cluster(name=CLUSTER, shared=False)
    return people_on(cluster, ssh_target)["alice"]


def scope(key: str, method: str, action: str, path: Path, length: int | None = None) -> dict:
    headers = [(b"authorization", f"Bearer {key}".encode()), (b"host", b"testserver")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    query = "path_b64=" + base64.urlsafe_b64encode(os.fsencode(path)).decode()
    return {
        "type": "http",
        "method": method,
        "path": f"/files/{CLUSTER}/{action}",
        "query_string": query.encode(),
        "headers": headers,
    }


def serve(scope: dict, receive: Any, send: Any) -> None:
    async def once() -> None:
        await FileTransfers()(scope, receive, send)
        # The database connection the app's lookups opened on asgiref's thread goes too.
        await database_sync_to_async(connections.close_all)()

    asyncio.run(once())


def slots_held(alice: User) -> tuple[int, int]:
    cluster = Cluster.objects.get(name=CLUSTER)
    connection = connection_for(cluster, ClusterAccount.objects.get(user=alice))
    return connection.commands, connection.in_use


def test_a_download_left_midway_gives_its_session_back(alice: User, workspace: Path) -> None:
    big = owned_by_file(workspace / "big.bin", 64 * 1024 * 1024)
    _, key = ApiKey.issue(alice)
    sent: list[dict[str, Any]] = []
    first_piece = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not sent:
            return {"type": "http.request", "body": b"", "more_body": False}
        await first_piece.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            first_piece.set()
            await asyncio.sleep(0.05)

    serve(scope(key, "GET", "download", big), receive, send)

    assert sent[0]["status"] == 200
    delivered = sum(len(m.get("body", b"")) for m in sent[1:])
    assert 0 < delivered < big.stat().st_size
    assert slots_held(alice) == (0, 0)


def test_an_upload_left_midway_removes_its_file_and_gives_its_session_back(
    alice: User, workspace: Path
) -> None:
    _, key = ApiKey.issue(alice)
    sent: list[dict[str, Any]] = []
    pieces = iter([b"x" * 1024 * 1024] * 3)

    async def receive() -> dict[str, Any]:
        piece = next(pieces, None)
        if piece is None:
            await asyncio.sleep(0.2)  # the client stalls, then its connection drops
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": piece, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    target = workspace / "half.bin"
    length = 16 * 1024 * 1024
    serve(scope(key, "PUT", "upload", target, length), receive, send)

    assert sent == []  # nobody is there to answer
    assert os.listdir(workspace) == []
    assert slots_held(alice) == (0, 0)


def owned_by_file(path: Path, size: int) -> Path:
    with path.open("wb") as out:
        out.truncate(size)
    return owned_by(path)
