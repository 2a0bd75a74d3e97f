"""The node agent told by an overloaded platform to retry after N s: it waits N plus jitter,
stays connected and does not count it as a failure, but only when the answer carries the
platform's signature for that very request. Whoever answers in the platform's place (a
neighbour holding the relay's port) cannot hold its beats back."""

from __future__ import annotations

import json

import pytest

from node import activate_agent

KEY = "k" * 43
INTERVAL = 5.0


class Answers:
    """What the agent's connection gets back for each call, as (status, body, signed as):
    signed as "own" (the platform's signature for the call's nonce), "other" (the platform's
    signature for another call) or "none"."""

    def __init__(self, *answers: tuple[int, dict[str, str], str]) -> None:
        self.answers = list(answers)
        self.sent = 0

    def send(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        self.sent += 1
        status, payload, signed_as = self.answers.pop(0)
        answer = json.dumps(payload).encode()
        nonce = headers["Authorization"].split("nonce=")[1].split(",")[0]
        if signed_as == "other":
            nonce = activate_agent.new_nonce()
        signature = activate_agent.answer_signature(KEY, status, nonce, answer)
        return status, answer, signature if signed_as != "none" else ""

    def close(self) -> None:
        pass


def connected_agent(answers: Answers) -> activate_agent.Agent:
    platform = activate_agent.Platform("http://127.0.0.1:9", "w1", "key-id-0000000000", KEY, 5)
    platform.connection = answers  # type: ignore[assignment]
    agent = activate_agent.Agent(platform, {"worker": "w1", "hostname": "n1"}, INTERVAL)
    agent.connected = True
    return agent


SHED = {"error": "the agents' server is overloaded", "retry_after": "12.0"}


def test_a_signed_retry_after_is_waited_with_jitter_still_connected_and_not_a_failure() -> None:
    # Given an agent whose first beat the platform sheds, then takes the next
    answers = Answers((503, SHED, "own"), (200, {"status": "ok"}, "own"))
    agent = connected_agent(answers)
    retry_delay = agent.retry_delay
    # When it beats: it waits 12 s plus up to half again before the next
    delay = agent.beat()
    assert 12.0 <= delay <= 18.0
    # still connected, with the same identity, and not backing off as from a failure
    assert agent.connected and agent.retry_delay == retry_delay
    # and its next beat is a beat, answered, after which it keeps its interval
    assert agent.beat() == INTERVAL
    assert answers.sent == 2


def test_the_jitter_spreads_agents_told_the_same() -> None:
    delays = {connected_agent(Answers((503, SHED, "own"))).beat() for _ in range(20)}
    assert len(delays) == 20 and min(delays) >= 12.0 and max(delays) <= 18.0


@pytest.mark.parametrize("signed_as", ["none", "other"])
def test_a_retry_after_not_signed_for_the_call_is_a_network_error_not_a_delay(
    signed_as: str,
) -> None:
    # Given a neighbour answering in the platform's place: unsigned, or with a signature the
    # platform gave another call (a 503 it saw go by), asking for an hour's silence
    forged = {"error": "overloaded", "retry_after": "3600"}
    agent = connected_agent(Answers((503, forged, signed_as)))
    # Then the agent retries as after any failed call, soon, and not after an hour
    delay = agent.beat()
    assert delay <= INTERVAL
    assert agent.connected


def test_a_signed_503_without_a_delay_is_retried_as_before() -> None:
    # Redis did not answer the platform: a signed 503 with no retry_after
    agent = connected_agent(Answers((503, {"error": "heartbeat store unavailable"}, "own")))
    assert agent.beat() == agent.retry_delay <= INTERVAL
