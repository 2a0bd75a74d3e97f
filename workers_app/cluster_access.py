"""Which SSH connection serves whom: one per (cluster, account) and process, and one more
while all of its channels are taken (a shared account's commands never queue behind other
users' long ones).

A user's commands go over their own cluster account; the cluster's own account serves probes
and the workers of a shared cluster. Connections open on first use, close after
ACTIVATE_SSH_IDLE_TIMEOUT without a command, and at most ACTIVATE_SSH_MAX_CONNECTIONS stay
open per process (the least recently used idle one goes first). Terminals get connections of
their own, as do a relay and the check of an account's login: every SSH connection the platform
opens is built here.

On a cluster that trusts the platform's CA, an account without a key of its own logs in with a
certificate signed for each login (``identity.certificates``), never for a disabled user; and
each process closes what a user holds within ``revocations.CHECK_EVERY`` of their disabling.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import redis
from django.conf import settings
from django.contrib.auth import get_user_model

from core import metrics as families
from core.keystore import KeyDecryptionError
from core.redis_connection import redis_client
from core.transport.channels import Channel
from core.transport.connection import Credentials, SSHConnection
from core.transport.errors import AuthenticationFailed, SSHError
from core.transport.streams import PtySize, Stream
from identity import certificates, revocations
from schedulers import adapter_class
from schedulers.base import SchedulerAdapter
from workers_app.models import Cluster, ClusterAccount, Worker

ConnectionKey = tuple[int, int]  # (cluster id, account id or 0 for the cluster's own)
CommandKey = tuple[int, int, int]  # a ConnectionKey and which of that login's connections
# Each process publishes how many connections it holds, so operators see the sum (/health/).
COUNT_KEY_PREFIX = "activate:ssh-connections:"

_connections: dict[CommandKey, tuple[tuple[str, ...], SSHConnection]] = {}
# Terminals get connections of their own, a few streams each (sshd's MaxSessions is 10 by
# default), closed with their last stream: an open shell never competes with the polls.
_stream_connections: dict[ConnectionKey, dict[SSHConnection, int]] = {}
_lock = threading.Lock()
# Cluster names by id, for the metrics of connections whose cluster object is gone from hand.
_cluster_names: dict[int, str] = {}
# Whose each user login is (user id), so a disabled user's connections can be found and closed.
_owners: dict[ConnectionKey, int] = {}
_owner_watch: threading.Thread | None = None
log = logging.getLogger(__name__)


def _fingerprint(*parts: object) -> tuple[str, ...]:
    # Any edit that changes where or how we connect yields a new connection.
    return tuple(hashlib.sha256(str(part).encode()).hexdigest()[:16] for part in parts)


class KeyUnusable(SSHError):
    """A stored private key cannot be decrypted (ACTIVATE_SECRET_KEY changed): no retry helps."""


class UserDisabled(AuthenticationFailed):
    """The account's user is disabled on the platform: no certificate is signed for them, and no
    retry helps."""


def _login(
    cluster: Cluster, account: ClusterAccount | None
) -> tuple[str, Callable[[], Credentials]]:
    try:
        if account is None:
            if not cluster.username or not cluster.has_private_key:
                raise SSHError(f"cluster {cluster.name} has no account of its own configured")
            key = cluster.private_key()
            return cluster.username, lambda: Credentials(key)
        if account.private_key_encrypted:
            key = account.private_key()
            return account.remote_username, lambda: Credentials(key)
    except KeyDecryptionError as exc:
        raise KeyUnusable(str(exc)) from None
    if not cluster.ca_private_key_encrypted:
        raise AuthenticationFailed(
            f"account {account} has no key, and cluster {cluster.name} does not trust the "
            "platform's certificates"
        )
    ca, user_id, principal = (
        cluster.ca_private_key_encrypted,
        account.user_id,
        account.remote_username,
    )

    def certificate() -> Credentials:
        # Asked at each login: a user disabled since the last one gets no certificate.
        username = (
            get_user_model()
            .objects.filter(pk=user_id, is_active=True)
            .values_list("username", flat=True)
            .first()
        )
        if username is None or _disabled(user_id):
            raise UserDisabled(
                f"user {user_id} is disabled: the platform signs them no certificate"
            )
        try:
            signed = certificates.sign_user_certificate(
                ca, principal=principal, key_id=certificates.key_id_for(username, user_id)
            )
        except KeyDecryptionError as exc:
            raise KeyUnusable(str(exc)) from None
        return Credentials(signed.private_key, signed.certificate)

    return principal, certificate


def _disabled(user_id: int) -> bool:
    try:
        return revocations.is_disabled(user_id)
    except redis.RedisError:
        return False  # the database, just asked, said active


def new_connection(
    cluster: Cluster,
    account: ClusterAccount | None = None,
    *,
    max_channels: int | None = None,
    command_timeout: float | None = None,
) -> SSHConnection:
    """A connection nobody else shares, to ``cluster`` as ``account`` (None: the cluster's own);
    the caller closes it. KeyUnusable or SSHError when there is no usable login."""
    username, credentials = _login(cluster, account)
    return SSHConnection(
        host=cluster.host,
        port=cluster.port,
        username=username,
        credentials=credentials,
        host_key=cluster.host_key,
        connect_timeout=settings.ACTIVATE_SSH_CONNECT_TIMEOUT,
        command_timeout=(
            settings.ACTIVATE_SSH_COMMAND_TIMEOUT if command_timeout is None else command_timeout
        ),
        max_channels=settings.ACTIVATE_SSH_MAX_CHANNELS if max_channels is None else max_channels,
        on_channel_wait=families.SSH_CHANNEL_WAITS.labels(cluster.name).observe,
        silence=settings.PEER_SILENCE,
    )


def connection_for(cluster: Cluster, account: ClusterAccount | None = None) -> SSHConnection:
    """The process-wide connection to ``cluster`` as ``account`` (None: the cluster's own):
    the first of that login's with a channel free, a new one when all are taken."""
    login: ConnectionKey = (cluster.pk, account.pk if account is not None else 0)
    # A certificate login is made anew by a rotated CA.
    secret = (
        (account.private_key_encrypted or cluster.ca_public_key)
        if account
        else cluster.private_key_encrypted
    )
    user = account.remote_username if account else cluster.username
    fingerprint = _fingerprint(cluster.host, cluster.port, cluster.host_key, user, secret)
    stale: list[SSHConnection] = []
    with _lock:
        chosen: CommandKey | None = None
        numbers: set[int] = set()
        for key in [k for k in _connections if k[:2] == login]:
            held_fingerprint, held_connection = _connections[key]
            if held_fingerprint != fingerprint:
                stale.append(_connections.pop(key)[1])
                continue
            numbers.add(key[2])
            if chosen is None and not held_connection.channels_taken:
                chosen = key
        if chosen is not None and not stale:
            return _connections[chosen][1]
        if chosen is None:
            chosen = (*login, next(n for n in itertools.count() if n not in numbers))
            _connections[chosen] = (fingerprint, new_connection(cluster, account))
        connection = _connections[chosen][1]
        _note_owner_locked(login, account)
        stale += _evict_locked(keep=chosen)
        _cluster_names[cluster.pk] = cluster.name
        held = _held_by_cluster_locked()
    for old in stale:
        old.close()
    _publish(held)
    return connection


def open_stream(worker: Worker, argv: list[str], *, pty: PtySize | None) -> Stream:
    """Run argv (none: a login shell) in the worker's job, as its owner, kept open as a stream.

    SchedulerError if the job is not running; SSHError if the cluster cannot be reached.
    """
    account = worker.account
    key: ConnectionKey = (worker.cluster.pk, account.pk if account is not None else 0)
    with _lock:
        pool = _stream_connections.setdefault(key, {})
        connection = next(
            (c for c, n in pool.items() if n < settings.ACTIVATE_SSH_STREAMS_PER_CONNECTION), None
        )
        if connection is None:
            connection = new_connection(worker.cluster, account)
        # Counted before the command starts, so a concurrent open sees this place taken.
        pool[connection] = pool.get(connection, 0) + 1
        _note_owner_locked(key, account)
    try:
        adapter = adapter_class(worker.cluster.scheduler)(connection)
        command = adapter.interactive_command(worker.scheduler_job_id, argv, pty=pty is not None)
        return connection.open_stream(
            command, pty=pty, on_close=lambda: _stream_closed(key, connection)
        )
    except BaseException:
        _stream_closed(key, connection)
        raise


def open_tunnel(worker: Worker, host: str, port: int) -> tuple[SSHConnection, Channel]:
    """A channel to host:port seen from the cluster's login host, as the worker's owner.

    The caller calls ``connection.tunnel_closed()`` once it has closed the channel.
    """
    connection = connection_for(worker.cluster, worker.account)
    return connection, connection.open_tunnel(host, port)


def _stream_closed(key: ConnectionKey, connection: SSHConnection) -> None:
    with _lock:
        pool = _stream_connections.get(key, {})
        left = pool.get(connection, 1) - 1
        if left > 0:
            pool[connection] = left
            return
        pool.pop(connection, None)
        if not pool:
            _stream_connections.pop(key, None)
    connection.close()


def _note_owner_locked(login: ConnectionKey, account: ClusterAccount | None) -> None:
    global _owner_watch
    if account is None:
        return
    _owners[login] = account.user_id
    if _owner_watch is None:
        _owner_watch = threading.Thread(
            target=_watch_owners, name="ssh-disabled-users", daemon=True
        )
        _owner_watch.start()


def _watch_owners() -> None:
    while True:
        time.sleep(revocations.CHECK_EVERY)
        try:
            close_connections_of_disabled_users()
        except Exception:  # the watch must outlive a Redis or database outage
            log.warning("cannot look for disabled users' connections", exc_info=True)


def close_connections_of_disabled_users() -> int:
    """Close every connection and terminal this process holds as a user disabled since it was
    opened; returns how many connections were closed."""
    with _lock:
        owners = dict(_owners)
    disabled = revocations.disabled_among(owners.values())
    logins = {login for login, user_id in owners.items() if user_id in disabled}
    if not logins:
        return 0
    with _lock:
        closing = [_connections.pop(k)[1] for k in list(_connections) if k[:2] in logins]
        for login in logins:
            closing += list(_stream_connections.pop(login, {}))
            _owners.pop(login, None)
        held = _held_by_cluster_locked()
    for connection in closing:
        connection.close()
    _publish(held)
    if closing:
        log.info("closed %d SSH connections of disabled users %s", len(closing), sorted(disabled))
    return len(closing)


def _evict_locked(*, keep: CommandKey) -> list[SSHConnection]:
    now = time.monotonic()
    idle = sorted(
        (conn.last_used, key)
        for key, (_, conn) in _connections.items()
        if key != keep and conn.in_use == 0
    )
    evicted: list[SSHConnection] = []
    for last_used, key in idle:
        over_cap = len(_connections) > settings.ACTIVATE_SSH_MAX_CONNECTIONS
        if over_cap or now - last_used > settings.ACTIVATE_SSH_IDLE_TIMEOUT:
            evicted.append(_connections.pop(key)[1])
    return evicted


def close_idle_connections() -> int:
    """Close connections idle past the limit; returns how many were closed."""
    with _lock:
        evicted = _evict_locked(keep=(0, 0, -1))
        held = _held_by_cluster_locked()
    for connection in evicted:
        connection.close()
    if evicted:
        _publish(held)
    return len(evicted)


def _held_by_cluster_locked() -> dict[str, int]:
    held: dict[str, int] = {}
    for cluster_id, _, _ in _connections:
        name = _cluster_names.get(cluster_id, str(cluster_id))
        held[name] = held.get(name, 0) + 1
    return held


def _publish(by_cluster: dict[str, int]) -> None:
    families.ssh_connections_held(by_cluster)
    held = sum(by_cluster.values())
    key = f"{COUNT_KEY_PREFIX}{socket.gethostname()}:{os.getpid()}"
    try:
        redis_client().set(key, held, ex=int(max(60, 2 * settings.ACTIVATE_SSH_IDLE_TIMEOUT)))
    except redis.RedisError:
        pass  # a count for operators; never a reason to fail a command


def connections_held_everywhere() -> int:
    """SSH connections held by all platform processes (each publishes its own count)."""
    client = redis_client()
    keys = list(client.scan_iter(match=f"{COUNT_KEY_PREFIX}*", count=1000))
    return sum(int(value) for value in client.mget(keys) if value is not None) if keys else 0


def open_connection_count() -> int:
    with _lock:
        held = [conn for _, conn in _connections.values()]
        held += [conn for pool in _stream_connections.values() for conn in pool]
    return sum(1 for conn in held if conn.is_connected)


def close_all_connections() -> None:
    with _lock:
        connections = [conn for _, conn in _connections.values()]
        _connections.clear()
    families.ssh_connections_held({})
    for connection in connections:
        connection.close()


def _forget_connections_after_fork() -> None:
    # A forked child (Celery prefork) must not touch the parent's sockets or locks: it starts
    # with no connections, and never closes the inherited ones (that would disconnect the
    # parent's session).
    global _connections, _stream_connections, _lock, _cluster_names, _owners, _owner_watch
    _connections = {}
    _stream_connections = {}
    _lock = threading.Lock()
    _cluster_names = {}
    _owners = {}
    _owner_watch = None


os.register_at_fork(after_in_child=_forget_connections_after_fork)


def adapter_for(cluster: Cluster, account: ClusterAccount | None = None) -> SchedulerAdapter:
    """The cluster's scheduler, spoken to as ``account`` (None: the cluster's own account)."""
    return adapter_class(cluster.scheduler)(connection_for(cluster, account))


def adapter_for_worker(worker: Worker) -> SchedulerAdapter:
    """A worker's scheduler, as the account its job runs under."""
    return adapter_for(worker.cluster, worker.account)
