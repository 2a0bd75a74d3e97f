"""DATABASE_URL as Django's DATABASES entry, with libpq's several hosts: a primary and its
standbys (``postgres://user@host1:5432,host2:5432/name?target_session_attrs=read-write``) are
tried in order and the one that takes writes is used, so after a standby is promoted the next
connection finds it. dj_database_url reads one host only; the list is taken apart here and
handed to libpq as its comma-separated ``host`` and ``port``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url


def parse_database_url(url: str, *, conn_max_age: int) -> dict[str, Any]:
    """Django's settings for ``url``; ValueError saying what is wrong."""
    parts = urlsplit(url)
    login, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return dict(dj_database_url.parse(url, conn_max_age=conn_max_age))
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError("several hosts are for PostgreSQL only")
    names, ports = [], []
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":") if "]" not in host[-1:] else (host, "", "")
        if not colon:
            name, port = host, ""
        if not name or (port and not port.isdigit()):
            raise ValueError(f"{host!r} is not host or host:port")
        names.append(name)
        ports.append(port)
    first = urlunsplit(parts._replace(netloc=f"{login}{at}{names[0]}"))
    settings = dict(dj_database_url.parse(first, conn_max_age=conn_max_age))
    settings["HOST"] = ",".join(name.strip("[]") for name in names)
    settings["PORT"] = ",".join(port or "5432" for port in ports) if any(ports) else ""
    return settings
