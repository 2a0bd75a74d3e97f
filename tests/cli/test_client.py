"""How pw words what the platform answers, against a scripted platform."""

from __future__ import annotations

import httpx
import pytest
from activate_cli.client import ApiClient
from activate_cli.config import Config
from activate_cli.errors import CliError, NotFound, Unreachable


def client_answering(response: httpx.Response) -> ApiClient:
    transport = httpx.MockTransport(lambda request: response)
    return ApiClient(Config("http://platform.test", "pwk_x"), transport=transport)


@pytest.mark.parametrize(
    ("response", "error", "message"),
    [
        (
            httpx.Response(400, json={"field": "walltime", "detail": "bad"}),
            CliError,
            "walltime: bad",
        ),
        (
            httpx.Response(400, json={"field": None, "detail": "JSON parse error"}),
            CliError,
            "JSON parse error",
        ),
        (httpx.Response(404, text="<html>"), NotFound, "worker w1 not found"),
        (httpx.Response(502, text="<html>bad gateway</html>"), Unreachable, "HTTP 502"),
        (
            httpx.Response(301, headers={"Location": "https://platform.test/api/workers/"}),
            CliError,
            "redirects to https://platform.test/api/workers/",
        ),
        (httpx.Response(200, text="<html>hello</html>"), CliError, "not JSON"),
    ],
)
def test_each_failure_becomes_one_sentence(
    response: httpx.Response, error: type[CliError], message: str
) -> None:
    with pytest.raises(error) as raised:
        client_answering(response).get("/workers/w1/", not_found="worker w1 not found")

    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_key_is_sent_as_a_bearer_token() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"username": "alice"})

    client = ApiClient(
        Config("http://platform.test", "pwk_x"), transport=httpx.MockTransport(answer)
    )

    assert client.get("/me/") == {"username": "alice"}
    assert seen[0].headers["Authorization"] == "Bearer pwk_x"
    assert str(seen[0].url) == "http://platform.test/api/me/"


def test_a_no_content_answer_is_read_as_nothing() -> None:
    assert client_answering(httpx.Response(204)).delete("/clusters/hpc1/account/") is None


def test_a_keyed_post_is_retried_with_the_same_key_when_the_answer_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("activate_cli.client.RETRY_BASE_DELAY", 0.0)
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Idempotency-Key"))
        if len(seen) == 1:
            raise httpx.ReadTimeout("lost", request=request)
        if len(seen) == 2:
            return httpx.Response(503, text="busy")
        return httpx.Response(200, json={"id": "w1"})

    client = ApiClient(
        Config("http://platform.test", "pwk_x"), transport=httpx.MockTransport(answer)
    )

    assert client.post("/workers/", {}, idempotency_key="pw-1") == {"id": "w1"}
    assert seen == ["pw-1", "pw-1", "pw-1"]


def test_a_post_without_a_key_is_never_retried() -> None:
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    client = ApiClient(
        Config("http://platform.test", "pwk_x"), transport=httpx.MockTransport(answer)
    )

    with pytest.raises(Unreachable):
        client.post("/clusters/c/account/verify/")
    assert len(calls) == 1
