"""The relay's row is written only by the holding that took it (workers_app/relays/records.py):
a keeper continued after its successor took the row writes nothing over it, even between its
renewal and its write, which the lease alone cannot stop."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from workers_app.models import AgentRelay, AgentRoute, RelayState
from workers_app.relays.records import Holding, note, note_shedding, note_started

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster_id(make_cluster: Any) -> int:
    return int(make_cluster(name="fenced-row", agent_route=AgentRoute.VIA_LOGIN_HOST).pk)


def test_a_stale_holding_writes_nothing_over_its_successor_s_row(cluster_id: int) -> None:
    # Given a keeper that took the row, wrote it up, and a successor that took it after
    first, second = Holding("host:1", 7), Holding("host:2", 8)
    note_started(cluster_id, first)
    assert note(cluster_id, first, state=RelayState.UP, address="127.0.0.1:1")
    assert note_started(cluster_id, second) == RelayState.UP
    assert note(cluster_id, second, state=RelayState.UP, address="127.0.0.1:2")
    # When the first, continued, writes what it saw
    now = timezone.now()
    wrote = [
        note(cluster_id, first, state=RelayState.DOWN, last_error="mine", checked_at=now),
        note_shedding(cluster_id, first, report="shed=3", now=now),
    ]
    # Then nothing of it is written: the row is the successor's
    assert wrote == [False, False]
    row = AgentRelay.objects.get(cluster_id=cluster_id)
    assert (row.holder, row.fence, row.state, row.address, row.last_error) == (
        "host:2",
        8,
        RelayState.UP,
        "127.0.0.1:2",
        "",
    )


def test_a_lower_number_from_a_counter_redis_lost_still_takes_the_row(cluster_id: int) -> None:
    # The lease, not the row, says who holds it: after a Redis restart without its data the
    # counter starts again, and the new holder's number is lower than the row's.
    note_started(cluster_id, Holding("host:1", 40))
    restarted = Holding("host:2", 1)
    note_started(cluster_id, restarted)
    assert note(cluster_id, restarted, state=RelayState.UP)
    assert not note(cluster_id, Holding("host:1", 40), state=RelayState.DOWN)
    assert AgentRelay.objects.get(cluster_id=cluster_id).state == RelayState.UP


def test_the_same_holder_taking_the_lease_again_moves_the_row_to_its_new_number(
    cluster_id: int,
) -> None:
    # A lease lapsed and taken again with nobody between: the keeper moves the row along.
    old = Holding("host:1", 5)
    note_started(cluster_id, old)
    assert note(cluster_id, old, fence=6)
    assert note(cluster_id, Holding("host:1", 6), state=RelayState.UP)
    assert not note(cluster_id, old, state=RelayState.DOWN)
