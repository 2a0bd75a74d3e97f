"""Nothing replayable at rest in Redis: someone who reads every key of the platform's Redis
database (after a real login, a session handed over to its own origin, an API key used and an
agent's beat) tries every value, and every piece of one that looks like a token, as each
credential the platform takes: the login cookie, a session host's cookie, an API key, a
handoff token and an agent's key. The platform refuses every one. The platform runs as real
processes (web and agents' servers, Celery worker, sweeper, beat)."""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User

from core.redis_connection import redis_client
from harness.agents import SignedAgent
from harness.platform import Platform
from sessions_app.models import Session
from sessions_app.proxy.origins import COOKIE, HANDOFF_PATH, STATE_COOKIE
from sessions_app.statuses import SessionStatus
from tests.factories import WorkerFactory
from workers_app.actions import lifecycle
from workers_app.agent_keys import issue_agent_key
from workers_app.models import ApiKey, Worker

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-alice-redis-read"
# Runs of the characters tokens are made of (urlsafe base64, hex, Django's session keys), and
# of those that Fernet tokens, JSON and key names join them with.
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,}")
WIDER = re.compile(r"[A-Za-z0-9_\-.~+/=]{16,}")
COOKIE_SAFE = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+")


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    with Platform(workdir=tmp_path).running() as running:
        yield running


@dataclass
class Browser:
    """Requests to the platform's host or a session's (same server, another Host header),
    cookies given by hand."""

    client: httpx.Client
    platform: Platform

    def get(
        self,
        url: str,
        *,
        host: str = "",
        cookies: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        sent = dict(headers or {})
        if host:
            sent["Host"] = host
        if cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        # Only the cookies given: none kept from earlier answers.
        self.client.cookies.clear()
        return self.client.get(url, headers=sent, params=params)


def set_cookie(response: httpx.Response, name: str) -> str:
    for header in response.headers.get_list("set-cookie"):
        key, _, rest = header.partition("=")
        if key == name:
            return rest.split(";")[0]
    raise AssertionError(f"no {name} cookie set: {response.headers}")


def logged_in(browser: Browser, username: str) -> str:
    """A real login through the login page: the platform's session cookie."""
    page = browser.get("/login/")
    csrf = set_cookie(page, settings.CSRF_COOKIE_NAME)
    form = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert form is not None, page.text[:500]
    browser.client.cookies.clear()
    answer = browser.client.post(
        "/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": form[1]},
        headers={"Cookie": f"{settings.CSRF_COOKIE_NAME}={csrf}"},
    )
    assert answer.status_code == 302, answer.text[:500]
    return set_cookie(answer, settings.SESSION_COOKIE_NAME)


@dataclass
class Handoff:
    state: str
    token: str


def handoff(browser: Browser, sid: str, host: str, platform_cookie: str) -> Handoff:
    """The way a browser is sent from the platform to a session's host: a state there, a
    token for it from the platform."""
    login = {settings.SESSION_COOKIE_NAME: platform_cookie}
    there = browser.get(f"/s/{sid}/", cookies=login)
    assert there.status_code == 302 and urlsplit(there.headers["location"]).netloc == host
    asked = browser.get(f"/s/{sid}/", host=host)
    assert asked.status_code == 302, asked.text
    state = set_cookie(asked, STATE_COOKIE)
    back = urlsplit(asked.headers["location"])
    given = browser.get(f"{back.path}?{back.query}", cookies=login)
    assert given.status_code == 302, given.text
    token = parse_qs(urlsplit(given.headers["location"]).query)["token"][0]
    return Handoff(state, token)


def take(browser: Browser, host: str, state: str, token: str) -> httpx.Response:
    cookies = {STATE_COOKIE: state}
    return browser.get(HANDOFF_PATH, host=host, cookies=cookies, params={"token": token})


def sent_to_platform(response: httpx.Response) -> bool:
    """A session's host answering "no credential here": back to the platform for one."""
    return response.status_code == 302 and HANDOFF_PATH in response.headers.get("location", "")


# -- what a reader of Redis gets ------------------------------------------------------------


def everything_in_redis() -> list[str]:
    """Every key's name and every value, hash field, list item and member, as text."""
    client: Any = redis_client()
    found: list[Any] = []
    for key in client.scan_iter(count=1000):
        found.append(key)
        kind = client.type(key).decode()
        print(f"  {kind:6} {key.decode('utf-8', 'replace')}")
        if kind == "string":
            found.append(client.get(key) or b"")
        elif kind == "hash":
            for field_, value in client.hgetall(key).items():
                found += [field_, value]
        elif kind == "list":
            found += client.lrange(key, 0, -1)
        elif kind == "set":
            found += list(client.smembers(key))
        elif kind == "zset":
            found += [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            for _, entry in client.xrange(key):
                for field_, value in entry.items():
                    found += [field_, value]
    return [item.decode("utf-8", "replace") for item in found]


def _decoded(text: str) -> list[str]:
    """What a piece of text holds inside: JSON's strings, base64's text (Celery's messages)."""
    inner: list[str] = []
    try:
        loaded = json.loads(text)
    except ValueError:
        loaded = None
    stack = [loaded]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            inner.append(item)
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            raw = decode(text + "=" * (-len(text) % 4))
            inner.append(raw.decode("utf-8"))
        except (binascii.Error, ValueError):
            pass
    return [i for i in inner if i != text]


def candidates(values: list[str]) -> list[str]:
    """Every value, and every substring of one that looks like a token (also inside JSON and
    base64, twice over), each once, cookie-safe ones only."""
    seen: set[str] = set()
    todo = [(value, 0) for value in values]
    while todo:
        text, depth = todo.pop()
        pieces = {text, *TOKEN.findall(text), *WIDER.findall(text)}
        pieces |= {part for piece in WIDER.findall(text) for part in re.split(r"[:.=/+~]", piece)}
        for piece in pieces:
            if piece in seen or len(piece) < 8:
                continue
            seen.add(piece)
            if depth < 3:
                todo += [(inner, depth + 1) for inner in _decoded(piece)]
    return sorted(c for c in seen if COOKIE_SAFE.fullmatch(c) and len(c) <= 4096)


# -- the test -------------------------------------------------------------------------------


def test_nothing_read_from_redis_logs_in_opens_a_session_or_signs_for_an_agent(
    platform: Platform,
) -> None:
    # Given: alice, a worker of hers whose job was given its key, and a session on it.
    alice = User.objects.create_user("alice", password=PASSWORD)
    worker = cast(Worker, WorkerFactory(owner=alice))
    key = issue_agent_key(worker.public_id)
    Worker.objects.filter(pk=worker.pk).update(agent_secret_hash=key.key_hash)
    worker.refresh_from_db()
    lifecycle.mark_submitted(worker, job_id="123")
    lifecycle.mark_started(worker, hostname="node7")
    session = Session(
        name="desktop_1",
        owner=alice,
        session_type="desktop",
        worker=worker,
        status=SessionStatus.ENDED,
    )
    session.set_secret("s3cret-program-password")
    session.save()
    sid = session.public_id
    host = f"{sid}.{settings.ACTIVATE_SESSION_DOMAIN}:{platform.port}"
    agent = SignedAgent(worker.public_id, key.key_id, key.key)

    with (
        httpx.Client(base_url=platform.url, timeout=10) as web,
        httpx.Client(base_url=platform.agent_url, timeout=10) as agents,
    ):
        browser = Browser(web, platform)

        # What each credential opens, asked the way a browser, `pw` or an agent asks.
        def logs_in(value: str) -> bool:
            cookies = {settings.SESSION_COOKIE_NAME: value}
            return browser.get("/api/workers/", cookies=cookies).status_code == 200

        def opens_the_session(value: str) -> bool:
            answer = browser.get(f"/s/{sid}/", host=host, cookies={COOKIE: value})
            return not sent_to_platform(answer)

        def is_an_api_key(value: str) -> bool:
            headers = {"Authorization": f"Bearer {value}"}
            return browser.get("/api/workers/", headers=headers).status_code == 200

        def signs_for_the_agent(value: str) -> bool:
            # Its key id given: that is no secret.
            forged = SignedAgent(worker.public_id, key.key_id, value)
            return forged.post(agents, "/agent/v1/heartbeat").status_code != 401

        def takes_the_handoff(value: str) -> bool:
            # In the browser that holds the pending handoff's state.
            return take(browser, host, pending.state, value).status_code != 403

        # When: her agent connects and beats, she logs in, her session is handed over to its
        # own host (and a second handoff is on its way, not taken yet), and her API key is used.
        connect: dict[str, object] = {"worker": worker.public_id, "hostname": "node7"}
        assert agent.post(agents, "/agent/v1/connect", connect).status_code == 200
        assert agent.post(agents, "/agent/v1/heartbeat").status_code == 200
        platform_cookie = logged_in(browser, "alice")
        assert logs_in(platform_cookie)
        first = handoff(browser, sid, host, platform_cookie)
        taken = take(browser, host, first.state, first.token)
        assert taken.status_code == 302, taken.text
        origin_cookie = set_cookie(taken, COOKIE)
        assert opens_the_session(origin_cookie)
        assert not opens_the_session(secrets.token_urlsafe(32))
        pending = handoff(browser, sid, host, platform_cookie)
        _, api_key = ApiKey.issue(alice)
        assert is_an_api_key(api_key)
        assert agent.post(agents, "/agent/v1/heartbeat").status_code == 200

        # And: someone reads all of Redis.
        values = everything_in_redis()
        tried = candidates(values)
        print(f"read {len(values)} names and values from Redis: {len(tried)} candidates")

        # Then: not one of them takes the pending handoff,
        takers = [c for c in tried if takes_the_handoff(c)]
        assert not takers, f"taken with what Redis holds: {takers}"
        # logs in to the platform,
        platform_in = [c for c in tried if logs_in(c)]
        assert not platform_in, f"logged in to the platform with what Redis holds: {platform_in}"
        # opens the session on its own host,
        session_in = [c for c in tried if opens_the_session(c)]
        assert not session_in, f"opened the session with what Redis holds: {session_in}"
        # is taken as an API key,
        api_in = [c for c in tried if is_an_api_key(c)]
        assert not api_in, f"used the API with what Redis holds: {api_in}"
        # or signs for the worker's agent.
        signed = [c for c in tried if signs_for_the_agent(c)]
        assert not signed, f"signed for the agent with what Redis holds: {signed}"
        print(
            f"each of the {len(tried)} refused as a login cookie, a session host's cookie, an "
            "API key, a handoff token and an agent's key"
        )
        # The real ones still work: the platform was listening all along, and nothing but the
        # token stood in the pending handoff's way.
        assert logs_in(platform_cookie) and opens_the_session(origin_cookie)
        assert is_an_api_key(api_key) and signs_for_the_agent(key.key)
        assert takes_the_handoff(pending.token)
