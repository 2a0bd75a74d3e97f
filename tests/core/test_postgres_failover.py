"""The platform on PostgreSQL with a streaming standby, named as libpq's several hosts in
DATABASE_URL (``host1:port1,host2:port2/...?target_session_attrs=read-write``): the primary is
stopped at once mid-write, the standby promoted, and the platform's own database connection (a
process on the platform's settings, writing through Django every 0.1 s) serves again from the
promoted one, with every write it was told had committed there (the primary answers a commit
once the standby has it). The pair is scripts/standby.sh's own, never the machine's main
cluster; it is made again afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness import REPO

STANDBY_SH = REPO / "scripts" / "standby.sh"
PRIMARY, STANDBY = 5440, 5441
DATABASE = "activate_failover"
# Serving again after the promotion, at most (measured: see the test's output).
SERVES_WITHIN = 10.0

WRITER = """
import json, sys, time, django
django.setup()
from django.db import Error, connection

n = 0
while True:
    n += 1
    try:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO writes (n) VALUES (%s)", [n])
            cursor.execute("SELECT inet_server_port()")
            port = cursor.fetchone()[0]
        print(json.dumps({"t": time.monotonic(), "n": n, "port": port}), flush=True)
    except Error as exc:
        connection.close()
        print(json.dumps({"t": time.monotonic(), "n": n, "error": str(exc)[:200]}), flush=True)
    time.sleep(0.1)
"""


def pair(*argv: str) -> None:
    done = subprocess.run(["bash", str(STANDBY_SH), *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def psql(port: int, sql: str, database: str = "postgres") -> str:
    done = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            database,
            "-Atqc",
            sql,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def cluster(*argv: str) -> None:
    version = sorted(os.listdir("/usr/lib/postgresql"), key=int)[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, *argv], check=True)


@pytest.fixture
def standby_pair() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.fail("the standby pair is made as root (CI runs as root)")
    pair("up")
    psql(PRIMARY, f"DROP DATABASE IF EXISTS {DATABASE}")
    psql(PRIMARY, f"CREATE DATABASE {DATABASE}")
    psql(PRIMARY, "CREATE TABLE writes (n integer PRIMARY KEY)", DATABASE)
    yield
    pair("up")  # the pair again as it was: this test promoted the standby


def lines(process: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert process.stdout is not None
    for line in process.stdout:
        yield json.loads(line)


def test_after_the_primary_is_lost_and_the_standby_promoted_the_platform_writes_there(
    standby_pair: None,
) -> None:
    url = f"postgres://postgres@127.0.0.1:{PRIMARY},127.0.0.1:{STANDBY}/{DATABASE}"
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="activate.settings.test",
        DATABASE_URL=f"{url}?target_session_attrs=read-write&connect_timeout=2",
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        said = lines(writer)
        acknowledged: set[int] = set()
        for line in said:
            if line.get("port") == PRIMARY:
                acknowledged.add(line["n"])
            if len(acknowledged) >= 10:
                break
        assert acknowledged, "the writer never wrote to the primary"

        stopped_at = time.monotonic()
        cluster("activate_primary", "stop", "-m", "immediate")
        cluster("activate_standby", "promote")
        promoted_at = time.monotonic()
        errors = 0
        for line in said:
            if "error" in line:
                errors += 1
            elif line["port"] == PRIMARY:
                acknowledged.add(line["n"])
            elif line["port"] == STANDBY:
                served_after, outage = line["t"] - promoted_at, line["t"] - stopped_at
                break
            assert time.monotonic() - promoted_at < SERVES_WITHIN + 5, "never served again"
        print(
            f"served again {served_after:.2f} s after the promotion was done, "
            f"{outage:.2f} s after the primary stopped ({errors} writes refused meanwhile)"
        )
        assert served_after < SERVES_WITHIN
        stored = {int(n) for n in psql(STANDBY, "SELECT n FROM writes", DATABASE).split()}
        assert acknowledged <= stored, f"acknowledged but lost: {sorted(acknowledged - stored)}"
    finally:
        writer.kill()
        writer.wait()
