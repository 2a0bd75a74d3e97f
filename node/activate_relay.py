#!/usr/bin/env python3
"""ACTIVATE relay: runs on a cluster's login host for clusters whose compute nodes cannot reach
the platform. Agents call it; it passes each agent request to a port on the login host's
loopback that the platform's SSH connection forwards back to the platform's agents' server.

Standard library only, Python 3.6+, like the agent. Started by the platform over SSH as
``python3 -c BOOT activate-relay TAG BIND_HOST BIND_PORT FORWARDED_PORT HOST``, its source sent on
stdin, then one line: the forward's proof. It then keeps reading stdin and exits when that
closes, so it never outlives the SSH session that started it. Once listening it prints
``READY <port> <hostname>`` on stdout.

Only the agent endpoints pass (``/agent/``, GET or POST, a small body); anything else is
answered 403 here and never reaches the platform. Each request's Host header becomes HOST, the
agents' server's own name, which the platform accepts.

Agents keep one HTTP/1.1 connection open across their beats, and so does the relay: a client's
connection serves its next request too, each request checked and bounded on its own as the
first, while it is idle less than KEEP_IDLE and for at most MAX_REQUESTS_PER_CONNECTION; kept
connections waiting are capped per peer and in all, and beyond that an answer says
``Connection: close`` (nothing is shed: the agent connects again for its next call). A request
that came with bytes after it (pipelined) is answered, then the connection closed. Towards the
platform the relay keeps connections too (each begun with the proof once), reused while younger
than UPSTREAM_IDLE: each new one is a channel the login host's sshd opens back to the platform.

Any user who can reach the port can also try to hold its connections. A request must arrive
whole within REQUEST_WITHIN, however it trickles in; requests not read yet are capped per peer
(a user of this host by uid, anyone else by address) and in all, and when full the newcomer
takes the slot of the fullest peer's oldest (an agent's request arrives within milliseconds, so
a slot held longer is a neighbour's); requests read whole are passed on in slots of their own,
never behind unread ones. Every call the relay could not pass (a connection made to give way, a
request refused for lack of slots, the platform not reached) is counted, and the count is
printed on stderr, ``shed=<n> ...``, at most once a second: its keeper reads it there, and the
platform counts no agent's silence while the relay sheds.

The forwarded port is on the login host's loopback, where any local user can connect to it; the
platform's end of the forward drops every connection that does not begin with the proof, which
only this process has (it came on stdin, never in a command line). The relay listens on every
address its bind host names, IPv4 and IPv6, so no other user can take the port agents are told
on a family the relay left free.
"""

import errno
import os
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

AGENT_PATH = re.compile(r"^/agent/[A-Za-z0-9._~/-]*$")
METHODS = ("GET", "POST")
# Agents sign every call they make (the platform's ``agents/signing.py``); anything else that
# would change something is refused here, before it leaves the login host.
SIGNED_SCHEME = "ActivateHMAC "
MAX_HEAD = 8192
MAX_BODY = 65536
MAX_RESPONSE = 1048576
# A request's head and body, however slowly they come: a byte now and then holds nothing longer.
REQUEST_WITHIN = 5.0
# Connections whose request has not been read whole yet, per peer and in all.
MAX_UNREAD_PER_PEER = 16
MAX_UNREAD = 128
# Requests read whole and being passed on to the platform: slots of their own.
MAX_PASSING = 256
# The way to the platform and back (its answer, the agent taking it).
IO_TIMEOUT = 15.0
SHED_REPORT_EVERY = 1.0
# How long a start waits for its port to be free: the relay it replaces letting go of it, or
# another user holding it (agents then retry, and the keeper starts another relay).
BIND_PATIENCE = 10.0
NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)
# A client's connection waits this long for its next request: above the agents' heartbeat
# interval (30 s unless a site sets it), so beats share one.
KEEP_IDLE = 75.0
MAX_REQUESTS_PER_CONNECTION = 1000
# Kept connections waiting for their next request, per peer and in all (a thread each).
MAX_KEPT_PER_PEER = 64
MAX_KEPT = 1024
# A kept connection to the forwarded port is reused while idle less than this: the agents'
# server (uvicorn) closes one idle 5 s, and its close takes the way back over SSH to show here.
UPSTREAM_IDLE = 2.0
MAX_UPSTREAM_IDLE = 32
# Hop-by-hop headers (the relay decides how each connection ends, on either side), the Host (the
# relay names the agents' server) and what only the platform's own proxy may say.
DROPPED_HEADERS = (
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "host",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
)


# Of an answer, what the relay says itself: how the body is framed and how the connection ends.
DROPPED_ANSWER_HEADERS = (b"connection", b"keep-alive", b"transfer-encoding", b"content-length")


class Refusal(Exception):
    def __init__(self, status: int, reason: str, text: str) -> None:
        super().__init__(text)
        self.status, self.reason, self.text = status, reason, text


class Stale(OSError):
    """A kept connection to the forwarded port was closed before a byte of the answer came."""


class Call(NamedTuple):
    """An agent call read whole and checked: what to send on, and whether the agent's
    connection may serve another one after it."""

    request: bytes
    keep: bool


class Answer(NamedTuple):
    """The platform's answer, its body read whole whatever its framing."""

    status_line: bytes
    headers: List[bytes]
    body: bytes
    reusable: bool  # the connection it came on can carry the next call


def log(message: str) -> None:
    sys.stderr.write("[activate-relay %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


def answer(client: socket.socket, refusal: Refusal) -> None:
    body = (refusal.text + "\n").encode()
    head = (
        "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
        "Connection: close\r\n\r\n" % (refusal.status, refusal.reason, len(body))
    )
    try:
        client.sendall(head.encode() + body)
    except OSError:
        pass


def receive(client: socket.socket, size: int, deadline: float) -> bytes:
    """Up to ``size`` bytes, or Refusal once the request's time is up."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Refusal(408, "Request Timeout", "the request did not arrive in time")
    client.settimeout(left)
    try:
        return client.recv(size)
    except socket.timeout:
        raise Refusal(408, "Request Timeout", "the request did not arrive in time") from None


def read_head(client: socket.socket, deadline: float) -> tuple:
    """The request head (up to the blank line) and whatever body bytes came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise Refusal(431, "Request Header Fields Too Large", "request head too large")
        chunk = receive(client, 4096, deadline)
        if not chunk:
            raise Refusal(400, "Bad Request", "incomplete request")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    if len(head) > MAX_HEAD:
        raise Refusal(431, "Request Header Fields Too Large", "request head too large")
    return head, rest


def checked_request(head: bytes, host: str) -> tuple:
    """The request line and headers to send on, the body's length, and whether the client asks
    to keep its connection (HTTP/1.1 unless it says close); Refusal when it is not an agent
    call."""
    try:
        lines = head.decode("ascii").split("\r\n")
    except UnicodeDecodeError:
        raise Refusal(400, "Bad Request", "request head is not ASCII") from None
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refusal(400, "Bad Request", "malformed request line")
    method, target, version = parts
    path = target.split("?", 1)[0]
    if method not in METHODS or not AGENT_PATH.match(path) or ".." in path or "//" in path:
        raise Refusal(403, "Forbidden", "only the agent endpoints are relayed")
    headers = []
    length = 0
    signed = False
    keep = version == "HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise Refusal(400, "Bad Request", "malformed header")
        lowered = name.lower()
        if lowered == "transfer-encoding":
            raise Refusal(411, "Length Required", "chunked bodies are not relayed")
        if lowered == "content-length":
            value = value.strip()
            if not value.isdigit() or (length and int(value) != length):
                raise Refusal(400, "Bad Request", "malformed Content-Length")
            length = int(value)
            if length > MAX_BODY:
                raise Refusal(413, "Payload Too Large", "request body too large")
        if lowered == "authorization":
            signed = value.strip().startswith(SIGNED_SCHEME)
        if lowered == "connection" and "close" in value.lower():
            keep = False
        if lowered in DROPPED_HEADERS:
            continue
        headers.append(line)
    if method == "POST" and not signed:
        raise Refusal(401, "Unauthorized", "agent calls are signed")
    # HTTP/1.1 upstream whatever the client spoke: the relay keeps that connection itself.
    request_line = "%s %s HTTP/1.1" % (method, target)
    headers += ["Host: " + host]
    out = "\r\n".join([request_line, *headers]) + "\r\n\r\n"
    return out.encode("ascii"), length, keep


def read_body(client: socket.socket, already: bytes, length: int, deadline: float) -> bytes:
    body = already[:length]
    while len(body) < length:
        chunk = receive(client, min(65536, length - len(body)), deadline)
        if not chunk:
            raise Refusal(400, "Bad Request", "incomplete body")
        body += chunk
    return body


def read_request(client: socket.socket, host: str, deadline: float) -> Call:
    """The whole agent call to send on (head and body), or Refusal. Bytes after it (a request
    pipelined behind it) are never read as a request: the connection closes after this one."""
    head, rest = read_head(client, deadline)
    request, length, keep = checked_request(head, host)
    body = read_body(client, rest, length, deadline)
    return Call(request + body, keep and len(rest) <= length)


class Upstream:
    """Connections to the forwarded port, each begun with the proof, kept for later calls."""

    def __init__(self, port: int, proof: bytes) -> None:
        self.port = port
        self.proof = proof
        self.lock = threading.Lock()
        self.idle: List[Tuple[socket.socket, float]] = []
        self.opened = 0

    def take(self) -> Tuple[socket.socket, bool]:
        """A connection, and whether it is a kept one (which the platform may have closed)."""
        with self.lock:
            while self.idle:
                upstream, since = self.idle.pop()
                if time.monotonic() - since < UPSTREAM_IDLE and not readable(upstream):
                    return upstream, True
                upstream.close()
            self.opened += 1
        upstream = socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT)
        try:
            upstream.sendall(self.proof + b"\n")
        except OSError:
            upstream.close()
            raise
        return upstream, False

    def give_back(self, upstream: socket.socket) -> None:
        with self.lock:
            if len(self.idle) < MAX_UPSTREAM_IDLE:
                self.idle.append((upstream, time.monotonic()))
                return
        upstream.close()


def readable(connection: socket.socket) -> bool:
    """Whether bytes (or the end) wait on a connection nothing was asked on."""
    try:
        return bool(select.select([connection], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def pass_on(client: socket.socket, call: Call, upstream: Upstream, shed: "Shedding") -> bool:
    """Sends the call on and its answer back; whether the client's connection may be kept
    (as the call asked and ``call.keep`` says, and the answer came whole)."""
    for attempt in (1, 2):
        try:
            connection, kept = upstream.take()
        except OSError as exc:
            problem = "cannot reach the forwarded port %d: %s" % (upstream.port, exc)
            shed.note("unreachable", problem)
            answer(client, Refusal(502, "Bad Gateway", "the platform cannot be reached"))
            return False
        try:
            connection.sendall(call.request)
            response = read_response(connection)
        except Stale:
            connection.close()
            if kept and attempt == 1:
                # Closed while idle: the same bytes once more on a new connection. A signed
                # call the platform took already is refused as a replay, never counted twice.
                continue
            response = None
        except OSError:
            connection.close()
            response = None
        break
    if response is None:
        # The way back broke mid-answer (e.g. the SSH connection dropped): a clean 502 that the
        # agent retries, never half an answer.
        shed.note("cut off", "the platform's answer was cut off")
        answer(client, Refusal(502, "Bad Gateway", "the platform's answer was cut off"))
        return False
    if response.reusable:
        upstream.give_back(connection)
    else:
        connection.close()
    head = [response.status_line, *response.headers]
    head.append(b"Content-Length: %d" % len(response.body))
    head.append(b"Connection: keep-alive" if call.keep else b"Connection: close")
    try:
        client.settimeout(IO_TIMEOUT)
        client.sendall(b"\r\n".join(head) + b"\r\n\r\n" + response.body)
    except OSError:
        return False
    return call.keep


class Received:
    """What came on a connection to the forwarded port, read on demand up to MAX_RESPONSE."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.data = b""
        self.total = 0
        self.ended = False

    def more(self) -> bool:
        if self.ended:
            return False
        try:
            chunk = self.connection.recv(65536)
        except socket.timeout:
            raise  # the platform is slow, not gone: not sent again
        except OSError:
            if not self.total:
                raise Stale("reset") from None
            raise
        if not chunk:
            self.ended = True
            if not self.total:
                raise Stale("closed")
            return False
        self.total += len(chunk)
        if self.total > MAX_RESPONSE:
            raise OSError("answer too large")
        self.data += chunk
        return True

    def until(self, marker: bytes) -> bytes:
        """The bytes before ``marker`` (taken off with it); OSError if it never comes."""
        while marker not in self.data:
            if not self.more():
                raise OSError("answer cut off")
        found, _, self.data = self.data.partition(marker)
        return found

    def exactly(self, size: int) -> bytes:
        while len(self.data) < size:
            if not self.more():
                raise OSError("answer cut off")
        found, self.data = self.data[:size], self.data[size:]
        return found

    def to_end(self) -> bytes:
        while self.more():
            pass
        found, self.data = self.data, b""
        return found


def read_response(connection: socket.socket) -> Optional[Answer]:
    """One whole answer (by its Content-Length, chunked, or up to the end), or None when it
    came incomplete or malformed; Stale when nothing came at all."""
    received = Received(connection)
    try:
        lines = received.until(b"\r\n\r\n").split(b"\r\n")
        if not lines[0].startswith(b"HTTP/1.") or len(lines[0].split(b" ")) < 2:
            return None
        status = int(lines[0].split(b" ")[1])
        headers, length, chunked, reusable = [], None, False, True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            lowered, value = name.strip().lower(), value.strip()
            if lowered == b"content-length":
                if not value.isdigit():
                    return None
                length = int(value)
            elif lowered == b"transfer-encoding":
                chunked = value.lower() == b"chunked"
                if not chunked:
                    return None
            elif lowered == b"connection" and b"close" in value.lower():
                reusable = False
            if lowered not in DROPPED_ANSWER_HEADERS:
                headers.append(line)
        if status < 200 or status in (204, 304):
            body = b""
        elif chunked:
            body = read_chunks(received)
        elif length is not None:
            body = received.exactly(length)
        else:
            body, reusable = received.to_end(), False
    except Stale:
        raise
    except (OSError, ValueError):
        return None
    # Bytes after the answer nobody asked for: that connection is not to be trusted again.
    return Answer(lines[0], headers, body, reusable and not received.data and not received.ended)


def read_chunks(received: Received) -> bytes:
    body = b""
    while True:
        size = int(received.until(b"\r\n").split(b";")[0].strip(), 16)
        if not size:
            while received.until(b"\r\n"):  # trailers, up to the blank line
                pass
            return body
        body += received.exactly(size)
        if received.exactly(2) != b"\r\n":
            raise ValueError("malformed chunk")


def proc_net_address(family: int, address: tuple) -> bytes:
    """An address as /proc/net/tcp and tcp6 write it: each 32-bit word in the host's order."""
    packed = socket.inet_pton(family, address[0])
    words = struct.unpack("=%dI" % (len(packed) // 4), packed)
    return ("".join("%08X" % word for word in words) + ":%04X" % address[1]).encode()


def local_uid(family: int, peer: tuple, local: tuple) -> Optional[int]:
    """The uid owning the peer's end of a connection made from this host: the socket whose own
    address is the peer's and whose far end is ours."""
    table = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        needle = b" %s %s " % (proc_net_address(family, peer), proc_net_address(family, local))
        with open(table, "rb") as handle:
            text = handle.read()
    except (OSError, ValueError):
        return None
    at = text.find(needle)
    if at < 0:
        return None
    # After the addresses: state, queues, timer, retransmits, then the uid.
    fields = text[at + len(needle) : text.find(b"\n", at)].split()
    try:
        return int(fields[4])
    except (IndexError, ValueError):
        return None


def peer_of(connection: socket.socket) -> str:
    """Whose share of the slots a connection takes: a user of this host by uid (so a neighbour
    on the login host never shares one with anyone else there), anyone else by address."""
    try:
        peer, local = connection.getpeername(), connection.getsockname()
    except OSError:
        return "gone"
    host = peer[0]
    if host == local[0] or host.startswith("127.") or host == "::1":
        uid = local_uid(connection.family, peer, local)
        if uid is not None:
            return "uid %d" % uid
    return host


class Slots:
    """Connections that have not proven themselves yet, capped per peer and in all. When full,
    the newcomer takes the slot of the oldest connection of the fullest peer, which is shut: a
    real client proves itself within milliseconds, so a slot held longer is only ever a
    neighbour's, and a neighbour who holds slots makes its own connections give way."""

    def __init__(self, per_peer: int, total: int, evicted: Callable[[], None]) -> None:
        self.per_peer = per_peer
        self.total = total
        self.evicted = evicted
        self.lock = threading.Lock()
        self.held: Dict[str, List[socket.socket]] = {}
        self.count = 0

    def take(self, peer: str, connection: socket.socket) -> None:
        with self.lock:
            mine = self.held.setdefault(peer, [])
            if len(mine) >= self.per_peer:
                self._evict(peer)
            elif self.count >= self.total:
                self._evict(max(self.held, key=lambda holder: len(self.held[holder])))
            mine.append(connection)
            self.count += 1

    def give_back(self, peer: str, connection: socket.socket) -> bool:
        """Frees the connection's slot; False when it was made to give way meanwhile (it is shut
        then). Called before the connection is closed, so only live sockets are ever shut."""
        with self.lock:
            mine = self.held.get(peer, [])
            if connection not in mine:
                return False
            mine.remove(connection)
            self.count -= 1
            if not mine:
                del self.held[peer]
            return True

    def _evict(self, peer: str) -> None:
        connections = self.held[peer]
        oldest = connections.pop(0)
        self.count -= 1
        if not connections:
            del self.held[peer]
        try:
            oldest.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.evicted()


class Kept:
    """Connections waiting for their next request, capped per peer and in all. Never evicting:
    a connection that finds no room is closed after its answer, as every one was before."""

    def __init__(self, per_peer: int, total: int) -> None:
        self.per_peer = per_peer
        self.total = total
        self.lock = threading.Lock()
        self.held: Dict[str, int] = {}
        self.count = 0

    def take(self, peer: str) -> bool:
        with self.lock:
            if self.count >= self.total or self.held.get(peer, 0) >= self.per_peer:
                return False
            self.held[peer] = self.held.get(peer, 0) + 1
            self.count += 1
            return True

    def give_back(self, peer: str) -> None:
        with self.lock:
            self.count -= 1
            self.held[peer] -= 1
            if not self.held[peer]:
                del self.held[peer]


def next_request_comes(client: socket.socket) -> bool:
    """Whether a kept connection's next request begins within KEEP_IDLE (not its end)."""
    try:
        if not select.select([client], [], [], KEEP_IDLE)[0]:
            return False
        client.settimeout(IO_TIMEOUT)
        return bool(client.recv(1, socket.MSG_PEEK))
    except (OSError, ValueError):
        return False


class Shedding:
    """Agent calls the relay could not pass, reported on stderr for its keeper: a call shed may
    have been an agent's, so its silence is not the node's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Dict[str, int] = {}
        self.total = 0
        self.last_problem = ""
        self.changed = threading.Event()

    def note(self, why: str, problem: str = "") -> None:
        with self.lock:
            self.counts[why] = self.counts.get(why, 0) + 1
            self.total += 1
            if problem:
                self.last_problem = problem
        self.changed.set()

    def report_forever(self) -> None:
        while True:
            self.changed.wait()
            self.changed.clear()
            with self.lock:
                counts = ", ".join("%s %d" % item for item in sorted(self.counts.items()))
                said = "shed=%d (%s)" % (self.total, counts)
                if self.last_problem:
                    said += "; last: " + self.last_problem
            log(said)
            time.sleep(SHED_REPORT_EVERY)


class Relay:
    """What every listening socket of the relay shares: where calls go, and the slots."""

    def __init__(self, forwarded_port: int, host: str, proof: bytes) -> None:
        self.host = host
        self.upstream = Upstream(forwarded_port, proof)
        self.shed = Shedding()
        self.unread = Slots(MAX_UNREAD_PER_PEER, MAX_UNREAD, lambda: self.shed.note("evicted"))
        self.kept = Kept(MAX_KEPT_PER_PEER, MAX_KEPT)
        self.passing = threading.BoundedSemaphore(MAX_PASSING)

    def serve(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                time.sleep(0.01)  # out of descriptors, say: the backlog waits
                continue
            try:
                threading.Thread(target=self.handle, args=(client,), daemon=True).start()
            except RuntimeError:
                self.shed.note("refused", "no thread for a connection")
                client.close()

    def handle(self, client: socket.socket) -> None:
        try:
            peer = peer_of(client)
            for served in range(1, MAX_REQUESTS_PER_CONNECTION + 1):
                call = self.read_call(client, peer)
                if call is None:
                    return
                keep = call.keep and served < MAX_REQUESTS_PER_CONNECTION and self.kept.take(peer)
                try:
                    if not self.pass_call(client, call._replace(keep=keep)):
                        return
                    if not next_request_comes(client):
                        return
                finally:
                    if keep:
                        self.kept.give_back(peer)
        finally:
            client.close()

    def read_call(self, client: socket.socket, peer: str) -> Optional[Call]:
        """The connection's next call, read within REQUEST_WITHIN in a slot of the unread, or
        None when there is none (refused, made to give way, or gone)."""
        self.unread.take(peer, client)
        try:
            call = read_request(client, self.host, time.monotonic() + REQUEST_WITHIN)
        except Refusal as refusal:
            if self.unread.give_back(peer, client):
                answer(client, refusal)
            return None
        except OSError:
            self.unread.give_back(peer, client)
            return None
        return call if self.unread.give_back(peer, client) else None

    def pass_call(self, client: socket.socket, call: Call) -> bool:
        """Passes the call in a slot of its own; whether the connection is kept after it."""
        if not self.passing.acquire(blocking=False):
            self.shed.note("refused", "all %d slots for calls being passed on" % MAX_PASSING)
            answer(client, Refusal(503, "Service Unavailable", "too many connections"))
            return False
        try:
            return pass_on(client, call, self.upstream, self.shed)
        finally:
            self.passing.release()


def pidfile_for(tag: str) -> str:
    return os.path.join(os.path.expanduser("~"), ".activate", "relay-%s.pid" % tag)


def is_relay(pid: int, tag: str) -> bool:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return False
    return b"activate-relay" in words and tag.encode() in words


def replace_previous(tag: str) -> str:
    """One relay per cluster and installation on this host: an earlier one (whose SSH session
    has not ended yet, e.g. a platform host that vanished) is stopped before this one binds."""
    path = pidfile_for(tag)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        with open(path) as handle:
            old = int(handle.read().strip() or "0")
    except (OSError, ValueError):
        old = 0
    if old and old != os.getpid() and is_relay(old, tag):
        log("stopping the previous relay (pid %d)" % old)
        try:
            os.kill(old, signal.SIGTERM)
            for _ in range(50):
                if not is_relay(old, tag):
                    break
                time.sleep(0.1)
            else:
                os.kill(old, signal.SIGKILL)
        except OSError:
            pass
    with open(path + ".tmp", "w") as handle:
        handle.write("%d\n" % os.getpid())
    os.replace(path + ".tmp", path)
    return path


def bind_addresses(host: str, port: int) -> list:
    """Every (family, address) the bind host names: both wildcards when it is empty."""
    found = []
    infos = socket.getaddrinfo(
        host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    for family, _, _, _, address in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, address) not in found:
            found.append((family, address))
    return found


def bind_all(host: str, port: int) -> list:
    """Listening sockets on every address of ``host``, all on one port (picked by the first
    bind when ``port`` is 0). OSError when one of them cannot be bound."""
    servers = []
    try:
        for family, address in bind_addresses(host, port):
            server = socket.socket(family, socket.SOCK_STREAM)
            servers.append(server)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # Each family gets a socket of its own, so neither is left for another user.
                server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port:
                address = (address[0], port, *address[2:])
            try:
                server.bind(address)
            except OSError as exc:
                if family == socket.AF_INET6 and not host and exc.errno in NO_IPV6:
                    # No IPv6 on this host: nobody can listen there either.
                    servers.pop().close()
                    continue
                raise
            server.listen(128)
            port = server.getsockname()[1]
    except OSError:
        for server in servers:
            server.close()
        raise
    return servers


def listen(host: str, port: int) -> list:
    deadline = time.monotonic() + BIND_PATIENCE
    while True:
        try:
            return bind_all(host, port)
        except OSError as exc:
            # The relay this one replaces may still be letting go of the port; or, with a port
            # picked here, the other family's was taken: pick again.
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def watch_lifeline(pidfile: str) -> None:
    """Exit when stdin closes: the SSH session that started the relay has ended."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    forget_pidfile(pidfile)
    os._exit(0)


def forget_pidfile(path: str) -> None:
    try:
        with open(path) as handle:
            if handle.read().strip() == str(os.getpid()):
                os.remove(path)
    except (OSError, ValueError):
        pass


def main(argv: list) -> int:
    if len(argv) != 6 or argv[0] != "activate-relay":
        log("usage: activate-relay TAG BIND_HOST BIND_PORT FORWARDED_PORT HOST")
        return 2
    tag, bind_host, bind_port, forwarded_port = argv[1], argv[2], int(argv[3]), int(argv[4])
    host = argv[5]
    proof = sys.stdin.buffer.readline().strip()
    if len(proof) < 32:
        log("no proof for the forward came on stdin")
        return 2
    pidfile = replace_previous(tag)

    def stop(*_: object) -> None:
        forget_pidfile(pidfile)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        servers = listen(bind_host, bind_port)
    except OSError as exc:
        log("cannot listen on %s:%d: %s" % (bind_host or "*", bind_port, exc))
        forget_pidfile(pidfile)
        return 1
    threading.Thread(target=watch_lifeline, args=(pidfile,), daemon=True).start()
    port = servers[0].getsockname()[1]
    relay = Relay(forwarded_port, host, proof)
    threading.Thread(target=relay.shed.report_forever, daemon=True).start()
    for server in servers[1:]:
        threading.Thread(target=relay.serve, args=(server,), daemon=True).start()
    sys.stdout.write("READY %d %s\n" % (port, socket.gethostname()))
    sys.stdout.flush()
    relay.serve(servers[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
