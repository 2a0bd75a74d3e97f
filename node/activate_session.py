"""A session's program on a compute node: started inside the worker's job, as its owner.

Standard-library Python 3.6+, sent by the platform on stdin: the password's line, this
launcher's source, a NUL, then the source of the session kind's starter
(``node/starters/<kind>.py``):
    python3 -c BOOTSTRAP KIND --activate-session ID [--OPTION VALUE ...] [--folder FOLDER]
(the password is never in argv, which other users may read). The starter has the kind's
program listen on Unix sockets in a private (0700) folder of the owner's, so no other user of
the node can reach it. The one TCP port is this launcher's gate: a connection gets through to
a program's socket only after a mutual challenge keyed by the password (each side proves it
holds the key without sending it, and the proof is bound to both sides' fresh nonces), so a
neighbour who connects gets nothing, and a neighbour who takes the port once this launcher is
gone learns nothing the platform would send. Once the programs answer it prints one line of
JSON: {"ready": true, "host", "port", "pid"}; on failure {"error": "..."}. It stays in the
foreground, and when any of the session's essential programs ends, or it gets SIGTERM or
SIGHUP, it ends them all.
"""

import ctypes
import errno
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any, Dict, List, NoReturn, Optional

READY_WITHIN = 120
GATE_GREETING = b"ACTIVATE-GATE 1 "
GATE_LINE_MAX = 512
# The whole handshake, however slowly it trickles in: a byte now and then holds nothing longer.
GATE_HANDSHAKE_WITHIN = 10.0
# Connections that have not proven themselves yet, per peer and in all.
GATE_MAX_UNPROVEN_PER_PEER = 8
GATE_MAX_UNPROVEN = 64
CHUNK = 65536


def say(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answers(path: str) -> bool:
    """Whether a program listens on the Unix socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def gate_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), b"activate-gate", hashlib.sha256).digest()


def gate_proof(key: bytes, side: str, gate_nonce: str, client_nonce: str, route: str) -> str:
    message = "\n".join((side, gate_nonce, client_nonce, route)).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def find(*names: str) -> Optional[str]:
    """The first of these commands on PATH (or given as an executable path)."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


PR_SET_PDEATHSIG = 1


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


LIBC = _libc()


def _ending_with(parent: int) -> Any:
    """Run in the child before it starts its program: it is killed when the launcher dies, even
    by SIGKILL. A scheduler that ends a job by its process group (Grid Engine) does not reach
    programs in sessions of their own, and without this they would outlive the job."""
    if LIBC is None or not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the line above
            os._exit(1)

    return preexec


class Launcher:
    """What a starter gets: a private work folder and log, and the session's processes."""

    ready_within = READY_WITHIN

    def __init__(self, workdir: str, log: IO[bytes]) -> None:
        self.workdir = workdir
        self.log = log
        self.children = []  # type: List[subprocess.Popen]
        # The programs the session is: when one of them ends, the session's program has ended.
        # (A terminal or window manager closed in the desktop is not: the desktop stays.)
        self.essential = []  # type: List[subprocess.Popen]
        self.routes = {}  # type: Dict[str, str]
        # The starter's own source, for one that runs part of itself as a script of its own.
        self.starter_source = ""
        # The folder the session opens in (its programs start there): the owner's home unless
        # the platform says --folder.
        self.folder = os.path.expanduser("~")

    def enter(self, folder: str) -> None:
        """Go to the folder the session was asked to open in ("~" is the home), or fail
        saying why (the OS decides whether the owner may)."""
        if folder == "~" or folder.startswith("~/"):
            folder = os.path.expanduser("~") + folder[1:]
        try:
            os.chdir(folder)
        except OSError as exc:
            self.fail("cannot open the folder %s: %s" % (folder, exc.strerror or exc))
        self.folder = os.getcwd()

    answers = staticmethod(answers)
    find = staticmethod(find)

    def route(self, name: str) -> str:
        """A Unix socket in the private folder where a program listens; the gate passes
        proven connections for ``name`` to it."""
        path = os.path.join(self.workdir, name + ".sock")
        self.routes[name] = path
        return path

    def fail(self, message: str) -> NoReturn:
        say(error=message)
        self.stop_all()
        sys.exit(1)

    def start(
        self,
        argv: List[str],
        vital: bool = True,
        env: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> subprocess.Popen:
        """A process in a session of its own (so it ends with its children), its output in the
        log, unless the starter says otherwise."""
        kwargs.setdefault("stdout", self.log)
        kwargs.setdefault("stderr", self.log)
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                env=env,
                preexec_fn=_ending_with(os.getpid()),
                **kwargs,
            )
        except OSError as exc:
            self.fail("cannot start %s: %s" % (argv[0], exc))
        self.children.append(child)
        if vital:
            self.essential.append(child)
        return child

    def forget(self, child: subprocess.Popen) -> None:
        """A process the starter gave up on (and ends itself): no longer the session's."""
        for group in (self.children, self.essential):
            if child in group:
                group.remove(child)

    def wait_for(self, path: str, what: str) -> None:
        deadline = time.time() + READY_WITHIN
        while time.time() < deadline:
            for child in self.essential:
                if child.poll() is not None:
                    self.fail(
                        "%s exited with status %s before it answered" % (what, child.returncode)
                    )
            if answers(path):
                return
            time.sleep(0.2)
        self.fail("%s did not answer on %s within %d s" % (what, path, READY_WITHIN))

    def running(self) -> bool:
        return all(child.poll() is None for child in self.essential)

    def stop_all(self, *_args: Any) -> None:
        for child in self.children:
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.time() + 5
        for child in self.children:
            try:
                child.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except OSError:
                    pass


def pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


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
    on the node never shares one with the owner's SSH forward), anyone else by address."""
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
    neighbour's, and a neighbour who holds slots makes its own connections give way.
    (The relay, node/activate_relay.py, has the same; each runs standing alone.)"""

    def __init__(self, per_peer: int, total: int) -> None:
        self.per_peer = per_peer
        self.total = total
        self.lock = threading.Lock()
        self.held: Dict[str, List[socket.socket]] = {}
        self.count = 0
        self.evicted = 0

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
        self.evicted += 1


class Gate:
    """The session's one TCP port. Each connection: the gate sends a fresh nonce, the client
    answers with the route it wants, its own nonce and its proof; the gate answers with its
    proof, then joins the connection to the route's Unix socket. A wrong proof closes it.
    Connections still to prove themselves have GATE_HANDSHAKE_WITHIN for it and share Slots;
    proven ones are never counted among them."""

    def __init__(self, key: bytes, routes: Dict[str, str], log: IO[bytes]) -> None:
        self.key = key
        self.routes = routes
        self.log = log
        # Bound here and held: the port is never free between choosing it and using it.
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("0.0.0.0", 0))
        self.listener.listen(128)
        self.port = int(self.listener.getsockname()[1])
        self.unproven = Slots(GATE_MAX_UNPROVEN_PER_PEER, GATE_MAX_UNPROVEN)

    def serve(self) -> None:
        threading.Thread(target=self._accept, name="gate", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError as exc:
                if self.listener.fileno() < 0:
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.01)  # out of descriptors: the backlog waits
                continue
            try:
                threading.Thread(target=self._handle, args=(connection,), daemon=True).start()
            except RuntimeError:
                connection.close()

    def _handle(self, connection: socket.socket) -> None:
        peer = peer_of(connection)
        self.unproven.take(peer, connection)
        try:
            proven = self._prove(connection, time.monotonic() + GATE_HANDSHAKE_WITHIN)
        finally:
            kept = self.unproven.give_back(peer, connection)
        program = self._join(connection, *proven) if proven and kept else None
        if program is None:
            connection.close()
            return
        threading.Thread(target=pump, args=(program, connection), daemon=True).start()
        pump(connection, program)

    def _prove(self, connection: socket.socket, deadline: float) -> Optional[tuple]:
        """The route, gate nonce and client nonce of a client that proved it holds the key."""
        try:
            # The handshake's lines and a program's answer relayed as it writes them are small
            # writes in a row: with Nagle each waited for the far end's delayed ACK (~40 ms).
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.settimeout(GATE_HANDSHAKE_WITHIN)
            nonce = os.urandom(16).hex()
            connection.sendall(GATE_GREETING + nonce.encode() + b"\n")
            line = b""
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                connection.settimeout(left)
                data = connection.recv(GATE_LINE_MAX - len(line))
                if not data or len(line) + len(data) >= GATE_LINE_MAX:
                    return None
                line += data
            parts = line.decode("ascii", "replace").split()
            if len(parts) != 3 or parts[0] not in self.routes or len(parts[1]) != 32:
                return None
            route, client_nonce, proof = parts
            expected = gate_proof(self.key, "client", nonce, client_nonce, route)
            if not hmac.compare_digest(proof, expected):
                self.log.write(b"gate: a connection without the session's key was closed\n")
                self.log.flush()
                return None
            return route, nonce, client_nonce
        except (OSError, ValueError):
            return None

    def _join(
        self, connection: socket.socket, route: str, nonce: str, client_nonce: str
    ) -> Optional[socket.socket]:
        """The program's socket for a proven connection, once the gate has given its proof."""
        program = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            program.connect(self.routes[route])
            answer = gate_proof(self.key, "gate", nonce, client_nonce, route)
            connection.settimeout(GATE_HANDSHAKE_WITHIN)
            connection.sendall(b"OK " + answer.encode() + b"\n")
            connection.settimeout(None)
            return program
        except OSError:
            program.close()
            return None


def load_starter(kind: str, source: str) -> Any:
    """The kind's starter, run as a module of its own; its ``start`` starts the program."""
    namespace = {"__name__": "activate_starter_%s" % kind}  # type: Dict[str, Any]
    exec(compile(source, "starters/%s.py" % kind, "exec"), namespace)
    return namespace["start"]


def main() -> None:
    args = sys.argv[1:]
    kind = args[0] if args else ""
    options = dict(zip(args[1::2], args[2::2]))
    # Run by the platform's bootstrap, which read the password's line and split the starter off.
    secret = str(globals().get("SECRET") or "")
    source = str(globals().get("STARTER") or "")
    workdir = tempfile.mkdtemp(prefix="activate-session-")
    launcher = Launcher(workdir, open(os.path.join(workdir, "log"), "ab"))

    def stop_and_exit(*_args: Any) -> None:
        launcher.stop_all()
        sys.exit(0)

    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, stop_and_exit)
    try:
        if not secret:
            launcher.fail("no password came on stdin")
        if not source:
            launcher.fail("no starter came for session type %r" % kind)
        launcher.starter_source = source
        if options.get("--folder"):
            launcher.enter(options["--folder"])
        load_starter(kind, source)(launcher, secret, options)
        for path in launcher.routes.values():
            launcher.wait_for(path, kind)
        gate = Gate(gate_key(secret), launcher.routes, launcher.log)
        gate.serve()
        say(ready=True, host=socket.gethostname(), port=gate.port, pid=os.getpid())
        while launcher.running():
            time.sleep(1)
    finally:
        launcher.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
