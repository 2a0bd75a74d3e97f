#!/usr/bin/env python3
"""ACTIVATE relay: runs on a cluster's login host for clusters whose compute nodes cannot reach
the platform. Agents call it; it passes each agent request to a port on the login host's
loopback that the platform's SSH connection forwards back to the platform's agents' server.

Standard library only, Python 3.6+, like the agent. Started by the platform over SSH as
``python3 -c BOOT activate-relay TAG BIND_HOST BIND_PORT FORWARDED_PORT HOST``, its source sent on
stdin, then one line: the forward's proof. It then keeps reading stdin and exits when that
closes, so it never outlives the SSH session that started it. Once listening it prints
``READY <port> <hostname>`` on stdout.

Only the agent endpoints pass (``/agent/``, GET or POST, one request per connection, a small
body); anything else is answered 403 here and never reaches the platform. Each request's Host
header becomes HOST, the agents' server's own name, which the platform accepts.

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
import signal
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

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
# Hop-by-hop headers (the relay decides how the connection ends: one request, then close), the
# Host (the relay names the agents' server) and what only the platform's own proxy may say.
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


class Refusal(Exception):
    def __init__(self, status: int, reason: str, text: str) -> None:
        super().__init__(text)
        self.status, self.reason, self.text = status, reason, text


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
    """The request line and headers to send on, or Refusal when it is not an agent call."""
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
        if lowered in DROPPED_HEADERS:
            continue
        headers.append(line)
    if method == "POST" and not signed:
        raise Refusal(401, "Unauthorized", "agent calls are signed")
    request_line = "%s %s %s" % (method, target, version)
    headers += ["Host: " + host, "Connection: close"]
    out = "\r\n".join([request_line, *headers]) + "\r\n\r\n"
    return out.encode("ascii"), length


def read_body(client: socket.socket, already: bytes, length: int, deadline: float) -> bytes:
    body = already[:length]
    while len(body) < length:
        chunk = receive(client, min(65536, length - len(body)), deadline)
        if not chunk:
            raise Refusal(400, "Bad Request", "incomplete body")
        body += chunk
    return body


def read_request(client: socket.socket, host: str, deadline: float) -> bytes:
    """The whole agent call to send on (head and body), or Refusal."""
    head, rest = read_head(client, deadline)
    request, length = checked_request(head, host)
    return request + read_body(client, rest, length, deadline)


def pass_on(
    client: socket.socket, request: bytes, forwarded_port: int, proof: bytes, shed: "Shedding"
) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", forwarded_port), timeout=IO_TIMEOUT)
    except OSError as exc:
        shed.note("unreachable", "cannot reach the forwarded port %d: %s" % (forwarded_port, exc))
        answer(client, Refusal(502, "Bad Gateway", "the platform cannot be reached"))
        return
    try:
        upstream.sendall(proof + b"\n" + request)
        response = read_response(upstream)
    except OSError:
        response = b""
    finally:
        upstream.close()
    if not response:
        # The way back broke mid-answer (e.g. the SSH connection dropped): a clean 502 that the
        # agent retries, never half an answer.
        shed.note("cut off", "the platform's answer was cut off")
        answer(client, Refusal(502, "Bad Gateway", "the platform's answer was cut off"))
        return
    try:
        client.settimeout(IO_TIMEOUT)
        client.sendall(response)
    except OSError:
        pass


def read_response(upstream: socket.socket) -> bytes:
    """The whole answer (the platform closes after it), or b"" when it came incomplete."""
    data = b""
    while len(data) <= MAX_RESPONSE:
        chunk = upstream.recv(65536)
        if not chunk:
            break
        data += chunk
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.") or len(data) > MAX_RESPONSE:
        return b""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            if not value.strip().isdigit() or len(body) < int(value):
                return b""
    return data


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
        self.forwarded_port = forwarded_port
        self.host = host
        self.proof = proof
        self.shed = Shedding()
        self.unread = Slots(MAX_UNREAD_PER_PEER, MAX_UNREAD, lambda: self.shed.note("evicted"))
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
            self.unread.take(peer, client)
            try:
                request = read_request(client, self.host, time.monotonic() + REQUEST_WITHIN)
            except Refusal as refusal:
                if self.unread.give_back(peer, client):
                    answer(client, refusal)
                return
            except OSError:
                self.unread.give_back(peer, client)
                return
            if not self.unread.give_back(peer, client):
                return
            if not self.passing.acquire(blocking=False):
                self.shed.note("refused", "all %d slots for calls being passed on" % MAX_PASSING)
                answer(client, Refusal(503, "Service Unavailable", "too many connections"))
                return
            try:
                pass_on(client, request, self.forwarded_port, self.proof, self.shed)
            finally:
                self.passing.release()
        finally:
            client.close()


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
