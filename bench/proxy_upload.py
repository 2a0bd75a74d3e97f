"""Proxy upload: another session's requests, a bare request to the web server and heartbeats
while one session takes 64 MiB uploads through the same web server process, against the same
without them.

One real worker on the test Slurm and two JupyterLab sessions on it, reached through the web
server's session proxy (uvicorn, one process, so every request below meets the upload on one
event loop) and the owner's SSH channels. The upload is a real one: JupyterLab's
`PUT api/contents/<file>` with the file base64 in JSON, 64 MiB on the wire. Meanwhile a client
asks the other session for `api/status`, another asks the web server for a session that does not
exist (answered on the event loop: what it waits for is the loop), and the worker's own agent's
key signs heartbeats to the agents' server (another process, which no proxied byte passes
through: what they can lose is the machine's CPU). Rounds alternate quiet and upload, so
drift of a noisy machine falls on both sides.
"""

from __future__ import annotations

import base64
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.report import Goal, Outcome, Table, millis, percentile
from harness import HarnessError
from harness.agents import SignedAgent, signed_agent
from harness.cluster import SshTarget
from harness.objects import connected_worker_via_api, end_run, run_user, start_afresh
from harness.platform import NO_RECONCILE, Platform
from harness.waiting import wait_for

NAME = "proxy"
BODY = 64 * 1024 * 1024
CHUNK = 256 * 1024
FILE = "bench-proxy-upload.bin"
PROBES = ("other session", "bare request", "heartbeat")
RATES = {"other session": 10.0, "bare request": 20.0, "heartbeat": 20.0}
GOAL_STALL = 0.050


@dataclass
class Round:
    upload: bool
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    took: float = 0.0

    def p(self, probe: str, q: float) -> float:
        return percentile(self.latencies.get(probe, []), q)


def upload_body() -> tuple[bytes, int]:
    """JSON for Jupyter's contents API, BODY bytes long: a random file, base64."""
    frame = b'{"type":"file","format":"base64","content":""}'
    encoded = (BODY - len(frame)) // 4 * 4
    content = base64.b64encode(os.urandom(encoded // 4 * 3))
    body = frame[:-2] + content + frame[-2:]
    return body, encoded // 4 * 3


def _chunks(body: bytes) -> Iterator[bytes]:
    view = memoryview(body)
    for start in range(0, len(body), CHUNK):
        yield bytes(view[start : start + CHUNK])


def _session(api: httpx.Client, worker: str) -> dict[str, str]:
    answer = api.post(
        "/api/sessions/", json={"type": "jupyter", "cluster": "bench-slurm", "worker": worker}
    )
    if answer.status_code != 201:
        raise HarnessError(f"session request answered {answer.status_code}: {answer.text}")
    session: dict[str, str] = answer.json()

    def running() -> bool:
        shown = api.get(f"/api/sessions/{session['id']}/").json()
        if shown["status"] in ("failed", "ended"):
            raise HarnessError(f"the session ended: {shown.get('reason')}")
        return bool(shown["status"] == "running")

    wait_for(running, timeout=180)
    return session


def _probes(
    platform: Platform,
    key: str,
    other: dict[str, str],
    agents: list[SignedAgent],
    stop: threading.Event,
    into: Round,
) -> list[threading.Thread]:
    lock = threading.Lock()
    auth = {"Authorization": f"Bearer {key}"}

    def paced(probe: str, base: str, act: Callable[[httpx.Client], bool]) -> None:
        with httpx.Client(base_url=base, timeout=60) as client:
            interval = 1 / RATES[probe]
            due = time.perf_counter()
            while not stop.is_set():
                time.sleep(max(0.0, due - time.perf_counter()))
                due += interval
                started = time.perf_counter()
                ok = act(client)
                took = time.perf_counter() - started
                with lock:
                    into.latencies.setdefault(probe, []).append(took)
                    into.errors += not ok

    turn = [0]

    def beat(client: httpx.Client) -> bool:
        agent = agents[turn[0] % len(agents)]
        turn[0] += 1
        return agent.post(client, "/agent/v1/heartbeat").status_code == 200

    acts: list[tuple[str, str, Callable[[httpx.Client], bool]]] = [
        (
            "other session",
            platform.url,
            lambda c: c.get(other["url"] + "api/status", headers=auth).status_code == 200,
        ),
        # No such session and no credentials: the proxy answers it on the event loop.
        ("bare request", platform.url, lambda c: c.get("/s/0/").status_code == 302),
        ("heartbeat", platform.agent_url, beat),
    ]
    threads = [
        threading.Thread(target=paced, args=act, daemon=True, name=f"probe-{act[0]}")
        for act in acts
    ]
    for thread in threads:
        thread.start()
    return threads


def _round(
    platform: Platform,
    key: str,
    sessions: tuple[dict[str, str], dict[str, str]],
    agents: list[SignedAgent],
    body: bytes | None,
    quiet: float,
    uploads: int = 1,
) -> Round:
    target, other = sessions
    result = Round(upload=body is not None)
    stop = threading.Event()
    threads = _probes(platform, key, other, agents, stop, result)
    started = time.perf_counter()
    try:
        if body is None:
            time.sleep(quiet)
        else:
            with httpx.Client(timeout=300) as client:
                for _ in range(uploads):
                    answer = client.put(
                        f"{target['url']}api/contents/{FILE}",
                        content=_chunks(body),
                        headers={
                            "Authorization": f"Bearer {key}",
                            "Content-Type": "application/json",
                            "Content-Length": str(len(body)),
                        },
                    )
                    if answer.status_code not in (200, 201):
                        status, text = answer.status_code, answer.text[:300]
                        raise HarnessError(f"the upload answered {status}: {text}")
    finally:
        result.took = time.perf_counter() - started
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    return result


def run(target: SshTarget, *, rounds: int = 3, quiet: float = 8.0, uploads: int = 4) -> Outcome:
    from workers_app.models import ApiKey

    start_afresh(target)
    owner = run_user()
    _, key = ApiKey.issue(owner, name="bench-proxy")
    workdir = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    platform = Platform(workdir=workdir, knobs=dict(NO_RECONCILE), web_as_shipped=True)
    names: list[str] = []
    results: list[Round] = []
    body, file_size = upload_body()
    try:
        # One web server process: the probes and the upload share its event loop.
        platform.start_web(workers=1)
        platform.start_agents()
        platform.start_worker()
        platform.start_sweeper()
        platform.start_beat()
        with platform.api(key, timeout=60) as api:
            worker = connected_worker_via_api(api, names)
            sessions = (_session(api, worker.public_id), _session(api, worker.public_id))
            agent = wait_for(lambda: signed_agent(worker.public_id), timeout=30)
            if agent is None:
                raise HarnessError("the worker's agent was not found")
            agents = [agent]
            _round(platform, key, sessions, agents, None, 3)  # warm-up
            for number in range(rounds):
                for upload in (False, True):
                    payload = body if upload else None
                    result = _round(platform, key, sessions, agents, payload, quiet, uploads)
                    results.append(result)
                    print(
                        f"  proxy: round {number + 1}, {'upload' if upload else 'quiet'} "
                        f"({result.took:.1f} s): "
                        + ", ".join(f"{p} p99 {millis(result.p(p, 99))}" for p in PROBES),
                        flush=True,
                    )
            api.delete(f"{sessions[0]['url']}api/contents/{FILE}")
    finally:
        end_run(platform, target, names)
        ApiKey.objects.filter(user=owner).delete()
    return _outcome(results, file_size, uploads)


def _outcome(results: list[Round], file_size: int, uploads: int) -> Outcome:
    table = Table(
        "Proxy: 64 MiB upload through one session, others' latency on the same web process",
        ["round", "upload", "took", *(f"{p} p50 / p99" for p in PROBES), "errors"],
        align="llr" + "r" * len(PROBES) + "r",
    )
    for index, r in enumerate(results):
        table.add(
            index // 2 + 1,
            f"{uploads} x 64 MiB" if r.upload else "-",
            f"{r.took:.1f} s",
            *(f"{millis(r.p(p, 50))} / {millis(r.p(p, 99))}" for p in PROBES),
            r.errors,
        )
    quiet = [r for r in results if not r.upload]
    loaded = [r for r in results if r.upload]
    each = [r.took / uploads for r in loaded]
    table.notes += [
        f"upload: JupyterLab's PUT api/contents (a {file_size / 2**20:.0f} MiB file, base64 in "
        f"JSON: {BODY:,} bytes) through the web server's session proxy and the owner's SSH "
        f"channel to the node, {uploads} one after another per upload round; each took a "
        f"median {statistics.median(each):.1f} s ({BODY / 2**20 / statistics.median(each):.1f} "
        "MiB/s).",
        "probes: another JupyterLab session's api/status (API key, session lookup, a new SSH "
        f"channel) at {RATES['other session']:g}/s, GET /s/0/ with no credentials (answered on "
        f"the event loop) at {RATES['bare request']:g}/s, heartbeats signed with the "
        f"worker's own agent's key to the agents' server at {RATES['heartbeat']:g}/s.",
        "web server: scripts/start.sh web, one process (test settings); machine: 2 cores of a "
        "shared VM, "
        "the node, sshd, Jupyter and the load generator on the same cores.",
    ]
    errors = sum(r.errors for r in results)
    goals = []
    for probe in PROBES:
        without = statistics.median(r.p(probe, 99) for r in quiet)
        during = statistics.median(r.p(probe, 99) for r in loaded)
        goals.append(
            Goal(
                NAME,
                f"{probe} p99 during a 64 MiB upload within 50 ms of without",
                f"{millis(during)} vs {millis(without)} (median of rounds)"
                + (f"; {errors} probes failed in all" if errors else ""),
                during - without < GOAL_STALL and errors == 0,
            )
        )
    return Outcome(tables=[table], goals=goals)
