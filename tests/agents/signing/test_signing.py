"""Signing on both sides: the node agent's (standard library, imported as a module) and the
platform's agree; a request is good once, within its window, for its worker only; and the agent
acts only on answers the platform signed."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.test import override_settings

from agents import signing
from agents.service import AgentRefused
from node import activate_agent
from workers_app import agent_keys

PATH = "/agent/v1/heartbeat"
BODY = b'{"worker": "wabc"}'


@pytest.fixture
def key() -> agent_keys.AgentKey:
    return agent_keys.issue_agent_key("wabc")


def agent_header(key: agent_keys.AgentKey, *, ts: int | None = None, nonce: str = "") -> str:
    return activate_agent.authorization(
        "wabc", key.key_id, key.key, "POST", PATH, BODY,
        str(int(time.time()) if ts is None else ts), nonce or activate_agent.new_nonce(),
    )  # fmt: skip


def test_the_platform_derives_the_key_again_and_keeps_only_its_hash(
    key: agent_keys.AgentKey,
) -> None:
    assert agent_keys.derive_key("wabc", key.key_id) == key.key
    assert key.key not in key.key_hash and len(key.key_hash) == 64
    assert agent_keys.derive_key("wxyz", key.key_id) != key.key  # another worker's id
    with override_settings(SECRET_KEY="another-platform-" * 4):
        assert agent_keys.derive_key("wabc", key.key_id) != key.key


def test_a_request_the_agent_signed_is_verified_by_the_platform(key: agent_keys.AgentKey) -> None:
    call = signing.verify_request(agent_header(key), "POST", PATH, BODY, now=time.time())
    assert (call.worker, call.key_id, call.key_hash) == ("wabc", key.key_id, key.key_hash)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", PATH, BODY), ("POST", "/agent/v1/connect", BODY), ("POST", PATH, b'{"w": 1}')],
)
def test_a_signature_is_good_for_its_own_method_path_and_body_only(
    key: agent_keys.AgentKey, method: str, path: str, body: bytes
) -> None:
    with pytest.raises(AgentRefused) as refused:
        signing.verify_request(agent_header(key), method, path, body, now=time.time())
    assert (refused.value.status, refused.value.message) == (401, "bad signature")


@pytest.mark.parametrize("skew", [-61, 61, -3600])
def test_a_request_outside_the_window_is_refused(key: agent_keys.AgentKey, skew: int) -> None:
    header = agent_header(key, ts=int(time.time()) + skew)
    with pytest.raises(AgentRefused) as refused:
        signing.verify_request(header, "POST", PATH, BODY, now=time.time())
    # Refused for its time alone: a 425 whose answer carries the platform's time
    assert refused.value.status == 425 and "window" in refused.value.message
    assert "server_time" in refused.value.answer()


def test_the_window_is_a_setting(key: agent_keys.AgentKey) -> None:
    header = agent_header(key, ts=int(time.time()) - 100)
    with override_settings(ACTIVATE_AGENT_SIGNATURE_WINDOW=300):
        signing.verify_request(header, "POST", PATH, BODY, now=time.time())


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer some-secret",
        "Basic d2FiYzpzZWNyZXQ=",
        "ActivateHMAC worker=wabc",
        "ActivateHMAC worker=wabc, key=k, ts=1, nonce=n, sig=s, extra=1",
        "ActivateHMAC worker=../x, key="
        + "k" * 24
        + ", ts=1, nonce="
        + "n" * 32
        + ", sig="
        + "0" * 64,
    ],
)
def test_anything_but_a_well_formed_signature_is_a_401(header: str) -> None:
    with pytest.raises(AgentRefused) as refused:
        signing.verify_request(header, "POST", PATH, BODY, now=time.time())
    assert refused.value.status == 401


@pytest.mark.django_db
def test_a_nonce_is_accepted_once(key: agent_keys.AgentKey) -> None:
    call = signing.verify_request(agent_header(key), "POST", PATH, BODY, now=time.time())
    signing.consume_nonce(call)
    with pytest.raises(AgentRefused) as refused:
        signing.consume_nonce(call)
    assert (refused.value.status, refused.value.message) == (401, "replayed request")
    assert signing.nonce_of(call).ttl > 2 * 60


@pytest.mark.django_db
def test_a_request_held_back_and_sent_after_a_later_one_is_refused(
    key: agent_keys.AgentKey,
) -> None:
    # Given two requests of one agent, the earlier held back on the way
    now = int(time.time())
    held, later = (agent_header(key, ts=now - 2), agent_header(key, ts=now - 1))
    call = signing.verify_request(later, "POST", PATH, BODY, now=time.time())
    signing.consume_nonce(call)
    # When the held one arrives after the later was accepted, then it is refused
    held_call = signing.verify_request(held, "POST", PATH, BODY, now=time.time())
    with pytest.raises(AgentRefused) as refused:
        signing.consume_nonce(held_call)
    assert refused.value.status == 401
    # while another request of the same time (and its own nonce) is accepted
    signing.consume_nonce(
        signing.verify_request(agent_header(key, ts=now - 1), "POST", PATH, BODY, now=time.time())
    )


@pytest.mark.django_db
def test_requests_of_one_time_are_each_accepted_once_and_later_ones_keep_no_nonce(
    key: agent_keys.AgentKey,
) -> None:
    from core.redis_connection import redis_client

    now = int(time.time())
    first, second = (
        signing.verify_request(agent_header(key, ts=now), "POST", PATH, BODY, now=time.time())
        for _ in range(2)
    )
    for call in (first, second):
        signing.consume_nonce(call)
    for call in (first, second):  # each replayed: the first is the latest, the second has a key
        with pytest.raises(AgentRefused):
            signing.consume_nonce(call)
    # An agent's strictly later request costs no key of its own: only the latest is kept.
    later = signing.verify_request(agent_header(key, ts=now + 1), "POST", PATH, BODY, now=now)
    signing.consume_nonce(later)
    assert not redis_client().exists(signing.nonce_of(later).key)
    assert redis_client().exists(signing.nonce_of(second).key)
    with pytest.raises(AgentRefused):
        signing.consume_nonce(first)


def test_the_agents_timestamps_go_strictly_up_in_microseconds(key: agent_keys.AgentKey) -> None:
    platform = activate_agent.Platform("http://127.0.0.1:9", "wabc", key.key_id, key.key, 1)
    seen = []
    for _ in range(3):
        try:
            platform.post(PATH, {"worker": "wabc"})
        except OSError:
            pass
        seen.append(platform.last_ts)
    assert seen == sorted(set(seen))


def test_the_agent_verifies_the_platforms_answer_for_its_own_nonce_only(
    key: agent_keys.AgentKey,
) -> None:
    nonce = activate_agent.new_nonce()
    call = signing.verify_request(
        agent_header(key, nonce=nonce), "POST", PATH, BODY, now=time.time()
    )
    body = b'{"error": "worker is stopped"}'
    signature = signing.sign_answer(call, 410, body)
    assert activate_agent.verified(key.key, 410, nonce, body, signature)
    assert not activate_agent.verified(key.key, 403, nonce, body, signature)
    assert not activate_agent.verified(key.key, 410, activate_agent.new_nonce(), body, signature)
    assert not activate_agent.verified(key.key, 410, nonce, b"{}", signature)
    assert not activate_agent.verified(key.key, 410, nonce, body, "")


# -- the agent against a server of the test's own (real HTTP) ---------------------------------


class Answers:
    """What the little server answers next: a status, and whether it signs with the key."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.status = 200
        self.signed = True
        self.forged = False
        self.requests: list[dict[str, str]] = []


@pytest.fixture
def server(key: agent_keys.AgentKey) -> Iterator[tuple[str, Answers]]:
    answers = Answers(key.key)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            header = self.headers["Authorization"]
            answers.requests.append({"path": self.path, "authorization": header})
            nonce = header.split("nonce=")[1].split(",")[0]
            body = json.dumps({"status": "ok", "heartbeat_interval": 1}).encode()
            self.send_response(answers.status)
            self.send_header("Location", "/elsewhere")
            if answers.signed:
                signer = "0" * 64 if answers.forged else answers.key
                sig = activate_agent.answer_signature(signer, answers.status, nonce, body)
                self.send_header(activate_agent.SIGNATURE_HEADER, sig)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            answers.requests.append({"path": self.path, "authorization": ""})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    httpd.shutdown()
    httpd.server_close()


def agent_for(url: str, key: agent_keys.AgentKey) -> activate_agent.Agent:
    platform = activate_agent.Platform(url, "wabc", key.key_id, key.key, timeout=5)
    identity = {"worker": "wabc", "hostname": "n1", "job_id": "1"}
    return activate_agent.Agent(platform, identity, interval=1.0)


def test_the_agent_never_puts_its_key_on_the_wire(
    server: tuple[str, Answers], key: agent_keys.AgentKey
) -> None:
    url, answers = server
    agent = agent_for(url, key)
    agent.beat()
    agent.beat()
    assert [r["path"] for r in answers.requests] == ["/agent/v1/connect", "/agent/v1/heartbeat"]
    assert all(key.key not in r["authorization"] for r in answers.requests)
    assert all(r["authorization"].startswith("ActivateHMAC ") for r in answers.requests)


@pytest.mark.parametrize("status", [403, 410, 409, 500, 302])
@pytest.mark.parametrize("forged", [False, True])
def test_an_answer_not_signed_by_the_platform_is_retried_whatever_its_status(
    server: tuple[str, Answers], key: agent_keys.AgentKey, status: int, forged: bool
) -> None:
    url, answers = server
    agent = agent_for(url, key)
    agent.beat()
    answers.status, answers.signed, answers.forged = status, forged, forged
    assert agent.beat() == agent.retry_delay  # no exit: tried again shortly
    assert agent.connected
    assert "/elsewhere" not in [r["path"] for r in answers.requests]  # nor sent elsewhere


@pytest.mark.parametrize(("status", "code"), [(410, 0), (403, 3)])
def test_only_a_signed_403_or_410_ends_the_agent(
    server: tuple[str, Answers], key: agent_keys.AgentKey, status: int, code: int
) -> None:
    url, answers = server
    agent = agent_for(url, key)
    agent.beat()
    answers.status = status
    with pytest.raises(SystemExit) as ended:
        agent.beat()
    assert ended.value.code == code


def test_the_agent_runs_on_from_an_unsigned_403_as_a_process(
    server: tuple[str, Answers], key: agent_keys.AgentKey
) -> None:
    # The agent as the job runs it: answered 403 unsigned from the start, it keeps asking.
    url, answers = server
    answers.status, answers.signed = 403, False
    environ = {
        **os.environ,
        "ACTIVATE_URL": url,
        "ACTIVATE_WORKER_ID": "wabc",
        "ACTIVATE_AGENT_KEY_ID": key.key_id,
        "ACTIVATE_AGENT_KEY": key.key,
        "ACTIVATE_HEARTBEAT_INTERVAL": "0.2",
    }
    process = subprocess.Popen(
        [sys.executable, activate_agent.__file__], env=environ, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 10
        while len(answers.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None and len(answers.requests) >= 3
        answers.signed = True  # the platform's own 403 now
        assert process.wait(timeout=10) == 3
    finally:
        process.kill()
        process.wait()


# -- the launcher watch ------------------------------------------------------------------------


def fake_process(proc: Path, pid: int, argv: list[str], uid: int) -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    os.chown(proc / str(pid), uid, -1)


LAUNCHER = ["python3", "-c", "...", "desktop", "--activate-session"]


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a directory to another user")
def test_the_watch_counts_its_own_users_launchers_only_and_reports_the_gone(
    tmp_path: Path,
) -> None:
    me, neighbour = os.getuid(), pwd.getpwnam("pwbob").pw_uid
    fake_process(tmp_path, 10, [*LAUNCHER, "saaaa"], me)
    fake_process(tmp_path, 11, [*LAUNCHER, "sbbbb", "--port", "0"], me)
    fake_process(tmp_path, 12, [*LAUNCHER, "scccc"], neighbour)  # a neighbour's lookalike
    fake_process(tmp_path, 13, ["bash", "--activate-session"], me)  # no id after it
    watch = activate_agent.LauncherWatch(me, str(tmp_path))
    assert activate_agent.launcher_sessions(me, str(tmp_path)) == {"saaaa", "sbbbb"}
    assert watch.ended() == set()

    (tmp_path / "11" / "cmdline").unlink()
    (tmp_path / "11").rmdir()
    os.chown(tmp_path / "10", neighbour, -1)  # not ours any more: as good as gone
    assert watch.ended() == {"saaaa", "sbbbb"}
    assert watch.ended() == set()  # each is reported once
