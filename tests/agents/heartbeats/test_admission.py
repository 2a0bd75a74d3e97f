"""The agents' server's admission of beats, in one process (agents/admission.py): beats are
shed while the event loop runs later than the budget or too many are in flight, told to retry
after a delay that grows with the share shed, and the shed ones noted once a second."""

from __future__ import annotations

import asyncio
import time

import pytest

from agents.admission import ROLL, AdmissionGate
from agents.errors import OVERLOADED, Overloaded

BUDGET = 0.2  # wide: a busy test machine must not look like an overloaded server


def gate(
    *, in_flight: int = 100, most: float = 30.0, notes: list[int] | None = None
) -> AdmissionGate:
    async def note_shed(count: int) -> None:
        if notes is not None:
            notes.append(count)

    return AdmissionGate(
        budget=BUDGET, in_flight_limit=in_flight, retry_after_max=most, note_shed=note_shed
    )


def test_beats_are_admitted_up_to_the_bound_in_flight_then_shed_until_one_is_answered() -> None:
    async def scenario() -> None:
        admission = gate(in_flight=2)
        admission.start()
        admission.admit()
        admission.admit()
        with pytest.raises(Overloaded) as shed:
            admission.admit()
        assert shed.value.status == OVERLOADED
        assert 1.0 <= shed.value.retry_after <= 30.0
        assert set(shed.value.answer()) == {"error", "retry_after"}
        admission.done()
        admission.admit()
        admission.stop()

    asyncio.run(scenario())


def test_a_loop_running_later_than_the_budget_sheds_at_once_and_admits_again_once_on_time() -> None:
    async def scenario() -> None:
        admission = gate()
        admission.start()
        await asyncio.sleep(0.1)
        admission.admit()
        admission.done()
        # Given the loop held up (a burst of work) past the budget
        time.sleep(3 * BUDGET)
        # When a beat comes before the ticker even ran again: shed
        with pytest.raises(Overloaded):
            admission.admit()
        # Once the loop keeps time again, beats are admitted
        await asyncio.sleep(0.1)
        admission.admit()
        admission.stop()

    asyncio.run(scenario())


def test_the_delay_grows_with_the_share_shed_is_jittered_and_capped() -> None:
    async def scenario() -> None:
        admission = gate(in_flight=1, most=30.0)
        admission.start()
        admission.admit()  # one admitted, and held: every other beat is shed
        delays = []
        for _ in range(400):
            with pytest.raises(Overloaded) as shed:
                admission.admit()
            delays.append(shed.value.retry_after)
        admission.stop()
        # The k-th shed for one admitted: 1 + k seconds, times 1 to 2, each its own
        for k, delay in enumerate(delays[:10], start=1):
            assert 1 + k <= delay <= 2 * (1 + k), (k, delay)
        assert len(set(delays[:10])) == 10
        # and never more than the most
        assert set(delays[30:]) == {30.0}

    asyncio.run(scenario())


def test_shed_beats_are_noted_once_a_second_and_kept_when_the_note_fails() -> None:
    notes: list[int] = []
    failing = True

    async def scenario() -> None:
        nonlocal failing
        admission = gate(in_flight=1, notes=notes)

        async def flaky(count: int) -> None:
            if failing:
                raise ConnectionError("Redis is down")
            notes.append(count)

        admission.note_shed = flaky
        admission.start()
        admission.admit()
        for _ in range(5):
            with pytest.raises(Overloaded):
                admission.admit()
        await asyncio.sleep(ROLL + 0.2)
        assert notes == [] and admission.unnoted == 5
        failing = False
        with pytest.raises(Overloaded):
            admission.admit()
        await asyncio.sleep(ROLL + 0.2)
        assert notes == [6] and admission.unnoted == 0
        admission.stop()

    asyncio.run(scenario())
