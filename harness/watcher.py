"""A neighbour watching every new process while tests run, and what the platform holds that the
neighbour must never find there.

``Watcher`` runs ``neighbour_watch.py`` as an ordinary second Unix user: it records the command
line of every process started on this machine (node, login host and platform host are one here)
and its environment where the kernel lets that user read it. ``SecretBook`` gathers what the
platform issued or holds: session passwords and what is derived from them, login cookies, SSH
private keys, the secret key, platform session keys, X cookies of running desktops (read as root
from their authority files), and the hashes it keeps of agent keys, API keys and tokens (a
token whose SHA-256 is one of them is that credential). ``leaks`` says which of them a record
shows.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO, HarnessError

SCRIPT = REPO / "harness" / "neighbour_watch.py"
MARKER = "activate-watch-marker"
# Where launchers make their private folders: /tmp, or a job's own TMPDIR under it (Grid Engine).
AUTHORITY_FILES = (
    "/tmp/activate-session-*/Xauthority",  # noqa: S108 - read, as root, where launchers write
    "/tmp/*/activate-session-*/Xauthority",  # noqa: S108 - likewise
)


def authority_files() -> list[Path]:
    """Every desktop's Xauthority now. A folder that goes while the glob reads it (a session's
    end, Chromium's temporary profile) ends that pattern's look for this time: the next look
    is 0.2 s later."""
    found: list[Path] = []
    for pattern in AUTHORITY_FILES:
        with suppress(OSError):
            found += Path("/").glob(pattern.lstrip("/"))
    return found


# Shorter values could turn up by chance in someone's command line.
SHORTEST_SECRET = 12
TOKEN = re.compile(r"[A-Za-z0-9_\-]{16,}")


@dataclass(frozen=True)
class Leak:
    kind: str
    pid: int
    uid: object
    where: str  # "argv" or "environ"
    shown: str  # the record with the secret masked

    def __str__(self) -> str:
        return f"{self.kind} in the {self.where} of pid {self.pid} (uid {self.uid}): {self.shown}"


@dataclass
class SecretBook:
    """Secrets by value and credentials by their SHA-256, each with what it is."""

    known: dict[str, str] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The neighbour's own processes' environments are theirs (tests start them from their own),
    # so only other users' count; the kernel refuses those unless something is wrong.
    neighbour_uid: int | None = None

    def add(self, value: str, kind: str) -> None:
        if len(value) >= SHORTEST_SECRET:
            with self.lock:
                self.known.setdefault(value, kind)

    def add_hash(self, digest: str, kind: str) -> None:
        """A secret known by its SHA-256 hex digest, whole or its first 40 digits (how the
        login-session table keeps its keys)."""
        if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", digest):
            with self.lock:
                self.hashes.setdefault(digest, kind)

    def add_private_key(self, pem: str, kind: str = "an SSH private key") -> None:
        for line in pem.splitlines():
            if len(line) >= 40 and not line.startswith("-----"):
                self.add(line.strip(), kind)

    def leaks(self, record: dict[str, object]) -> list[Leak]:
        found: list[Leak] = []
        for where in ("argv", "environ"):
            parts = record.get(where)
            if not isinstance(parts, list):
                continue
            if where == "environ" and record.get("uid") == self.neighbour_uid:
                continue
            text = "\0".join(str(p) for p in parts)
            with self.lock:
                known = list(self.known.items())
                hashes = dict(self.hashes)
            hits = [(value, kind) for value, kind in known if value in text]
            for token in set(TOKEN.findall(text)):
                digest = hashlib.sha256(token.encode()).hexdigest()
                kind = hashes.get(digest) or hashes.get(digest[:40])
                if kind:
                    hits.append((token, f"{kind} (by its hash)"))
            for value, kind in hits:
                shown = text.replace(value, "<" + kind + ">").replace("\0", " ")[:300]
                pid = int(str(record.get("pid", 0)))
                found.append(Leak(kind, pid, record.get("uid"), where, shown))
        return found


def x_cookies(paths: Iterable[Path]) -> Iterator[str]:
    """The MIT-MAGIC-COOKIE-1 values in X authority files (the format Xau reads: family, then
    address, display number, name and data, each a big-endian length and its bytes)."""
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        offset = 2
        with suppress(IndexError, ValueError):
            while offset < len(data):
                fields = []
                for _ in range(4):
                    length = int.from_bytes(data[offset : offset + 2], "big")
                    fields.append(data[offset + 2 : offset + 2 + length])
                    offset += 2 + length
                if fields[2] == b"MIT-MAGIC-COOKIE-1":
                    yield fields[3].hex()
                offset += 2  # the next entry's family


def gather_platform_secrets(book: SecretBook) -> None:
    """What the platform's database and Redis hold, added to ``book`` (the caller may touch the
    database)."""
    from django.conf import settings
    from django.contrib.sessions.models import Session as PlatformSession

    from core.keystore import decrypt_private_key
    from core.redis_connection import redis_client
    from sessions_app.models import Session
    from workers_app.models import ApiKey, Cluster, ClusterAccount, Worker

    book.add(settings.SECRET_KEY, "the platform's secret key")
    for session in Session.objects.all():
        secret = session.secret()
        if secret:
            book.add(secret, "a session's password")
            book.add(hashlib.sha256(secret.encode()).hexdigest(), "a session's password hash")
        with suppress(Exception):
            book.add(session.login_cookie(), "a session's login cookie")
    for stored in PlatformSession.objects.values_list("session_key", flat=True):
        book.add_hash(stored, "a platform session key")
    for digest in Worker.objects.exclude(agent_secret_hash="").values_list(
        "agent_secret_hash", flat=True
    ):
        book.add_hash(digest, "an agent key")
    for digest in ApiKey.objects.values_list("key_hash", flat=True):
        book.add_hash(digest, "an API key")
    for holder in list(Cluster.objects.all()) + list(ClusterAccount.objects.all()):
        with suppress(Exception):
            book.add_private_key(holder.private_key())
    for encrypted in Cluster.objects.exclude(ca_private_key_encrypted="").values_list(
        "ca_private_key_encrypted", flat=True
    ):
        with suppress(Exception):
            book.add_private_key(decrypt_private_key(encrypted), "a cluster's SSH CA key")
    for name in redis_client().scan_iter(match="activate:*", count=1000):
        for part in (name.decode() if isinstance(name, bytes) else str(name)).split(":"):
            book.add_hash(part, "a credential Redis keeps by its hash")


class Watcher:
    """``neighbour_watch.py`` as ``user``, and the records it wrote, read as they come."""

    def __init__(self, user: str, out: Path) -> None:
        self.user = user
        self.out = out
        self.offset = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.book = SecretBook()
        self._stop = threading.Event()
        self._scanner: threading.Thread | None = None

    def start(self) -> Watcher:
        self.out.write_text("")
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), self.user, str(self.out)],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while '"started"' not in self.out.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                error = self.process.stderr.read().decode() if self.process.stderr else ""
                raise HarnessError(f"the neighbour's process watcher did not start: {error}")
            time.sleep(0.05)
        started = json.loads(self.out.read_text().splitlines()[0])
        if started["uid"] == 0:
            raise HarnessError("the neighbour's process watcher runs as root")
        self.book.neighbour_uid = started["uid"]
        self._scanner = threading.Thread(target=self._scan_x_cookies, daemon=True)
        self._scanner.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def _scan_x_cookies(self) -> None:
        while not self._stop.wait(0.2):
            for cookie in x_cookies(authority_files()):
                self.book.add(cookie, "an X cookie")

    def mark(self) -> int:
        """Where the records end now: every process started before this call is before it."""
        text = f"{time.monotonic_ns()}"
        holder = subprocess.Popen(
            ["sh", "-c", "read line", "sh", MARKER, text], stdin=subprocess.PIPE
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                with self.out.open() as records:
                    records.seek(self.offset)
                    data = records.read()
                end = data.find(f'{{"marker": "{text}"}}')
                if end >= 0:
                    self.offset += end
                    return self.offset
                if time.monotonic() > deadline:
                    raise HarnessError("the neighbour's process watcher fell behind by 10 s")
                time.sleep(0.02)
        finally:
            holder.communicate(b"\n", timeout=10)

    def records(self, start: int, end: int) -> list[dict[str, object]]:
        with self.out.open() as records:
            records.seek(start)
            data = records.read(end - start)
        found = []
        for line in data.splitlines():
            with suppress(ValueError):
                record = json.loads(line)
                if "pid" in record:
                    found.append(record)
        return found

    def leaks_between(self, start: int, end: int) -> list[Leak]:
        return [leak for record in self.records(start, end) for leak in self.book.leaks(record)]

    def seen(self, start: int, end: int) -> tuple[int, int]:
        """Processes recorded between two marks, and how many of them ended before being read."""
        records = self.records(start, end)
        return len(records), sum(1 for r in records if r.get("argv") is None)
