#!/usr/bin/env python3
"""ACTIVATE node agent: tells the platform this node is up, then heartbeats until told to stop.

Standard library only, Python 3.6+, so it runs on whatever Python 3 a compute node has.
Configuration comes from the environment the job script sets:
ACTIVATE_URL, ACTIVATE_WORKER_ID, ACTIVATE_AGENT_KEY_ID, ACTIVATE_AGENT_KEY,
ACTIVATE_HEARTBEAT_INTERVAL, and ACTIVATE_JOB_ID (the job's id, copied by the script from
wherever its scheduler puts it).

The key never leaves the node: every request carries an HMAC of its method, path, timestamp,
nonce and body, and every answer must carry the platform's HMAC of its status, that nonce and
its body. Whoever sits on the way (a neighbour holding the relay's port, or reading the plain
HTTP between node and login host) can neither make a request count twice nor answer in the
platform's name: an answer that is not signed is a network error, retried, whatever its status.

It also watches the launchers of its sessions (processes of its own user whose argv holds
``--activate-session ID``) and tells the platform at once when one is gone.

Exit codes: 0 the platform ended the worker (or SIGTERM), 3 the platform refused this key.
"""

import hashlib
import hmac
import http.client
import json
import os
import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from binascii import hexlify
from typing import Optional, Set

GONE, FORBIDDEN, NOT_YET = 410, 403, 409
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
    """A signed answer other than success."""

    def __init__(self, status: int) -> None:
        super().__init__("HTTP %d" % status)
        self.status = status


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


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other (unsigned): not followed anywhere."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


OPENER = urllib.request.build_opener(NoRedirects)


class Platform:
    """Signed calls to the platform's agent endpoints (directly or through a relay)."""

    def __init__(self, base: str, worker: str, key_id: str, key: str, timeout: float) -> None:
        self.base = base.rstrip("/")
        self.worker = worker
        self.key_id = key_id
        self.key = key
        self.timeout = timeout
        self.last_ts = 0  # microseconds

    def post(self, path: str, payload: dict) -> dict:
        """The signed answer's JSON; Refused for a signed refusal, Unverified for any answer
        the platform did not sign, OSError and friends when nothing came back."""
        body = json.dumps(payload).encode()
        nonce = new_nonce()
        # Each request later than the last, even if the clock steps back: the platform refuses
        # one older than a request it accepted (one held back on the way and sent later).
        self.last_ts = max(int(time.time() * 1000000), self.last_ts + 1)
        ts = "%d.%06d" % divmod(self.last_ts, 1000000)
        header = authorization(self.worker, self.key_id, self.key, "POST", path, body, ts, nonce)
        request = urllib.request.Request(
            self.base + path,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": header},
        )
        try:
            with OPENER.open(request, timeout=self.timeout) as response:
                status, answer = response.status, response.read()
                signature = response.headers.get(SIGNATURE_HEADER, "")
        except urllib.error.HTTPError as exc:
            status, answer = exc.code, exc.read()
            signature = exc.headers.get(SIGNATURE_HEADER, "") if exc.headers else ""
        if not verified(self.key, status, nonce, answer, signature):
            raise Unverified(status)
        if status != 200:
            raise Refused(status)
        return json.loads(answer.decode() or "{}")


def launcher_sessions(uid: int, proc: str = "/proc") -> Set[str]:
    """Ids of sessions whose launcher runs as ``uid``: processes of that uid (the owner of
    /proc/<pid>; others' processes are never read) whose argv holds --activate-session ID."""
    found = set()  # type: Set[str]
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            if os.stat(os.path.join(proc, pid)).st_uid != uid:
                continue
            with open(os.path.join(proc, pid, "cmdline"), "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        for at in range(len(argv) - 1):
            if argv[at] == SESSION_FLAG:
                session = argv[at + 1].decode("ascii", "replace")
                if SESSION_ID.match(session):
                    found.add(session)
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


class Agent:
    def __init__(self, platform: Platform, identity: dict, interval: float) -> None:
        self.platform = platform
        self.identity = identity
        self.interval = interval
        self.connected = False
        # Short blips are retried quickly; a long outage is retried at the heartbeat interval.
        self.retry_delay = min(2.0, interval)

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

    def beat(self) -> float:
        """Connect or beat; seconds until the next one."""
        if not self.connected:
            answer = self.call("/agent/v1/connect", self.identity)
            if answer is None:
                return self.retry_delay
            self.interval = float(answer.get("heartbeat_interval", self.interval))
            self.connected = True
            log("connected as %s on %s" % (self.identity["worker"], self.identity["hostname"]))
        elif self.call("/agent/v1/heartbeat", {"worker": self.identity["worker"]}) is None:
            return self.retry_delay
        return self.interval

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
    agent = Agent(platform, identity, interval)
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
                next_report = time.monotonic() + agent.retry_delay
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + agent.beat()
        time.sleep(max(0.05, min(WATCH_EVERY, next_beat - time.monotonic())))


if __name__ == "__main__":
    sys.exit(main())
