#!/usr/bin/env python3
"""ACTIVATE node agent: tells the platform this node is up, then heartbeats until told to stop.

Standard library only, Python 3.6+, so it runs on whatever Python 3 a compute node has.
Configuration comes from the environment the job script sets:
ACTIVATE_URL, ACTIVATE_WORKER_ID, ACTIVATE_AGENT_KEY_ID, ACTIVATE_AGENT_KEY,
ACTIVATE_HEARTBEAT_INTERVAL, ACTIVATE_JOB_ID (the job's id, copied by the script from
wherever its scheduler puts it), and ACTIVATE_JOB_VARIABLE (the variable in which the scheduler
puts that id in the environment of the job's steps, if any).

The key never leaves the node: every request carries an HMAC of its method, path, timestamp,
nonce and body, and every answer must carry the platform's HMAC of its status, that nonce and
its body. Whoever sits on the way (a neighbour holding the relay's port, or reading the plain
HTTP between node and login host) can neither make a request count twice nor answer in the
platform's name: an answer that is not signed is a network error, retried, whatever its status.
A platform too busy to answer a beat in time says so in a signed 503 with the seconds to wait:
the agent waits that long plus jitter, still connected, and does not count it as a failure.
Requests are timed by the platform's clock as its signed answers tell it, carried on by this
node's monotonic clock (``Clock``), so the node's clock stepping does not make them stale.

It also watches the launchers of its sessions (processes of its own user whose argv holds
``--activate-session ID``) and tells the platform at once when one is gone.

When the platform asks for it (``activity_interval``), some heartbeats also carry the CPU time
and I/O bytes the job's processes used since the last report, in all and for each session.

Exit codes: 0 the platform ended the worker (or SIGTERM), 3 the platform refused this key.
"""

import base64
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import select
import signal
import socket
import ssl
import sys
import time
import urllib.parse
import urllib.request
from binascii import hexlify
from typing import Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

GONE, FORBIDDEN, NOT_YET, OUTSIDE_WINDOW, OVERLOADED = 410, 403, 409, 425, 503
SCHEME = "ActivateHMAC"
SIGNATURE_HEADER = "X-Activate-Signature"
SESSION_FLAG = b"--activate-session"
SESSION_ID = re.compile(r"^[a-z0-9]{1,32}$")
WATCH_EVERY = 1.0


class Unverified(Exception):
    """An answer without the platform's valid signature: as if the network had failed."""

    def __init__(self, status: int) -> None:
        super().__init__("HTTP %d without the platform's signature" % status)
        self.status = status


class Refused(Exception):
    """A signed answer other than success; ``retry_after`` the seconds a signed 503 says to
    wait (the platform shed the call), None otherwise."""

    def __init__(self, status: int, retry_after: Optional[float] = None) -> None:
        super().__init__("HTTP %d" % status)
        self.status = status
        self.retry_after = retry_after


def log(message: str) -> None:
    sys.stderr.write("[activate-agent %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


def new_nonce() -> str:
    return hexlify(os.urandom(16)).decode()


def _hmac(key: str, message: str) -> str:
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


def request_signature(key: str, method: str, path: str, ts: str, nonce: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    return _hmac(key, "%s\n%s\n%s\n%s\n%s" % (method, path, ts, nonce, digest))


def answer_signature(key: str, status: int, nonce: str, body: bytes) -> str:
    return _hmac(key, "%d\n%s\n%s" % (status, nonce, hashlib.sha256(body).hexdigest()))


def authorization(
    worker: str, key_id: str, key: str, method: str, path: str, body: bytes, ts: str, nonce: str
) -> str:
    sig = request_signature(key, method, path, ts, nonce, body)
    return "%s worker=%s, key=%s, ts=%s, nonce=%s, sig=%s" % (
        SCHEME,
        worker,
        key_id,
        ts,
        nonce,
        sig,
    )


def verified(key: str, status: int, nonce: str, body: bytes, signature: str) -> bool:
    expected = answer_signature(key, status, nonce, body)
    return hmac.compare_digest(expected, (signature or "").strip().lower())


# Errors of a kept connection that the server closed while it sat idle (or just as the request
# went out): the request is sent once more, the very same bytes, on a new connection.
STALE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, http.client.BadStatusLine)


class Connection:
    """One HTTP/1.1 connection to the platform (or relay), kept open across calls and opened
    again only when it is closed or failed. TLS is verified as urllib verifies it by default
    (the system's CAs, the host's name), whatever the site's Python defaults to; a redirect is
    an answer like any other (unsigned), never followed. A proxy from the environment
    (http_proxy, https_proxy, no_proxy) is used as urllib uses it: absolute URLs to it for
    http, a CONNECT tunnel through it for https."""

    def __init__(self, base: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("ACTIVATE_URL must be an http or https URL: %r" % base)
        self.scheme = parts.scheme
        self.netloc = parts.netloc
        self.host, self.port = parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.proxy_headers = {}  # type: Dict[str, str]
        self.proxy = self._proxy(parts.netloc)
        self.http = None  # type: Optional[http.client.HTTPConnection]
        self.opened = 0  # connections opened so far

    def _proxy(self, netloc: str) -> Optional[Tuple[str, Optional[int]]]:
        proxies = urllib.request.getproxies()
        url = proxies.get(self.scheme)
        if not url or urllib.request.proxy_bypass(netloc):
            return None
        if "://" not in url:
            url = "http://" + url
        proxy = urllib.parse.urlsplit(url)
        if proxy.username is not None:
            user = urllib.parse.unquote(proxy.username)
            secret = urllib.parse.unquote(proxy.password or "")
            token = base64.b64encode(("%s:%s" % (user, secret)).encode()).decode()
            self.proxy_headers["Proxy-Authorization"] = "Basic " + token
        return proxy.hostname or "", proxy.port

    def _open(self) -> http.client.HTTPConnection:
        self.opened += 1
        if self.scheme == "https":
            context = ssl.create_default_context()
            if hasattr(context, "set_alpn_protocols"):
                context.set_alpn_protocols(["http/1.1"])
            if self.proxy is None:
                return http.client.HTTPSConnection(
                    self.netloc, timeout=self.timeout, context=context
                )
            conn = http.client.HTTPSConnection(
                self.proxy[0], self.proxy[1], timeout=self.timeout, context=context
            )
            conn.set_tunnel(self.host, self.port, headers=self.proxy_headers)
            return conn
        if self.proxy is None:
            return http.client.HTTPConnection(self.netloc, timeout=self.timeout)
        return http.client.HTTPConnection(self.proxy[0], self.proxy[1], timeout=self.timeout)

    def _target(self, path: str) -> str:
        if self.scheme == "http" and self.proxy is not None:
            return "http://%s%s%s" % (self.netloc, self.prefix, path)
        return self.prefix + path

    def _kept(self) -> bool:
        """Whether a connection is open and still good to send on: a kept connection that has
        become readable between calls was closed by the server (or sent what nobody asked)."""
        conn = self.http
        if conn is None or conn.sock is None:
            return False
        try:
            readable, _, _ = select.select([conn.sock], [], [], 0)
        except (OSError, ValueError):
            readable = [conn.sock]
        if readable:
            self.close()
            return False
        return True

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None

    def send(self, path: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, bytes, str]:
        """POST once (once more, the same bytes, if a kept connection turns out to have been
        closed by the server): status, body and the answer's signature header."""
        kept = self._kept()
        if self.http is None:
            self.http = self._open()
        headers = dict(headers)
        if self.scheme == "http" and self.proxy is not None:
            headers.update(self.proxy_headers)
        try:
            return self._exchange(path, body, headers)
        except STALE:
            self.close()
            if not kept:
                raise
        # Same nonce and timestamp: had the platform taken the first one, it refuses this one
        # as a replay (unsigned, so a failed call here), and it never counts one beat twice.
        self.http = self._open()
        try:
            return self._exchange(path, body, headers)
        except STALE:
            self.close()
            raise

    def _exchange(self, path: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, bytes, str]:
        conn = self.http
        assert conn is not None
        try:
            if conn.sock is None:
                conn.connect()
                # The head and the body go in two writes: neither waits for the other's ACK
                # (later Pythons' http.client sets this too).
                opened = conn.sock  # type: Optional[socket.socket]
                if opened is not None:
                    opened.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.request("POST", self._target(path), body=body, headers=headers)
            response = conn.getresponse()
            answer = response.read()
        except BaseException:
            # Half a call on it (a timeout, say): its answer may still come, for nobody.
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, answer, response.getheader(SIGNATURE_HEADER) or ""


class Clock:
    """The time the agent signs with: the platform's, as its last signed answer with the time
    said it, carried on by the monotonic clock; the node's clock only until the first such
    answer. A step of the node's clock (NTP, an operator) then changes neither the timestamps
    nor their spacing, and a node clock that is wrong is corrected by the platform's first
    answer (a signed 425 to a request outside its window: the agent signs again at once)."""

    def __init__(self) -> None:
        self.base = time.time()
        self.at = time.monotonic()

    def now(self) -> float:
        return self.base + (time.monotonic() - self.at)

    def rebase(self, server_time: float) -> None:
        self.base, self.at = server_time, time.monotonic()


def answered_number(answer: bytes, name: str) -> Optional[float]:
    """A number a signed answer carries as ``name``, if it does."""
    try:
        value = json.loads(answer.decode() or "{}").get(name)
        return float(value) if value is not None else None
    except (ValueError, TypeError, AttributeError):
        return None


def server_time(answer: bytes) -> Optional[float]:
    """The platform's time a signed answer carries, if it does."""
    return answered_number(answer, "server_time")


def retry_after(status: int, answer: bytes) -> Optional[float]:
    """The seconds a signed 503 says to wait before calling again (the platform shed the call),
    if it says so: never from an unsigned answer, so nobody on the way can hold a beat back."""
    if status != OVERLOADED:
        return None
    seconds = answered_number(answer, "retry_after")
    if seconds is None or not 0 <= seconds < 86400:
        return None
    return seconds


class Platform:
    """Signed calls to the platform's agent endpoints (directly or through a relay), over one
    kept connection."""

    def __init__(self, base: str, worker: str, key_id: str, key: str, timeout: float) -> None:
        self.base = base.rstrip("/")
        self.worker = worker
        self.key_id = key_id
        self.key = key
        self.timeout = timeout
        self.clock = Clock()
        self.last_ts = 0  # microseconds, of the last request sent
        self.answered_ts = 0  # of the last request the platform answered in its window
        self.connection = Connection(self.base, timeout)

    def post(self, path: str, payload: dict) -> dict:
        """The signed answer's JSON; Refused for a signed refusal, Unverified for any answer
        the platform did not sign, OSError and friends when nothing came back."""
        body = json.dumps(payload).encode()
        status, answer = self._signed(path, body)
        if status == OUTSIDE_WINDOW and server_time(answer) is not None:
            # Refused for its time alone (nothing done): signed again on the platform's time.
            log("the platform's clock is %+.1f s from this node's; re-based" % self.offset())
            status, answer = self._signed(path, body)
        if status != 200:
            raise Refused(status, retry_after(status, answer))
        return json.loads(answer.decode() or "{}")

    def offset(self) -> float:
        """How far the signing clock is from the node's (seconds)."""
        return self.clock.now() - time.time()

    def _signed(self, path: str, body: bytes) -> Tuple[int, bytes]:
        """One signed call: its status and answer once the platform's signature is checked;
        the time a signed answer carries re-bases the clock."""
        nonce = new_nonce()
        # Each request later than the last, even if the clock steps back: the platform refuses
        # one older than a request it accepted (one held back on the way and sent later).
        self.last_ts = max(int(self.clock.now() * 1000000), self.last_ts + 1)
        ts = "%d.%06d" % divmod(self.last_ts, 1000000)
        header = authorization(self.worker, self.key_id, self.key, "POST", path, body, ts, nonce)
        headers = {"Content-Type": "application/json", "Authorization": header}
        status, answer, signature = self.connection.send(path, body, headers)
        if not verified(self.key, status, nonce, answer, signature):
            # Whatever time an unsigned answer says, the clock stays as it is.
            raise Unverified(status)
        said = server_time(answer)
        if said is not None:
            self.clock.rebase(said)
        if status == OUTSIDE_WINDOW:
            # The platform kept nothing of it: the next request need only follow the last one
            # it did answer in its window.
            self.last_ts = self.answered_ts
        else:
            self.answered_ts = self.last_ts
        return status, answer


def argv_sessions(argv: List[bytes]) -> List[str]:
    """Session ids an argv launches: each valid ID after --activate-session."""
    found = []  # type: List[str]
    for at in range(len(argv) - 1):
        if argv[at] == SESSION_FLAG:
            session = argv[at + 1].decode("ascii", "replace")
            if SESSION_ID.match(session):
                found.append(session)
    return found


def own_processes(uid: int, proc: str) -> Iterator[Tuple[int, int]]:
    """(pid, open directory fd) for each process of ``uid``; the fd is closed once the caller
    moves on. The owner is checked on that fd before anything in it is opened (others'
    processes are never read), and files opened through it belong to that very process even
    if its pid is reused meanwhile."""
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            fd = os.open(os.path.join(proc, pid), os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid == uid:
                yield int(pid), fd
        except OSError:
            pass
        finally:
            os.close(fd)


def read_at(dir_fd: int, name: str) -> bytes:
    with os.fdopen(os.open(name, os.O_RDONLY, dir_fd=dir_fd), "rb") as handle:
        return handle.read()


def launcher_sessions(uid: int, proc: str = "/proc") -> Set[str]:
    """Ids of sessions whose launcher runs as ``uid``: processes of that uid (the owner of
    /proc/<pid>; others' processes are never read) whose argv holds --activate-session ID."""
    found = set()  # type: Set[str]
    for _pid, fd in own_processes(uid, proc):
        try:
            found.update(argv_sessions(read_at(fd, "cmdline").split(b"\0")))
        except OSError:
            continue
    return found


class LauncherWatch:
    """Sessions whose launcher this agent saw, and which of them are gone since."""

    def __init__(self, uid: int, proc: str = "/proc") -> None:
        self.uid = uid
        self.proc = proc
        self.seen = set()  # type: Set[str]

    def ended(self) -> Set[str]:
        running = launcher_sessions(self.uid, self.proc)
        gone = self.seen - running
        self.seen = running
        return gone


Report = NamedTuple(
    "Report",
    [("span", float), ("cpu", float), ("io", int), ("sessions", Dict[str, Tuple[float, int]])],
)
REPORTED_SESSIONS = 30


def merged(earlier: Report, later: Report) -> Report:
    """One report covering both spans (a report the platform never got, and the next)."""
    sessions = dict(earlier.sessions)
    for session, (cpu, io) in later.sessions.items():
        before = sessions.get(session, (0.0, 0))
        sessions[session] = (before[0] + cpu, before[1] + io)
    return Report(
        earlier.span + later.span, earlier.cpu + later.cpu, earlier.io + later.io, sessions
    )


def report_fields(report: Report) -> Dict[str, str]:
    """The report as the heartbeat carries it: strings only, the busiest sessions first."""
    busiest = sorted(report.sessions.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
    return {
        "span": "%.1f" % report.span,
        "cpu": "%.2f" % report.cpu,
        "io": "%d" % report.io,
        "sessions": ",".join(
            "%s:%.2f:%d" % (session, cpu, io) for session, (cpu, io) in busiest[:REPORTED_SESSIONS]
        ),
    }


def io_bytes(dir_fd: int) -> int:
    try:
        text = read_at(dir_fd, "io")
    except OSError:
        return 0
    total = 0
    for line in text.splitlines():
        name, _, value = line.partition(b":")
        if name in (b"rchar", b"wchar"):
            total += int(value)
    return total


class JobActivity:
    """CPU time and I/O of the job's own processes (of ``uid``, not the agent, and, given a job
    id, with that id in their environment) between one sample and the next, for the whole job
    and for each session launcher with its descendants."""

    def __init__(
        self,
        uid: int,
        job_id: str,
        job_variable: str,
        proc: str = "/proc",
        own_pid: Optional[int] = None,
    ) -> None:
        self.uid = uid
        self.proc = proc
        self.own_pid = os.getpid() if own_pid is None else own_pid
        names = ["ACTIVATE_JOB_ID"] + ([job_variable] if job_variable else [])
        self.markers = {("%s=%s" % (name, job_id)).encode() for name in names} if job_id else set()
        self.tick = float(os.sysconf("SC_CLK_TCK"))
        # (pid, starttime) -> (CPU ticks, I/O bytes, ppid): a reused pid is another process.
        self.previous = None  # type: Optional[Dict[Tuple[int, int], Tuple[int, int, int]]]
        self.previous_at = 0.0
        # What a process's totals will grow by when it reaps children already counted.
        self.owed = {}  # type: Dict[Tuple[int, int], Tuple[int, int]]

    def processes(self) -> Dict[int, Tuple[int, int, int, int, List[str]]]:
        """pid -> (ppid, starttime, CPU ticks, I/O bytes, sessions it launches)."""
        found = {}  # type: Dict[int, Tuple[int, int, int, int, List[str]]]
        for pid, fd in own_processes(self.uid, self.proc):
            if pid == self.own_pid:
                continue
            try:
                if self.markers:
                    environ = read_at(fd, "environ").split(b"\0")
                    if not self.markers.intersection(environ):
                        continue
                stat = read_at(fd, "stat")
                # After the command's name, which may hold spaces and parentheses itself.
                fields = stat[stat.rindex(b")") + 1 :].split()
                ppid, start = int(fields[1]), int(fields[19])
                # With the children it waited for: the short-lived ones between two samples.
                ticks = sum(int(value) for value in fields[11:15])
                io = io_bytes(fd)
                sessions = argv_sessions(read_at(fd, "cmdline").split(b"\0"))
            except (OSError, ValueError, IndexError):
                continue
            found[pid] = (ppid, start, ticks, io, sessions)
        return found

    def sample(self) -> Optional[Report]:
        """What the job used since the last sample; None the first time (the baseline)."""
        now = time.monotonic()
        processes = self.processes()
        current = {(pid, info[1]): (info[2], info[3], info[0]) for pid, info in processes.items()}
        previous = self.previous
        span = now - self.previous_at
        self.previous, self.previous_at = current, now
        if previous is None:
            return None
        self.owe_for_ended(previous, current)
        used = {}  # type: Dict[int, Tuple[int, int]]
        children = {}  # type: Dict[int, List[int]]
        for pid, (ppid, start, ticks, io, _sessions) in processes.items():
            # A process new since the last sample started within the span: all of it counts.
            was = previous.get((pid, start), (0, 0, 0))
            owed = self.owed.pop((pid, start), (0, 0))
            grown = (max(0, ticks - was[0]), max(0, io - was[1]))
            used[pid] = (max(0, grown[0] - owed[0]), max(0, grown[1] - owed[1]))
            if owed[0] > grown[0] or owed[1] > grown[1]:  # children it has not reaped yet
                self.owed[(pid, start)] = (max(0, owed[0] - grown[0]), max(0, owed[1] - grown[1]))
            children.setdefault(ppid, []).append(pid)
        members = {}  # type: Dict[str, Set[int]]
        for pid, info in processes.items():
            for session in info[4]:
                # A set: a launcher's forked child holds the same argv, and counts once.
                tree = members.setdefault(session, set())
                todo = [pid]
                while todo:
                    at = todo.pop()
                    if at not in tree:
                        tree.add(at)
                        todo.extend(children.get(at, []))
        sessions = {
            session: (
                sum(used[pid][0] for pid in tree) / self.tick,
                sum(used[pid][1] for pid in tree),
            )
            for session, tree in members.items()
        }
        return Report(
            span,
            sum(ticks for ticks, _io in used.values()) / self.tick,
            sum(io for _ticks, io in used.values()),
            sessions,
        )

    def owe_for_ended(
        self,
        previous: Dict[Tuple[int, int], Tuple[int, int, int]],
        current: Dict[Tuple[int, int], Tuple[int, int, int]],
    ) -> None:
        """A child that ended was counted up to its last sample; its parent's totals grow by
        all of it (CPU and I/O both) once reaped, and only the rest is new."""
        alive = {pid: (pid, start) for pid, start in current}
        for key, (ticks, io, ppid) in previous.items():
            parent = alive.get(ppid)
            if key not in current and parent is not None and parent in previous:
                owed = self.owed.get(parent, (0, 0))
                self.owed[parent] = (owed[0] + ticks, owed[1] + io)
        for key in list(self.owed):
            if key not in current:
                del self.owed[key]


class Agent:
    def __init__(
        self,
        platform: Platform,
        identity: dict,
        interval: float,
        activity: Optional[JobActivity] = None,
    ) -> None:
        self.platform = platform
        self.identity = identity
        self.interval = interval
        self.connected = False
        self.activity = activity
        self.activity_interval = 0.0  # never, unless the platform asks
        self.activity_at = None  # type: Optional[float]
        self.unsent = None  # type: Optional[Report]
        # Short blips are retried quickly; a long outage is retried at the heartbeat interval.
        self.retry_delay = min(2.0, interval)
        # Seconds the platform, overloaded, said to wait before the next call (with jitter).
        self.backing_off = None  # type: Optional[float]

    def call(self, path: str, payload: dict) -> Optional[dict]:
        """The signed answer, or None when the call is to be retried; SystemExit on a signed
        order to stop."""
        try:
            answer = self.platform.post(path, payload)
        except Refused as exc:
            if exc.status == GONE:
                log("the platform ended this worker; exiting")
                raise SystemExit(0) from None
            if exc.status == FORBIDDEN:
                log("the platform refused this worker's key; exiting")
                raise SystemExit(3) from None
            if exc.status == NOT_YET:
                self.connected = False
            elif exc.retry_after is not None:
                # The platform shed the call: not an error of ours nor its, just too many at
                # once. Wait as told, plus jitter so the herd it sent away comes back spread.
                jitter = random.uniform(0, exc.retry_after / 2)  # noqa: S311 - no secret
                self.backing_off = exc.retry_after + jitter
                log("the platform is overloaded; next call in %.1f s" % self.backing_off)
            else:
                log("server answered %s; retrying" % exc)
            return None
        except (Unverified, OSError, ValueError, http.client.HTTPException) as exc:
            # Unverified: anyone on the way can answer anything; only signed answers count.
            # HTTPException: an answer cut off on the way (a proxy or relay that lost it).
            log("no answer from the platform at %s (%s); retrying" % (self.platform.base, exc))
            self.retry_delay = min(self.retry_delay * 2, self.interval)
            return None
        self.retry_delay = min(2.0, self.interval)
        return answer

    def delay(self) -> float:
        """Seconds until a call that is to be retried is sent again."""
        if self.backing_off is not None:
            delay, self.backing_off = self.backing_off, None
            return delay
        return self.retry_delay

    def beat(self) -> float:
        """Connect or beat; seconds until the next one."""
        if not self.connected:
            answer = self.call("/agent/v1/connect", self.identity)
            if answer is None:
                return self.delay()
            self.interval = float(answer.get("heartbeat_interval", self.interval))
            try:
                self.activity_interval = max(0.0, float(answer.get("activity_interval") or 0))
            except (TypeError, ValueError):
                self.activity_interval = 0.0
            self.connected = True
            log("connected as %s on %s" % (self.identity["worker"], self.identity["hostname"]))
        else:
            payload = {"worker": self.identity["worker"]}
            payload.update(self.activity_fields())
            if self.call("/agent/v1/heartbeat", payload) is None:
                return self.delay()
            if "span" in payload:
                self.unsent = None
        return self.interval

    def activity_fields(self) -> Dict[str, str]:
        """The job's activity report for this beat, when one is due; {} otherwise."""
        if self.activity is None or not self.activity_interval:
            return {}
        now = time.monotonic()
        if self.activity_at is not None and now - self.activity_at < self.activity_interval:
            return {}
        self.activity_at = now
        report = self.activity.sample()
        if report is None:  # the baseline
            return {}
        # A report the platform never got goes with the next one, its span added.
        self.unsent = report if self.unsent is None else merged(self.unsent, report)
        return report_fields(self.unsent)

    def report(self, ended: Set[str]) -> bool:
        sessions = sorted(ended)
        payload = {"worker": self.identity["worker"], "sessions": sessions}
        if self.call("/agent/v1/sessions/ended", payload) is None:
            return False
        log("reported the end of sessions %s" % ", ".join(sessions))
        return True


def main() -> int:
    worker = os.environ["ACTIVATE_WORKER_ID"]
    interval = float(os.environ.get("ACTIVATE_HEARTBEAT_INTERVAL", "30"))
    platform = Platform(
        os.environ["ACTIVATE_URL"],
        worker,
        os.environ["ACTIVATE_AGENT_KEY_ID"],
        os.environ["ACTIVATE_AGENT_KEY"],
        timeout=max(2.0, min(10.0, interval)),
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    identity = {
        "worker": worker,
        "hostname": socket.gethostname(),
        "job_id": os.environ.get("ACTIVATE_JOB_ID", ""),
    }
    activity = JobActivity(
        os.getuid(),
        os.environ.get("ACTIVATE_JOB_ID", ""),
        os.environ.get("ACTIVATE_JOB_VARIABLE", ""),
    )
    agent = Agent(platform, identity, interval, activity)
    watch = LauncherWatch(os.getuid())
    ended = set()  # type: Set[str]
    next_beat = next_report = 0.0
    while True:
        ended |= watch.ended()
        if agent.connected and ended and time.monotonic() >= next_report:
            # At once, not with the next beat, which stays as lean as it is.
            if agent.report(ended):
                ended.clear()
            else:
                next_report = time.monotonic() + agent.delay()
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + agent.beat()
        time.sleep(max(0.05, min(WATCH_EVERY, next_beat - time.monotonic())))


if __name__ == "__main__":
    sys.exit(main())
