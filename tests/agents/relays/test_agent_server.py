"""Agents have a server of their own: users' requests can hold every thread of the web server
and heartbeats still land, and the agents' server is no second door into the platform."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client

from core.redis_connection import redis_client
from harness.agents import agent_pids
from harness.cluster import SshTarget
from harness.platform import FAST_KNOBS, Platform
from harness.waiting import wait_for
from workers_app.actions import deletion, requests
from workers_app.liveness import PREFIX
from workers_app.models import Environment, EnvironmentField, Worker
from workers_app.statuses import WorkerStatus

S = WorkerStatus
HEARTBEAT_INTERVAL = float(FAST_KNOBS["ACTIVATE_HEARTBEAT_INTERVAL"])
HEARTBEAT_TIMEOUT = float(FAST_KNOBS["ACTIVATE_HEARTBEAT_TIMEOUT"])
NOT_AGENT_PATHS = ["/", "/health/", "/admin/", "/admin/login/", "/api/workers/", "/api/schema/"]


@pytest.fixture
def agent_server(settings: Any) -> None:
    """This process's URLs as `scripts/start.sh agents` sets them."""
    settings.ROOT_URLCONF = "activate.agent_server_urls"


@pytest.mark.django_db
@pytest.mark.parametrize("path", NOT_AGENT_PATHS)
def test_the_agents_server_answers_404_on_every_path_but_the_agents(
    agent_server: None, admin_client: Client, path: str
) -> None:
    assert admin_client.get(path).status_code == 404
    assert admin_client.post(path, {}).status_code == 404


@pytest.mark.django_db
def test_the_agents_server_serves_the_agents_endpoints(agent_server: None, client: Client) -> None:
    assert client.get("/agent/v1/ping").json() == {"status": "ok"}
    refused = client.post("/agent/v1/heartbeat", {"worker": "abc"}, content_type="application/json")
    assert refused.status_code == 401  # reached the view: not signed
    assert client.post("/agent/v1/connect", {}, content_type="application/json").status_code == 401


# -- live: the real web and agents' servers, Celery, Slurm over SSH ----------------------------


@pytest.fixture
def slurm_environment(transactional_db: None, make_cluster, ssh_target: SshTarget) -> Environment:
    environment = Environment.objects.create(
        cluster=make_cluster(), name="compute", partition=ssh_target.partition
    )
    EnvironmentField.objects.create(
        environment=environment, name="walltime", directive="--time={value}", default="00:10:00"
    )
    return environment


@pytest.fixture
def small_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    """The web server as deployed but with one worker of one thread, easy to fill."""
    platform = Platform(workdir=tmp_path)
    try:
        platform.start_deployed_web(workers=1, threads=1)
        platform.start_agents()
        platform.start_worker()
        platform.start_sweeper()
        platform.start_beat()
        yield platform
    finally:
        platform.stop_all()


def hold(url: str, connections: int) -> list[socket.socket]:
    """Form posts that never finish their body: the CSRF check reads it, so each keeps one of
    the web server's page threads waiting."""
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(connections):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(
            b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: csrftoken=" + b"a" * 32 + b"\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n"
            b"\r\nusername="
        )
        held.append(sock)
    return held


def web_answers(platform: Platform) -> bool:
    try:
        return httpx.get(f"{platform.url}/health/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_connected(worker: Worker, platform: Platform) -> None:
    try:
        wait_for(lambda: (worker.refresh_from_db() or worker.status) == S.CONNECTED, timeout=120)
    except TimeoutError:
        pytest.fail(f"worker stayed {worker.status} ({worker.status_reason})\n{platform.logs()}")


@pytest.mark.slurm
@pytest.mark.live
def test_heartbeats_land_on_the_agents_server_while_the_web_servers_threads_are_all_busy(
    small_platform: Platform, slurm_environment: Environment, user
) -> None:
    platform = small_platform
    worker = requests.request_worker(
        owner=user, cluster=slurm_environment.cluster.name, environment=slurm_environment.name
    )
    wait_connected(worker, platform)
    # The job script gave its agent the agents' server, not the web server.
    pids = agent_pids(worker.public_id)
    assert pids
    environ = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
    assert f"ACTIVATE_URL={platform.agent_url}".encode() in environ

    held = hold(platform.url, connections=3)
    try:
        assert not web_answers(platform), "the web server still answers: it is not held"
        # Longer than the heartbeat timeout: a worker that could not beat would be lost by now.
        ttls = []
        deadline = time.monotonic() + HEARTBEAT_TIMEOUT + 4
        while time.monotonic() < deadline:
            ttls.append(redis_client().pttl(f"{PREFIX}{worker.pk}"))
            time.sleep(0.25)
        still_held = not web_answers(platform)
    finally:
        for sock in held:
            sock.close()

    assert still_held
    # Every sample finds the liveness key refreshed within about one beat interval.
    assert min(ttls) > (HEARTBEAT_TIMEOUT - 2 * HEARTBEAT_INTERVAL - 1) * 1000, ttls
    worker.refresh_from_db()
    assert worker.status == S.CONNECTED
    for path in NOT_AGENT_PATHS:
        assert httpx.get(f"{platform.agent_url}{path}", timeout=5).status_code == 404, path

    deletion.delete_worker(worker)
    wait_for(lambda: (worker.refresh_from_db() or worker.status) == S.STOPPED, timeout=60)
