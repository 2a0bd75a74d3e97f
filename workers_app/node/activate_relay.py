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
import sys
import threading
import time

AGENT_PATH = re.compile(r"^/agent/[A-Za-z0-9._~/-]*$")
METHODS = ("GET", "POST")
# Agents sign every call they make (the platform's ``agents/signing.py``); anything else that
# would change something is refused here, before it leaves the login host.
SIGNED_SCHEME = "ActivateHMAC "
MAX_HEAD = 8192
MAX_BODY = 65536
MAX_RESPONSE = 1048576
MAX_CONNECTIONS = 256
IO_TIMEOUT = 15.0
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


def read_head(client: socket.socket) -> tuple:
    """The request head (up to the blank line) and whatever body bytes came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise Refusal(431, "Request Header Fields Too Large", "request head too large")
        chunk = client.recv(4096)
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


def read_body(client: socket.socket, already: bytes, length: int) -> bytes:
    body = already[:length]
    while len(body) < length:
        chunk = client.recv(min(65536, length - len(body)))
        if not chunk:
            raise Refusal(400, "Bad Request", "incomplete body")
        body += chunk
    return body


def relay_one(client: socket.socket, forwarded_port: int, host: str, proof: bytes) -> None:
    try:
        client.settimeout(IO_TIMEOUT)
        head, rest = read_head(client)
        request, length = checked_request(head, host)
        body = read_body(client, rest, length)
    except Refusal as refusal:
        answer(client, refusal)
        return
    except OSError:
        return
    try:
        upstream = socket.create_connection(("127.0.0.1", forwarded_port), timeout=IO_TIMEOUT)
    except OSError as exc:
        log("cannot reach the forwarded port %d: %s" % (forwarded_port, exc))
        answer(client, Refusal(502, "Bad Gateway", "the platform cannot be reached"))
        return
    try:
        upstream.sendall(proof + b"\n" + request + body)
        response = read_response(upstream)
    except OSError:
        response = b""
    finally:
        upstream.close()
    if not response:
        # The way back broke mid-answer (e.g. the SSH connection dropped): a clean 502 that the
        # agent retries, never half an answer.
        answer(client, Refusal(502, "Bad Gateway", "the platform's answer was cut off"))
        return
    try:
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


def serve_connection(
    client: socket.socket,
    forwarded_port: int,
    host: str,
    proof: bytes,
    slots: threading.Semaphore,
) -> None:
    try:
        relay_one(client, forwarded_port, host, proof)
    finally:
        try:
            client.close()
        finally:
            slots.release()


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


def serve(
    server: socket.socket, forwarded_port: int, host: str, proof: bytes, slots: threading.Semaphore
) -> None:
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            continue
        if not slots.acquire(blocking=False):
            answer(client, Refusal(503, "Service Unavailable", "too many connections"))
            client.close()
            continue
        threading.Thread(
            target=serve_connection,
            args=(client, forwarded_port, host, proof, slots),
            daemon=True,
        ).start()


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
    slots = threading.Semaphore(MAX_CONNECTIONS)
    for server in servers[1:]:
        threading.Thread(
            target=serve, args=(server, forwarded_port, host, proof, slots), daemon=True
        ).start()
    sys.stdout.write("READY %d %s\n" % (port, socket.gethostname()))
    sys.stdout.flush()
    serve(servers[0], forwarded_port, host, proof, slots)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
