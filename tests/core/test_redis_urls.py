"""REDIS_URL read strictly: one server's URL as before, or a sentinel:// URL naming the sentinels,
the service they watch, the database and both passwords; a malformed one stops start-up with a
sentence that names the setting and the expected form and never shows a password. From one
setting come every Redis client and Celery's broker in kombu's own sentinel form."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import kombu
import pytest
import redis.asyncio.sentinel
import redis.sentinel

from core.env import SENTINEL_FORM, ConfigurationError, EnvReader, SentinelAddress, sentinel_address
from core.redis_connection import async_client_for, broker_client, celery_broker, client_for
from harness import REPO

FULL = "sentinel://:m%40ster@10.0.0.1:26379,10.0.0.2:26380,[::1]/cache/3?sentinel_password=s3nt"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "sentinel://127.0.0.1:26390/activate",
            SentinelAddress(sentinels=(("127.0.0.1", 26390),), service="activate"),
        ),
        (
            FULL,
            SentinelAddress(
                sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26379)),
                service="cache",
                db=3,
                password="m@ster",
                sentinel_password="s3nt",
            ),
        ),
        (
            "sentinel://app:pw@h1,h2:1/svc.a-1/?sentinel_username=watch&sentinel_password=x",
            SentinelAddress(
                sentinels=(("h1", 26379), ("h2", 1)),
                service="svc.a-1",
                username="app",
                password="pw",
                sentinel_username="watch",
                sentinel_password="x",
            ),
        ),
    ],
    ids=["one-sentinel", "passwords-db-ipv6-default-port", "usernames"],
)
def test_a_sentinel_url_names_sentinels_service_database_and_both_passwords(
    url: str, expected: SentinelAddress
) -> None:
    assert sentinel_address(url) == expected
    assert EnvReader({"REDIS_URL": url}).redis_url("REDIS_URL", "redis://x/0") == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("sentinel://h1:26379,h2:26379", "no SERVICE"),
        ("sentinel://h1:26379/", "no SERVICE"),
        ("sentinel:///mymaster", "no sentinel HOST:PORT"),
        ("sentinel://:secret@h1:2637x/mymaster", "the port of 'h1:2637x' is not a number"),
        ("sentinel://h1:70000/mymaster", "the port of 'h1:70000' is not a number"),
        ("sentinel://:secret@h1,,h2/mymaster", "'' has no host"),
        ("sentinel://h1/mymaster/zero", "the DB 'zero' is not a number"),
        ("sentinel://h1/mymaster/0/extra", "more than /SERVICE/DB"),
        ("sentinel://h1/my%20master", "the SERVICE 'my master' is not"),
        ("sentinel://secret@h1/mymaster", "USER:PASSWORD or :PASSWORD"),
        ("sentinel://h1/mymaster?password=secret", "unknown password after ?"),
        ("sentinel://h1/m?sentinel_password=secret&sentinel_password=secret", "given twice"),
        ("sentinel://h1/mymaster#secret", "a part after #"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_saying_why_and_showing_no_password(
    url: str, reason: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        EnvReader({"REDIS_URL": url}).redis_url("REDIS_URL", "redis://x/0")
    message = str(refused.value)
    assert message.startswith("REDIS_URL is not a Sentinel URL (")
    assert reason in message
    assert SENTINEL_FORM in message
    assert "secret" not in message


def test_other_redis_urls_are_read_as_before_and_other_schemes_refused() -> None:
    for url in ("redis://127.0.0.1:6379/2", "rediss://:pw@h:6380/0", "unix:///run/redis.sock"):
        assert EnvReader({"REDIS_URL": url}).redis_url("REDIS_URL", "redis://x/0") == url
    with pytest.raises(
        ConfigurationError, match=r"REDIS_URL must be a URL starting with .*sentinel://"
    ):
        EnvReader({"REDIS_URL": "http://h1/mymaster"}).redis_url("REDIS_URL", "redis://x/0")


def test_start_up_with_a_malformed_sentinel_url_stops_with_the_sentence() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "activate.settings.test",
        "REDIS_URL": "sentinel://:secret@h1:26379,h2:x/mymaster",
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode != 0
    assert (
        "ConfigurationError: REDIS_URL is not a Sentinel URL (the port of 'h2:x'" in started.stderr
    )
    assert "secret" not in started.stderr


def test_clients_from_a_sentinel_url_ask_its_sentinels_for_the_master() -> None:
    client = client_for(FULL)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert (pool.service_name, pool.is_master) == ("cache", True)
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (3, "m@ster")
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26380, 26379]
    assert {s.connection_pool.connection_kwargs["password"] for s in sentinels} == {"s3nt"}

    async_client = async_client_for(FULL)
    async_pool = async_client.connection_pool
    assert isinstance(async_pool, redis.asyncio.sentinel.SentinelConnectionPool)
    assert (async_pool.service_name, async_pool.connection_kwargs["password"]) == (
        "cache",
        "m@ster",
    )
    assert {
        s.connection_pool.connection_kwargs["password"]
        for s in async_pool.sentinel_manager.sentinels
    } == {"s3nt"}
    asyncio.run(async_client.aclose())


def test_celerys_broker_is_kombus_sentinel_form_of_the_same_url_keeping_the_options() -> None:
    options = {"visibility_timeout": 600}
    assert celery_broker("redis://127.0.0.1:6379/4", options) == (
        "redis://127.0.0.1:6379/4",
        options,
    )
    url, sentinel_options = celery_broker(FULL, options)
    assert url == (
        "sentinel://:m%40ster@10.0.0.1:26379/3;sentinel://:m%40ster@10.0.0.2:26380/3;"
        "sentinel://:m%40ster@[::1]:26379/3"
    )
    assert sentinel_options == {
        "visibility_timeout": 600,
        "master_name": "cache",
        "sentinel_kwargs": {"socket_timeout": 5, "socket_connect_timeout": 5, "password": "s3nt"},
    }
    # As kombu reads it: its sentinel transport, every sentinel, the master's password and db.
    connection = kombu.Connection(url, transport_options=sentinel_options)
    assert connection.transport_cls == "sentinel"
    assert (connection.password, connection.virtual_host) == ("m@ster", "3")
    assert len(connection.alt) == 3
    # And back: the watchdog's client of that broker reaches the same master as client_for().
    pool = broker_client(url, sentinel_options).connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert (pool.service_name, pool.connection_kwargs["db"]) == ("cache", 3)
    assert pool.connection_kwargs["password"] == "m@ster"
    assert [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in pool.sentinel_manager.sentinels
    ] == [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26379)]
