"""Nothing replayable at rest in the database: someone who reads every row of every table
(after a real login, an API key used and an agent's connect) tries every text value as the
platform's login cookie, an API key and the worker's agent key. The platform refuses each.
Django's session table keeps only a hash of each session key (core/login_sessions.py)."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import models
from django.test import Client

from core.login_sessions import SessionStore, stored_key
from harness.agents import SignedAgent
from tests.agents.heartbeats.signed import django_post, worker_with_key
from workers_app.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-alice-database-read"
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,}")


def everything_in_the_database() -> list[str]:
    """Every text value of every row of every table (binary ones as text)."""
    values: list[str] = []
    for model in apps.get_models(include_auto_created=True):
        names = [
            f.attname
            for f in model._meta.concrete_fields
            if isinstance(f, models.CharField | models.TextField | models.BinaryField)
        ]
        for row in model._default_manager.values_list(*names) if names else []:
            for value in row:
                if isinstance(value, bytes | memoryview):
                    value = bytes(value).decode("utf-8", "replace")
                if value:
                    values.append(str(value))
    return values


def candidates(values: list[str]) -> list[str]:
    found = {v for v in values if v.isprintable() and ";" not in v and len(v) <= 4096}
    found |= {piece for value in values for piece in TOKEN.findall(value)}
    return sorted(found)


def logged_in(client: Client) -> str:
    """A real login through the login page: the session cookie it sets."""
    answer = client.post("/login/", {"username": "alice", "password": PASSWORD})
    assert answer.status_code == 302, answer.content[:500]
    return str(client.cookies[settings.SESSION_COOKIE_NAME].value)


def test_nothing_read_from_the_database_logs_in_or_signs_for_an_agent() -> None:
    # Given: alice logged in through the login page, her API key used, an agent connected.
    alice = User.objects.create_user("alice", password=PASSWORD)
    browser = Client()
    cookie = logged_in(browser)
    assert browser.get("/api/workers/").status_code == 200
    _, api_key = ApiKey.issue(alice)
    assert Client().get("/api/workers/", HTTP_AUTHORIZATION=f"Bearer {api_key}").status_code == 200
    worker, agent = worker_with_key()
    connect: dict[str, object] = {"worker": worker.public_id, "hostname": "node7"}
    assert django_post(Client(), agent, "connect", connect)[0] == 200

    # When: someone reads every table.
    tried = candidates(everything_in_the_database())
    print(f"{len(tried)} candidates from the database")

    # Then: none logs in as a session cookie,
    logged = []
    for value in tried:
        client = Client()
        client.cookies[settings.SESSION_COOKIE_NAME] = value
        if client.get("/api/workers/").status_code == 200:
            logged.append(value)
    assert not logged, f"logged in with what the database holds: {logged}"
    # or as an API key,
    api = [
        v
        for v in tried
        if Client().get("/api/workers/", HTTP_AUTHORIZATION=f"Bearer {v}").status_code == 200
    ]
    assert not api, f"used the API with what the database holds: {api}"
    # or signs for the agent (its key id given: it is no secret).
    beat: dict[str, object] = {"worker": worker.public_id}

    def signs(key: str) -> bool:
        forged = SignedAgent(worker.public_id, agent.key_id, key)
        return django_post(Client(), forged, "heartbeat", beat)[0] != 401

    signed = [v for v in tried if signs(v)]
    assert not signed, f"signed for the agent with what the database holds: {signed}"
    # The real ones still work.
    assert browser.get("/api/workers/").status_code == 200
    assert cookie not in tried
    assert django_post(Client(), agent, "heartbeat", beat)[0] == 200


def test_the_table_keeps_each_key_by_its_hash_through_create_cycle_and_flush() -> None:
    # Given: a session made by the platform's engine.
    store = SessionStore()
    store["seen"] = 1
    store.create()
    key = str(store.session_key)
    # Then: its row is found by the key's hash, never holds the key, and loads by the key.
    assert list(Session.objects.values_list("session_key", flat=True)) == [stored_key(key)]
    assert SessionStore(key)["seen"] == 1 and SessionStore().exists(key)
    # When: its key changes (as at login), the old row goes and the new one is a hash too.
    store.cycle_key()
    new = str(store.session_key)
    assert new != key and SessionStore(key).get("seen") is None
    assert list(Session.objects.values_list("session_key", flat=True)) == [stored_key(new)]

    # The same through Django's async interface.
    async def read_async() -> object:
        return await SessionStore(new).aget("seen")

    assert async_to_sync(read_async)() == 1
    # When: it is flushed (logout), no row is left.
    store.flush()
    assert not Session.objects.exists()
