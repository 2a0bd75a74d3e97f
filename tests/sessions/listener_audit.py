"""What a session listens on over TCP, as the node's kernel tables say: every socket in LISTEN
state in /proc/net/tcp and /proc/net/tcp6 of a uid (the column any user of the node can read),
each with the process that holds it (its /proc/<pid>/fd, read as root) and that process's
command line and Slurm job. A session should listen on its launcher's gate and nothing else;
``unexpected`` names what else there is.

The one listener let through by what it is, not by its port: ipykernel (7.4) binds the pipe
that its forked subprocesses send their output through to tcp://127.0.0.1 with no option to
move it. It is a ZMQ PULL socket, which sends nothing to whoever connects, and takes only
messages that begin with a random 16-byte key; ``zmq_socket_type`` asks the socket itself.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# ZMTP 3.0's greeting for the NULL mechanism: signature, version, mechanism, as-server, filler.
ZMTP_GREETING = b"\xff" + b"\0" * 8 + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    uid: int
    inode: int
    pid: int | None
    argv: tuple[str, ...]
    job: str | None

    def __str__(self) -> str:
        held = f"pid {self.pid} (job {self.job}): {' '.join(self.argv)}" if self.pid else "?"
        return f"{self.address}:{self.port} uid {self.uid} inode {self.inode}, {held}"


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def _socket_holders() -> dict[int, int]:
    """Socket inode -> a pid holding it (every process's, as root; one's own otherwise)."""
    holders: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    holders.setdefault(int(target[8:-1]), int(entry.name))
        except OSError:
            continue
    return holders


def _argv(pid: int) -> tuple[str, ...]:
    try:
        return tuple(Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1])
    except OSError:
        return ()


def slurm_job(pid: int) -> str | None:
    """The Slurm job a process runs in (its SLURM_JOB_ID, as it was started)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"SLURM_JOB_ID="):
            return entry.split(b"=", 1)[1].decode()
    return None


def tcp_listeners(uid: int) -> list[Listener]:
    """Every TCP socket in LISTEN state that ``uid`` owns, with what holds it."""
    found: list[Listener] = []
    holders = _socket_holders()
    for table in TABLES:
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN or int(fields[7]) != uid:
                continue
            address, port = _address(fields[1])
            inode = int(fields[9])
            pid = holders.get(inode)
            argv = _argv(pid) if pid else ()
            job = slurm_job(pid) if pid else None
            found.append(Listener(address, port, uid, inode, pid, argv, job))
    return found


def zmq_socket_type(port: int, host: str = "127.0.0.1") -> str | None:
    """The socket type a ZMQ socket on ``port`` says it is in its handshake (None: not ZMQ)."""
    data = b""
    try:
        with socket.create_connection((host, port), timeout=5) as probe:
            probe.sendall(ZMTP_GREETING)
            # Its greeting (64 bytes), then its READY command: flags, size, body.
            while len(data) < 66 or len(data) < 66 + data[65]:
                chunk = probe.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        pass
    if len(data) < 66 or data[0] != 0xFF or data[9] != 0x7F:
        return None
    body = data[66 : 66 + data[65]]
    if not body.startswith(b"\x05READY"):
        return None
    at = 6
    while at < len(body):
        size = body[at]
        name = body[at + 1 : at + 1 + size]
        at += 1 + size
        length = int.from_bytes(body[at : at + 4], "big")
        value = body[at + 4 : at + 4 + length]
        at += 4 + length
        if name.lower() == b"socket-type":
            return value.decode("ascii", "replace")
    return None


def kernel_output_pipe(listener: Listener) -> bool:
    """ipykernel's pipe for its subprocesses' output: a ZMQ PULL socket of a kernel."""
    if not any("ipykernel" in arg for arg in listener.argv):
        return False
    host = "::1" if ":" in listener.address else "127.0.0.1"
    return zmq_socket_type(listener.port, host) == "PULL"


def unexpected(
    listeners: Iterable[Listener], *, gate_port: int, in_session: Callable[[Listener], bool]
) -> list[Listener]:
    """The session's listeners other than its gate (and a kernel's receive-only pipe)."""
    return [
        listener
        for listener in listeners
        if in_session(listener) and listener.port != gate_port and not kernel_output_pipe(listener)
    ]


def report(found: Iterable[Listener]) -> str:
    return "\n".join(f"  listening: {listener}" for listener in found)
