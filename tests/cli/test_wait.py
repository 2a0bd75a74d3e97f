"""The --wait loop against a scripted platform: outages are ridden out, for a while."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from activate_cli import waiting, workers
from activate_cli.client import ApiClient
from activate_cli.config import Config
from activate_cli.errors import CliError, Unreachable


def scripted(answers: list[int | str]) -> Iterator[httpx.Response]:
    """Each answer is an HTTP error status or the worker status to report."""
    for answer in answers:
        if isinstance(answer, int):
            yield httpx.Response(answer, text="<html>down</html>")
        else:
            yield httpx.Response(200, json={"id": "w1", "status": answer, "status_reason": ""})


def client_answering(answers: list[int | str]) -> ApiClient:
    responses = scripted(answers)
    transport = httpx.MockTransport(lambda request: next(responses))
    return ApiClient(Config("http://platform.test", "pwk_x"), transport=transport)


@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(waiting.POLL_ENV, "0.001")


def test_wait_rides_out_a_short_outage(capsys: pytest.CaptureFixture[str]) -> None:
    client = client_answering([503, 502, "queued", "connected"])

    worker = workers.wait_for(
        client,
        {"id": "w1", "status": "pending"},
        done=lambda w: w["status"] == "connected",
        failed={"error"},
    )

    assert worker["status"] == "connected"
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "w1: pending",
        "http://platform.test failed with HTTP 503; try again later; still trying",
        "w1: queued",
        "w1: connected",
    ]


def test_wait_gives_up_when_the_outage_lasts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "WAIT_OUTAGE_SECONDS", 0.0)
    client = client_answering([503, 503, 503])

    with pytest.raises(Unreachable, match="HTTP 503"):
        workers.wait_for(
            client,
            {"id": "w1", "status": "pending"},
            done=lambda w: w["status"] == "connected",
            failed={"error"},
        )


def test_a_bad_poll_interval_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(waiting.POLL_ENV, "soon")

    with pytest.raises(CliError, match="PW_POLL_INTERVAL must be a positive number"):
        waiting.poll_interval()
