"""Redis clients from REDIS_URL: the one place that turns the setting into clients.

REDIS_URL names one server (redis://, rediss://, unix://) or the sentinels that watch a master
(sentinel://, core/env.py's SENTINEL_FORM). For the latter every client is redis-py's
Sentinel-managed one: each new connection asks the sentinels where the master is, and a
connection that fails or finds its server demoted is dropped, so after a failover the same
client object reaches the promoted replica. Celery's broker URL is derived here too, in kombu's
own sentinel form.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlparse

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from django.conf import settings

from core.env import DEFAULT_SENTINEL_PORT, SentinelAddress, sentinel_address

# A Redis that stops answering (a host cut off, a master killed) fails a call within this long.
TIMEOUTS: dict[str, Any] = {"socket_timeout": 5, "socket_connect_timeout": 5}


def _sentinel_of(url: str) -> SentinelAddress | None:
    return sentinel_address(url) if urlparse(url).scheme == "sentinel" else None


def _sentinel_kwargs(address: SentinelAddress) -> dict[str, Any]:
    """How to reach the sentinels themselves: their own credentials, the same timeouts."""
    kwargs = dict(TIMEOUTS)
    if address.sentinel_password is not None:
        kwargs["password"] = address.sentinel_password
    if address.sentinel_username is not None:
        kwargs["username"] = address.sentinel_username
    return kwargs


def _master_kwargs(address: SentinelAddress) -> dict[str, Any]:
    return {"db": address.db, "username": address.username, "password": address.password}


def client_for(url: str) -> redis.Redis:
    """A new synchronous client of the Redis that ``url`` names (through its sentinels)."""
    address = _sentinel_of(url)
    if address is None:
        return redis.Redis.from_url(url, **TIMEOUTS)
    sentinel = redis.sentinel.Sentinel(
        address.sentinels, sentinel_kwargs=_sentinel_kwargs(address), **TIMEOUTS
    )
    return sentinel.master_for(address.service, **_master_kwargs(address))


def async_client_for(url: str) -> redis.asyncio.Redis:
    """A new redis.asyncio client of the Redis that ``url`` names (through its sentinels)."""
    address = _sentinel_of(url)
    if address is None:
        return redis.asyncio.Redis.from_url(url, **TIMEOUTS)
    sentinel = redis.asyncio.sentinel.Sentinel(
        address.sentinels, sentinel_kwargs=_sentinel_kwargs(address), **TIMEOUTS
    )
    return sentinel.master_for(address.service, **_master_kwargs(address))


@functools.cache
def _client(url: str) -> redis.Redis:
    return client_for(url)


def redis_client() -> redis.Redis:
    """The process-wide client: heartbeats, locks and the health check share it."""
    return _client(settings.REDIS_URL)


def async_redis_client() -> redis.asyncio.Redis:
    """A client for one event loop (the agents' server makes one): asyncio connections belong to
    the loop that opened them, so none is shared."""
    return async_client_for(settings.REDIS_URL)


def celery_broker(url: str, transport_options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Celery's broker URL and transport options for REDIS_URL ``url``: the same URL for one
    server; for sentinels kombu's form, one ``sentinel://`` per sentinel joined by ``;`` (each
    carrying the master's credentials and database) with ``master_name`` and the sentinels' own
    credentials in ``sentinel_kwargs``, beside the options given."""
    address = _sentinel_of(url)
    options = dict(transport_options)
    if address is None:
        return url, options
    credentials = ""
    if address.username is not None or address.password is not None:
        credentials = (
            f"{quote(address.username or '', safe='')}:{quote(address.password or '', safe='')}@"
        )
    broker_url = ";".join(
        f"sentinel://{credentials}{f'[{host}]' if ':' in host else host}:{port}/{address.db}"
        for host, port in address.sentinels
    )
    options["master_name"] = address.service
    options["sentinel_kwargs"] = _sentinel_kwargs(address)
    return broker_url, options


def broker_client(broker_url: str, transport_options: Mapping[str, Any]) -> redis.Redis:
    """A client of Celery's broker as kombu reaches it: the inverse of celery_broker()."""
    if urlparse(broker_url).scheme != "sentinel":
        return client_for(broker_url)
    sentinels = [urlparse(part) for part in broker_url.split(";")]
    first = sentinels[0]
    sentinel = redis.sentinel.Sentinel(
        [(part.hostname or "127.0.0.1", part.port or DEFAULT_SENTINEL_PORT) for part in sentinels],
        sentinel_kwargs=transport_options.get("sentinel_kwargs"),
        **TIMEOUTS,
    )
    path = first.path.strip("/")
    return sentinel.master_for(
        transport_options["master_name"],
        db=int(path) if path.isdigit() else 0,
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )
