"""How long a silent peer is believed alive, on every TCP connection the platform holds.

A process that is killed has its connections closed by its kernel at once; a host that is cut
off (its link down, a partition) leaves them open on the other side until TCP gives up, which
by the kernel's defaults is about two hours. What hangs on such a connection then is held that
long: a PostgreSQL backend keeps a cut-off holder's advisory locks (core/locks.py), so its
workers would not be submitted by anyone else. Keepalive probes after a third of the silence,
three of them a ninth apart, and a limit on unacknowledged data (TCP_USER_TIMEOUT), on both
ends of each connection we can reach, end such a connection within the silence instead.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

PROBES = 3


@dataclass(frozen=True)
class PeerSilence:
    seconds: int

    @property
    def idle(self) -> int:
        """Seconds without traffic before the first probe."""
        return max(1, self.seconds // 3)

    @property
    def interval(self) -> int:
        return max(1, self.seconds // 9)

    @property
    def user_timeout_ms(self) -> int:
        return self.seconds * 1000

    def libpq(self) -> dict[str, object]:
        """libpq's connection parameters: the client's end, and (``options``) the server's, so
        the backend that holds a session's locks gives a silent client up too."""
        server = (
            f"-c tcp_keepalives_idle={self.idle} -c tcp_keepalives_interval={self.interval} "
            f"-c tcp_keepalives_count={PROBES} -c tcp_user_timeout={self.user_timeout_ms}"
        )
        return {
            "keepalives": 1,
            "keepalives_idle": self.idle,
            "keepalives_interval": self.interval,
            "keepalives_count": PROBES,
            "tcp_user_timeout": self.user_timeout_ms,
            "options": server,
        }

    def socket_options(self) -> dict[int, int]:
        """IPPROTO_TCP options for a socket of ours (with SO_KEEPALIVE on)."""
        return {
            socket.TCP_KEEPIDLE: self.idle,
            socket.TCP_KEEPINTVL: self.interval,
            socket.TCP_KEEPCNT: PROBES,
            socket.TCP_USER_TIMEOUT: self.user_timeout_ms,
        }

    def apply(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in self.socket_options().items():
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def with_postgres_options(
    options: dict[str, object], silence: PeerSilence, *, server: bool = True
) -> dict[str, object]:
    """A database's OPTIONS with the silence's libpq parameters (without ``server``, the
    client's end only); what the operator set in DATABASE_URL wins (their ``options`` come
    after ours, and PostgreSQL takes the last -c)."""
    ours = silence.libpq()
    if not server:
        del ours["options"]
    merged = {**ours, **options}
    if "options" in options and "options" in ours:
        merged["options"] = f"{ours['options']} {options['options']}"
    return merged
