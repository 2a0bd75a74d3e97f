"""Services a drill owns so that it may stop them: a redis-server and a PostgreSQL instance.

The machine's own PostgreSQL and Redis are shared with everyone's tests and are never stopped;
a drill that needs one of them down points the platform at an instance of its own.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from harness import HarnessError
from harness.platform import free_port
from harness.waiting import wait_until

PG_BIN = Path("/usr/lib/postgresql/15/bin")
SNAPSHOT = "snapshot.rdb"


class RedisServer:
    """A redis-server this drill owns on one port: started, killed, frozen, started again.

    It never writes a snapshot by itself (`--save ''`); ``snapshot`` writes one on demand and a
    start loads the last one written (none: it starts empty).
    """

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=5)

    def start(self) -> None:
        log = (self.workdir / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.workdir),
                "--dbfilename",
                SNAPSHOT,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if not wait_until(lambda: _pings(self.client()), timeout=20):
            raise HarnessError("the drill's redis-server did not start")

    def snapshot(self) -> None:
        """Write every key to the RDB file now (what the next start loads)."""
        self.client().save()

    def forget_snapshot(self) -> None:
        (self.workdir / SNAPSHOT).unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL: its port closes at once and nothing is saved."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def freeze(self) -> None:
        """SIGSTOP: the port stays open but nothing answers."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class PostgresServer:
    """A PostgreSQL 15 instance of the drill's own (initdb + pg_ctl as the postgres user, in a
    temporary directory, trust authentication on 127.0.0.1), removed by ``remove``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.datadir = Path(tempfile.mkdtemp(prefix="drill-pg-"))
        owner = pwd.getpwnam("postgres")
        os.chown(self.datadir, owner.pw_uid, owner.pw_gid)
        self.datadir.chmod(0o700)
        self._pg("initdb", "-D", str(self.datadir / "data"), "-A", "trust", "-U", "postgres")

    def _pg(self, tool: str, *argv: str) -> None:
        result = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / tool), *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise HarnessError(f"{tool} failed: {(result.stderr or result.stdout)[-500:]}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg(
            "pg_ctl",
            "-D",
            str(self.datadir / "data"),
            "-o",
            options,
            "-l",
            str(self.datadir / "postgres.log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        """A fast shutdown: clients are disconnected, the port closes."""
        self._pg("pg_ctl", "-D", str(self.datadir / "data"), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.datadir / "data"),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(self.datadir, ignore_errors=True)


@contextmanager
def django_on(server: PostgresServer, name: str = "activate_drills") -> Iterator[None]:
    """Point this process's Django (and so the platform the drill starts, which reads its
    settings) at ``server`` for a ``with`` block: the database created and migrated there."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    from harness.django_setup import ensure_database

    default = settings.DATABASES["default"]
    saved = (default["HOST"], default["PORT"], default["NAME"])
    ensure_database(f"postgres://postgres@127.0.0.1:{server.port}/{name}")
    connections["default"].close()
    for settings_dict in (default, connections["default"].settings_dict):
        settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", server.port
        settings_dict["NAME"] = name
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield
    finally:
        connections["default"].close()
        for settings_dict in (default, connections["default"].settings_dict):
            settings_dict["HOST"], settings_dict["PORT"], settings_dict["NAME"] = saved
