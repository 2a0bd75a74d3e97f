"""A host cut off, not killed: its PostgreSQL backend gives up a silent client, and the
submission lock it held (core/locks.py), within ACTIVATE_PEER_SILENCE, where TCP's defaults
would hold it for about two hours. Proven with a real process in a network namespace of this
machine whose link is dropped (harness/netns.py) while it holds the lock through the platform's
own database settings."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any

import pytest
from django.db import connection

from core.locks import LOCK_NAMESPACE
from core.transport.silence import PeerSilence, with_postgres_options
from harness import REPO
from harness.netns import cut_off_host

SILENCE = 6
WORKER_ID = 987_654_321

# Runs in the namespace: the platform's settings, the lock taken as submission takes it, then
# nothing but waiting (the process lives on: only its link is gone).
HOLDER = """
import sys, time, django
django.setup()
from core.locks import submission_lock
with submission_lock(int(sys.argv[1])) as taken:
    print("held" if taken else "refused", flush=True)
    time.sleep(600)
"""


def test_the_silence_sets_probes_and_a_limit_on_unanswered_data() -> None:
    silence = PeerSilence(30)
    assert (silence.idle, silence.interval, silence.user_timeout_ms) == (10, 3, 30_000)
    assert silence.idle + 3 * silence.interval <= silence.seconds  # probes end within it
    options = silence.libpq()
    assert options["keepalives"] == 1 and options["tcp_user_timeout"] == 30_000
    assert "-c tcp_keepalives_idle=10" in str(options["options"])


def test_what_the_operators_database_url_says_wins() -> None:
    silence = PeerSilence(30)
    merged = with_postgres_options(
        {"sslmode": "require", "keepalives_idle": 60, "options": "-c tcp_keepalives_idle=99"},
        silence,
    )
    assert merged["sslmode"] == "require" and merged["keepalives_idle"] == 60
    assert str(merged["options"]).endswith("-c tcp_keepalives_idle=99")  # the last -c wins
    behind_a_pooler = with_postgres_options({}, silence, server=False)
    assert "options" not in behind_a_pooler and behind_a_pooler["keepalives"] == 1


def lock_is_free() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_NAMESPACE, WORKER_ID])
        taken = bool(cursor.fetchone()[0])
        if taken:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_NAMESPACE, WORKER_ID])
    return taken


@pytest.mark.django_db(transaction=True)
def test_a_cut_off_hosts_submission_lock_is_freed_within_the_silence() -> None:
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs as root)")
    database: Any = connection.settings_dict
    with cut_off_host([int(database["PORT"] or 5432)]) as host:
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="activate.settings.test",
            DATABASE_URL=f"postgres://{database['USER']}@{host.address}:"
            f"{database['PORT'] or 5432}/{database['NAME']}",
            ACTIVATE_PEER_SILENCE=str(SILENCE),
        )
        holder = subprocess.Popen(
            host.argv([sys.executable, "-c", HOLDER, str(WORKER_ID)]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline().strip()
            assert line == "held", holder.stderr.read() if holder.stderr else line
            assert not lock_is_free()

            host.cut()
            cut_at = time.monotonic()
            assert not lock_is_free()  # not closed: the holder is silent, not gone
            while not lock_is_free():
                assert time.monotonic() - cut_at < SILENCE + 4, "still held past the silence"
                time.sleep(0.25)
            freed_after = time.monotonic() - cut_at
            print(f"freed {freed_after:.1f} s after the cut (silence {SILENCE} s)")
            assert holder.poll() is None  # the holder runs on, cut off
        finally:
            holder.kill()
            holder.wait()


# Runs in the namespace: the platform's SSH connection to the test cluster's sshd, connected,
# then watched until paramiko finds it dead.
SSH_WATCHER = """
import json, sys, time
from core.transport.silence import PeerSilence
from core.transport.connection import SSHConnection

host, port, user, key_path, host_key = sys.argv[1:6]
connection = SSHConnection(
    host=host, port=int(port), username=user, private_key=open(key_path).read(),
    host_key=host_key, connect_timeout=10, command_timeout=30, max_channels=2,
    silence=PeerSilence(int(sys.argv[6])),
)
print(json.dumps({"ran": connection.run(["echo", "up"]).stdout.strip()}), flush=True)
while connection.is_connected:
    time.sleep(0.1)
print(json.dumps({"gone": time.monotonic()}), flush=True)
"""


def test_a_cut_off_login_hosts_ssh_connection_ends_within_the_silence(ssh_target: Any) -> None:
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs as root)")
    with cut_off_host([ssh_target.port]) as host:
        argv = [sys.executable, "-c", SSH_WATCHER, host.address, str(ssh_target.port)]
        argv += [ssh_target.user, ssh_target.key_path, ssh_target.host_key, str(SILENCE)]
        watcher = subprocess.Popen(
            host.argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        try:
            assert watcher.stdout is not None
            first = watcher.stdout.readline()
            assert json.loads(first or "{}") == {"ran": "up"}, watcher.stderr.read()
            host.cut()
            cut_at = time.monotonic()
            ready, _, _ = select.select([watcher.stdout], [], [], SILENCE + 4)
            assert ready, "the connection was still up past the silence"
            gone_after = json.loads(watcher.stdout.readline())["gone"] - cut_at
            print(
                f"the SSH connection ended {gone_after:.1f} s after the cut (silence {SILENCE} s)"
            )
            assert 0 < gone_after < SILENCE + 4
        finally:
            watcher.kill()
            watcher.wait()


# Runs in the namespace: a browser's WebSocket to a terminal, opened, then left (it never
# sends "start"), as a laptop whose network went away would leave it.
BROWSER = """
import json, sys, time
from websockets.sync.client import connect

url, key = sys.argv[1], sys.stdin.readline().strip()  # never on a command line
ws = connect(url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=20)
print(json.dumps({"open": True}), flush=True)
time.sleep(600)
"""


def established(port: int) -> int:
    """Connections the server on ``port`` has open with a peer."""
    listed = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return len(listed.splitlines())


@pytest.mark.django_db(transaction=True)
def test_a_cut_off_browsers_websocket_is_ended_by_the_web_server_within_the_silence(
    tmp_path: Any, user: Any
) -> None:
    from harness.platform import Platform
    from tests.factories import WorkerFactory
    from workers_app.models import ApiKey
    from workers_app.statuses import WorkerStatus

    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs as root)")
    worker = WorkerFactory(owner=user, status=WorkerStatus.CONNECTED)
    _, key = ApiKey.issue(user, name="cut-off browser")
    web = Platform(workdir=tmp_path, knobs={"ACTIVATE_PEER_SILENCE": str(SILENCE)})
    # As scripts/start.sh runs it: the pings are its.
    web.start_deployed_web(workers=1, production=False)
    try:
        with cut_off_host([web.port]) as host:
            url = f"ws://127.0.0.1:{web.port}/ws/workers/{worker.public_id}/terminal/"
            browser = subprocess.Popen(
                host.argv([sys.executable, "-c", BROWSER, url]),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            try:
                assert browser.stdin is not None and browser.stdout is not None
                browser.stdin.write(key + "\n")
                browser.stdin.flush()
                first = browser.stdout.readline()
                assert json.loads(first or "{}") == {"open": True}, browser.stderr.read()
                assert established(web.port) == 1
                host.cut()
                cut_at = time.monotonic()
                while established(web.port):
                    assert time.monotonic() - cut_at < SILENCE + 4, "still open past the silence"
                    time.sleep(0.25)
                print(
                    f"the WebSocket ended {time.monotonic() - cut_at:.1f} s after the cut "
                    f"(silence {SILENCE} s)"
                )
                assert browser.poll() is None  # the browser runs on, cut off
            finally:
                browser.kill()
                browser.wait()
    finally:
        web.stop_all()
