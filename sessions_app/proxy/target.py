"""Which session a proxied request is for, and what of the browser's request reaches its
program: never the platform's credentials, always the program's own login."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async

from core.transport.channels import ChannelPipe
from sessions_app import kinds
from sessions_app.kinds.base import ProxyLogin, SessionKind
from sessions_app.models import Session
from sessions_app.proxy import gate
from sessions_app.proxy.headers import request_cookies
from sessions_app.services import check_program, find_session
from sessions_app.statuses import SessionStatus
from workers_app.cluster_access import open_tunnel
from workers_app.idle import note_traffic

log = logging.getLogger(__name__)

PREFIX = "/s/"
PATH = re.compile(r"^/s/(?P<public_id>[a-z0-9]{1,16})(?P<rest>/.*)?$")


@dataclass(frozen=True)
class Target:
    """A session the user may reach, its kind, and the login the proxy adds for its program."""

    session: Session
    kind: SessionKind
    login: ProxyLogin

    def path_on_node(self, rest: str) -> str:
        """Where ``rest`` (the path after /s/<id>) is on the program."""
        if self.kind.keeps_prefix:
            return self.session.url_path.rstrip("/") + rest
        return rest

    def note_traffic(self) -> None:
        """Bytes crossed for this session: it and its worker are in use (idle.note_traffic)."""
        note_traffic(self.session.worker_id, self.session.public_id)

    @property
    def address(self) -> tuple[str, int]:
        assert self.session.node_port is not None
        return self.session.node_host, self.session.node_port


def cookie_header(raw: list[bytes], login: Mapping[str, str]) -> str:
    """The browser's cookies minus the platform's own, plus the program's login cookies."""
    return request_cookies(raw, login)


# It asks the node over SSH: off the thread the server's database calls share.
program_check = database_sync_to_async(check_program, thread_sensitive=False)


@database_sync_to_async
def find_target(user: Any, public_id: str) -> Target | None:
    if user is None or not user.is_authenticated:
        return None
    session = find_session(user, public_id)
    if session is None:
        return None
    kind = kinds.get(session.session_type)
    # Read here, off the event loop: the proxy must not touch the database later.
    running = session.status == SessionStatus.RUNNING
    login = kind.proxy_login(session.login_cookie()) if running else ProxyLogin()
    _ = session.worker.cluster, session.worker.account
    return Target(session=session, kind=kind, login=login)


async def open_pipe(
    target: Target, route: str = "http"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to the program behind the session launcher's gate (``route``: which of its
    sockets); raises GateRefused, an SSHError, when what answers is not the launcher."""
    host, port = target.address
    log.info("session %s: tunnel to %s:%s", target.session.public_id, host, port)
    worker = target.session.worker
    connection, channel = await asyncio.to_thread(open_tunnel, worker, host, port)
    reader, writer = await ChannelPipe(channel, connection.tunnel_closed).open()
    try:
        await gate.open_async(reader, writer, target.session.secret(), route)
    except BaseException:
        writer.close()
        raise
    return reader, writer
