"""A user has at most ACTIVATE_FILES_TRANSFERS_PER_USER transfers under way at once, counted in
Redis (so over every web process): the next is answered 429 in words, another user is not
held back, and a slot comes back however its transfer ended. Driven in process through the ASGI
app, on the test cluster's real SFTP and the test Redis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import connections

from files_app import services
from files_app.transfers import FileTransfers
from harness.cluster import SshTarget
from tests.files import places
from tests.files.places import CLUSTER, people_on
from tests.files.test_transfer_release import owned_by_file, scope, serve
from workers_app.models import ApiKey, Cluster

pytestmark = [pytest.mark.slurm]
workspace = places.workspace  # a fixture


@pytest.fixture
def people(transactional_db: None, make_cluster: Any, ssh_target: SshTarget) -> dict[str, User]:
    cluster: Cluster = make_cluster(name=CLUSTER, shared=False)
    return people_on(cluster, ssh_target)


class Download:
    """A download whose client takes its head and then waits until told to go away."""

    def __init__(self, key: str, path: Path) -> None:
        self.scope = scope(key, "GET", "download", path)
        self.messages: list[dict[str, Any]] = []
        self.started = asyncio.Event()
        self.leave = asyncio.Event()
        self.asked = False

    async def receive(self) -> dict[str, Any]:
        if not self.asked:
            self.asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.started.set()
        if message["type"] == "http.response.body":
            await self.leave.wait()

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])


def answered(key: str, method: str, action: str, path: Path, body: bytes = b"") -> dict:
    sent: list[dict[str, Any]] = []
    asked: list[bool] = []

    async def receive() -> dict[str, Any]:
        if asked:
            await asyncio.Event().wait()  # the client stays until it has its answer
        asked.append(True)
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    serve(scope(key, method, action, path, len(body) if method == "PUT" else None), receive, send)
    return {"status": sent[0]["status"], "body": b"".join(m.get("body", b"") for m in sent[1:])}


def test_a_user_past_the_cap_is_answered_429_until_one_of_their_transfers_ends(
    people: dict[str, User], workspace: Path, settings: Any
) -> None:
    settings.ACTIVATE_FILES_TRANSFERS_PER_USER = 2
    alice, bob = people["alice"], people["bob"]
    big = owned_by_file(workspace / "big.bin", 64 * 1024 * 1024)
    _, alice_key = ApiKey.issue(alice)
    _, bob_key = ApiKey.issue(bob)
    bobs = Path("/home/pwbob/.bashrc")
    outcomes: dict[str, Any] = {}

    async def scenario() -> None:
        # Given: two downloads of hers under way, their clients taking their time.
        first, second = Download(alice_key, big), Download(alice_key, big)
        running = [asyncio.ensure_future(serve_async(d)) for d in (first, second)]
        await asyncio.wait_for(asyncio.gather(first.started.wait(), second.started.wait()), 30)
        outcomes["statuses"] = (first.status, second.status)
        outcomes["held"] = await asyncio.to_thread(services.transfers_under_way, alice)
        # When: she asks for a third and an upload, and bob for his own file.
        outcomes["third"] = await asyncio.to_thread(answered, alice_key, "GET", "download", big)
        outcomes["upload"] = await asyncio.to_thread(
            answered, alice_key, "PUT", "upload", workspace / "new.bin", b"data"
        )
        outcomes["bob"] = await asyncio.to_thread(answered, bob_key, "GET", "download", bobs)
        # Then one of hers ends midway (its client goes away): its slot comes back.
        first.leave.set()
        await asyncio.wait_for(running[0], 30)
        outcomes["after"] = await asyncio.to_thread(answered, alice_key, "GET", "download", big)
        second.leave.set()
        await asyncio.wait_for(running[1], 30)

    asyncio.run(scenario())

    assert outcomes["statuses"] == (200, 200)
    assert outcomes["held"] == 2
    assert outcomes["third"]["status"] == 429
    assert b"You have 2 file transfers under way" in outcomes["third"]["body"]
    assert outcomes["upload"]["status"] == 429
    assert not (workspace / "new.bin").exists()
    assert outcomes["bob"]["status"] == 200
    assert outcomes["after"]["status"] == 200
    assert services.transfers_under_way(alice) == 0


def test_slots_come_back_from_refusals_and_are_counted_with_other_processes(
    people: dict[str, User], workspace: Path, settings: Any
) -> None:
    settings.ACTIVATE_FILES_TRANSFERS_PER_USER = 2
    alice = people["alice"]
    _, key = ApiKey.issue(alice)
    taken = workspace / "taken.txt"
    owned_by_file(taken, 10)

    # Refused transfers (the name is taken, the file is not there) give their slots back.
    refused = [answered(key, "PUT", "upload", taken, b"x")["status"] for _ in range(3)]
    missing = [answered(key, "GET", "download", workspace / "none")["status"] for _ in range(3)]
    assert refused == [409, 409, 409]
    assert missing == [404, 404, 404]
    assert services.transfers_under_way(alice) == 0

    # Given: two slots held by another web process (the same Redis).
    elsewhere = [services.take_transfer_slot(alice, limit=2) for _ in range(2)]
    assert answered(key, "GET", "download", taken)["status"] == 429
    # When that process gives one back, or dies and its slot lapses, hers goes through.
    assert elsewhere[0] is not None and elsewhere[1] is not None
    services.release_transfer_slot(elsewhere[0])
    assert answered(key, "GET", "download", taken)["status"] == 200


def test_a_slot_whose_holder_stopped_renewing_it_lapses(
    people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = people["alice"]
    monkeypatch.setattr(services, "SLOT_LEASE", 0.5)
    slot = services.take_transfer_slot(alice, limit=1)
    assert slot is not None
    with pytest.raises(services.TooManyTransfers):
        services.take_transfer_slot(alice, limit=1)
    assert services.renew_transfer_slot(slot)

    time.sleep(0.7)

    assert services.transfers_under_way(alice) == 0
    assert not services.renew_transfer_slot(slot)
    again = services.take_transfer_slot(alice, limit=1)
    assert again is not None
    services.release_transfer_slot(again)


async def serve_async(download: Download) -> None:
    await FileTransfers()(download.scope, download.receive, download.send)
    await database_sync_to_async(connections.close_all)()
