"""The broker down while requests arrive: each request with an Idempotency-Key answers 201 once,
its retry answers 200 with the same worker and makes none, and all are submitted once the broker
returns (the dispatch sweep picks up what could not be queued).

The broker is the drill's own redis-server (the platform's REDIS_URL), killed with its data
saved and started again from it.
"""

from __future__ import annotations

import time

from drills.drill import Drill, DrillResult, now, pause
from drills.servers import RedisServer
from harness.cluster import SshTarget
from harness.objects import CLUSTER_NAME, HELD_ENVIRONMENT, run_id

NAME = "The broker down while requests arrive"


def run(target: SshTarget, *, factor: float = 3.0, arriving: int = 5) -> DrillResult:
    from workers_app.models import Worker
    from workers_app.statuses import WorkerStatus

    S = WorkerStatus
    server: RedisServer | None = None
    try:
        with Drill("broker-outage", target, title=NAME) as drill:
            server = RedisServer(drill.platform.workdir)
            server.start()
            drill.platform.redis_url = server.url
            drill.platform.start_all()
            queued, connected = drill.settled(queued=2, connected=3)
            everyone = queued + connected
            timeout = drill.knob("ACTIVATE_HEARTBEAT_TIMEOUT")
            sweep = drill.knob("ACTIVATE_SWEEP_INTERVAL")
            outage = factor * timeout
            tag = run_id()
            body = {"cluster": CLUSTER_NAME, "environment": HELD_ENVIRONMENT, "params": {}}
            answers: dict[str, tuple[int, str, int, str]] = {}
            latencies: list[float] = []
            began = now()
            server.snapshot()
            down = time.monotonic()
            server.kill()
            with drill.platform.api(drill.key) as api:
                for i in range(arriving):
                    pause(outage / (arriving + 1))
                    key = f"drill-{tag}-{i}"
                    headers = {"Idempotency-Key": key}
                    started = time.monotonic()
                    first = api.post("/api/workers/", json=body, headers=headers)
                    latencies.append(time.monotonic() - started)
                    retry = api.post("/api/workers/", json=body, headers=headers)
                    answers[key] = (
                        first.status_code,
                        first.json().get("id", "") if first.status_code < 300 else "",
                        retry.status_code,
                        retry.json().get("id", "") if retry.status_code < 300 else "",
                    )
                pause(max(0.0, outage - (time.monotonic() - down)))
                statuses = drill.statuses(
                    Worker.objects.filter(idempotency_key__startswith=f"drill-{tag}-")
                )
                server.start()
                back = time.monotonic()
                down_for = back - down
                drill.result.repetitions = arriving
                firsts = sorted({a[0] for a in answers.values()})
                drill.check(firsts == [201], f"first answers during the outage: {firsts}")
                retries = sorted({a[2] for a in answers.values()})
                drill.check(retries == [200], f"retries during the outage answered {retries}")
                differ = [k for k, a in answers.items() if a[1] != a[3]]
                drill.check(not differ, f"retries answered another worker for {differ}")
                made = list(Worker.objects.filter(idempotency_key__startswith=f"drill-{tag}-"))
                drill.check(
                    len(made) == arriving,
                    f"{len(made)} workers made for {arriving} keys (each sent twice)",
                )
                drill.check(
                    all(s == S.PENDING for s in statuses.values()),
                    f"requests during the outage were not left pending: {statuses}",
                )
                submitted = drill.wait_status(made, {S.QUEUED}, timeout=120)
                took = time.monotonic() - back
                drill.check(
                    submitted,
                    f"not all submitted within 120 s of the broker's return: "
                    f"{drill.statuses(made)}",
                )
                counts = drill.job_counts(made)
                drill.check(all(n == 1 for n in counts.values()), f"jobs per worker: {counts}")
                # A retry after the return still finds the worker made during the outage.
                key, (_, first_id, _, _) = next(iter(answers.items()))
                late = api.post("/api/workers/", json=body, headers={"Idempotency-Key": key})
                drill.check(
                    late.status_code == 200 and late.json().get("id") == first_id,
                    f"a retry after the return answered {late.status_code}",
                )
            pause(max(0.0, timeout + 3 * sweep - (time.monotonic() - back)))
            changes = drill.changes_since(began, everyone)
            drill.check(not changes, f"status changed across the broker outage: {changes}")
            silent = drill.silent(connected)
            drill.check(not silent, f"heartbeats did not resume after the outage: {silent}")
            drill.note(
                f"{len(connected)} connected and {len(queued)} queued workers; broker down "
                f"{down_for:.1f} s; {arriving} requests with an Idempotency-Key arrived: first "
                f"answers {firsts} in {min(latencies):.2f}-{max(latencies):.2f} s, retries "
                f"{retries} with the same worker, {len(made)} workers made, all pending; all "
                f"queued {took:.1f} s after the broker returned, one job each; no status change"
            )
            result = drill.result
    finally:
        if server is not None:
            server.kill()
    return result
