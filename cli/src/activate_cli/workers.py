"""pw workers create|ls|get|delete."""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import quote

from activate_cli.client import ApiClient
from activate_cli.errors import CliError, Interrupted, NotFound, UsageError
from activate_cli.output import cell, emit, idle_for, pairs, table, when
from activate_cli.params import add_idle_option, add_param_option
from activate_cli.saved import not_found as saved_not_found
from activate_cli.saved import saved_path
from activate_cli.statuses import (
    CONNECTED,
    ERROR,
    FINISHED,
    ON_A_NODE,
    QUEUED,
    STATUSES,
    STOPPED,
    STOPPING,
)
from activate_cli.waiting import poll

ENDINGS = {ERROR: "failed", STOPPED: "stopped", STOPPING: "is being stopped"}

Worker = dict[str, Any]


def worker_path(worker_id: str) -> str:
    return f"/workers/{quote(worker_id, safe='')}/"


def not_found(worker_id: str) -> str:
    return f"worker {worker_id} not found"


def render_worker(worker: Worker) -> str:
    params = ", ".join(f"{k}={v}" for k, v in sorted((worker.get("params") or {}).items()))
    return pairs(
        [
            ("ID", cell(worker["id"])),
            ("Name", cell(worker.get("name"))),
            ("Cluster", cell(worker.get("cluster"))),
            ("Environment", cell(worker.get("environment"))),
            ("Status", cell(worker.get("status"))),
            ("Reason", cell(worker.get("status_reason"))),
            ("Node", cell(worker.get("node_hostname"))),
            ("Job ID", cell(worker.get("scheduler_job_id"))),
            ("Job state", cell(worker.get("scheduler_state"))),
            ("Exit code", cell(worker.get("exit_code"))),
            ("Params", cell(params)),
            ("Created", when(worker.get("created_at"))),
            ("Submitted", when(worker.get("submitted_at"))),
            ("Connected", when(worker.get("connected_at"))),
            ("Finished", when(worker.get("finished_at"))),
            ("Idle policy", policy(worker.get("idle_minutes"))),
            ("Idle for", idle_for(worker.get("idle_since"))),
            ("Warned", when(worker.get("idle_warned_at"))),
        ]
    )


def policy(minutes: float | None) -> str:
    return f"delete after {minutes:g} min idle" if minutes else "never deleted as idle"


def render_workers(workers: list[Worker]) -> str:
    headers = ["ID", "NAME", "CLUSTER", "ENVIRONMENT", "STATUS", "NODE", "JOB", "IDLE", "CREATED"]
    rows = [
        [
            cell(w["id"]),
            cell(w.get("name")),
            cell(w.get("cluster")),
            cell(w.get("environment")),
            cell(w.get("status")),
            cell(w.get("node_hostname")),
            cell(w.get("scheduler_job_id")),
            idle_for(w.get("idle_since")),
            when(w.get("created_at")),
        ]
        for w in workers
    ]
    return table(headers, rows)


def progress_line(worker: Worker) -> str:
    line = f"{worker['id']}: {worker['status']}"
    if worker["status"] == QUEUED and worker.get("scheduler_job_id"):
        line += f" (job {worker['scheduler_job_id']})"
    elif worker["status"] in ON_A_NODE and worker.get("node_hostname"):
        line += f" on {worker['node_hostname']}"
    if worker.get("status_reason"):
        line += f": {worker['status_reason']}"
    return line


def wait_for(
    client: ApiClient,
    worker: Worker,
    *,
    done: Callable[[Worker], bool],
    failed: Collection[str],
) -> Worker:
    """Poll until ``done(worker)``; a status in ``failed`` ends the wait with its reason."""

    def finished(current: Worker) -> bool:
        if done(current):
            return True
        if current["status"] in failed:
            raise ended(current)
        return False

    return poll(
        worker,
        lambda: client.get(worker_path(worker["id"]), not_found=not_found(worker["id"])),
        progress=progress_line,
        finished=finished,
    )


def ended(worker: Worker) -> CliError:
    reason = worker.get("status_reason") or "no reason given"
    outcome = ENDINGS.get(worker["status"], f"is {worker['status']}")
    return CliError(f"worker {worker['id']} {outcome}: {reason}")


def request_body(client: ApiClient, args: argparse.Namespace) -> dict[str, Any]:
    """What to ask for: the arguments, on top of a saved request's with ``--from``."""
    body: dict[str, Any] = {"params": {}}
    if args.saved:
        found = client.get(saved_path(args.saved), not_found=saved_not_found(args.saved))
        body = {k: found[k] for k in ("cluster", "environment")} | {"params": found["params"]}
        if args.cluster and args.cluster != found["cluster"]:
            raise CliError(f"{args.saved!r} is saved for cluster {found['cluster']!r}")
    elif not args.cluster or not args.environment:
        raise UsageError("give CLUSTER and --environment, or --from NAME")
    if args.cluster:
        body["cluster"] = args.cluster
    if args.environment:
        body["environment"] = args.environment
    body["params"] |= dict(args.param or [])
    if args.name:
        body["name"] = args.name
    if args.idle_minutes is not None:
        body["idle_minutes"] = args.idle_minutes
    return body


def create(client: ApiClient, args: argparse.Namespace) -> int:
    body = request_body(client, args)
    if args.count is not None:
        return create_many(client, args, body)
    # One key per invocation: a retry after a lost answer cannot make a second worker.
    worker = client.post("/workers/", body, idempotency_key=f"pw-{uuid.uuid4()}")
    return created(client, args, worker)


def again(client: ApiClient, args: argparse.Namespace) -> int:
    worker = client.post(
        f"{worker_path(args.id)}again/",
        {},
        idempotency_key=f"pw-{uuid.uuid4()}",
        not_found=not_found(args.id),
    )
    return created(client, args, worker)


def created(client: ApiClient, args: argparse.Namespace, worker: Worker) -> int:
    if args.wait:
        try:
            worker = wait_for(
                client,
                worker,
                done=lambda w: w["status"] == CONNECTED,
                failed={STOPPING, *FINISHED},
            )
        except NotFound:
            raise CliError(f"worker {worker['id']} ended and is no longer listed") from None
        except KeyboardInterrupt:
            raise Interrupted(
                f"stopped waiting; worker {worker['id']} is still requested "
                f"(delete it with: pw workers delete {worker['id']})"
            ) from None
    emit(sys.stdout, worker, args.output, render_worker)
    return 0


def create_many(client: ApiClient, args: argparse.Namespace, body: dict[str, Any]) -> int:
    """``--count N``: N workers alike in one request (and one key: a retry makes none more)."""
    body["count"] = args.count
    answer = client.post("/workers/", body, idempotency_key=f"pw-{uuid.uuid4()}")
    workers: list[Worker] = answer["workers"]
    if args.wait:
        try:
            workers = wait_for_all(client, workers, cluster=args.cluster)
        except KeyboardInterrupt:
            raise Interrupted(
                f"stopped waiting; the {len(workers)} workers are still requested"
            ) from None
    emit(sys.stdout, workers, args.output, render_workers)
    return 0


def progress_summary(workers: list[Worker]) -> str:
    counts: dict[str, int] = {}
    for worker in workers:
        counts[worker["status"]] = counts.get(worker["status"], 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def wait_for_all(client: ApiClient, workers: list[Worker], *, cluster: str) -> list[Worker]:
    """Poll (one listing of the cluster's workers per round) until every one is connected; the
    first to fail ends the wait with its reason."""
    wanted = [w["id"] for w in workers]

    def fetch() -> list[Worker]:
        listed = {w["id"]: w for w in client.list_all("/workers/", params={"cluster": cluster})}
        gone = [worker_id for worker_id in wanted if worker_id not in listed]
        if gone:
            raise CliError(f"worker {gone[0]} ended and is no longer listed")
        return [listed[worker_id] for worker_id in wanted]

    def finished(current: list[Worker]) -> bool:
        for worker in current:
            if worker["status"] in (STOPPING, *FINISHED):
                raise ended(worker)
        return all(w["status"] == CONNECTED for w in current)

    return poll(workers, fetch, progress=progress_summary, finished=finished)


def positive_count(raw: str) -> int:
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, not {raw!r}")
    return count


def keep(client: ApiClient, args: argparse.Namespace) -> int:
    worker = client.post(f"{worker_path(args.id)}keep/", {}, not_found=not_found(args.id))
    emit(sys.stdout, worker, args.output, render_worker)
    return 0


def list_workers(client: ApiClient, args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("cluster", args.cluster), ("status", args.status)) if v}
    workers = client.list_all("/workers/", params=params)
    emit(sys.stdout, workers, args.output, render_workers)
    return 0


def get(client: ApiClient, args: argparse.Namespace) -> int:
    worker = client.get(worker_path(args.id), not_found=not_found(args.id))
    emit(sys.stdout, worker, args.output, render_worker)
    return 0


def delete(client: ApiClient, args: argparse.Namespace) -> int:
    worker = client.delete(worker_path(args.id), not_found=not_found(args.id))
    if args.wait:
        try:
            worker = wait_for(client, worker, done=lambda w: w["status"] == STOPPED, failed={ERROR})
        except NotFound:
            # Finished long enough ago to have left the list: it is stopped.
            print(f"{args.id}: stopped", file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            raise Interrupted(f"stopped waiting; worker {args.id} is still being stopped") from None
    emit(sys.stdout, worker, args.output, render_worker)
    return 0


def add_parser(
    commands: Any, common: argparse.ArgumentParser, output: argparse.ArgumentParser
) -> None:
    workers = commands.add_parser(
        "workers", help="request, list and delete workers", parents=[common]
    )
    sub = workers.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = sub.add_parser(
        "create", help="request a worker from an environment", parents=[common, output]
    )
    p.add_argument("cluster", metavar="CLUSTER", nargs="?", default="")
    p.add_argument("--environment", "-e", default="", metavar="ENV")
    p.add_argument(
        "--from",
        dest="saved",
        default="",
        metavar="NAME",
        help="a saved request's cluster, environment and fields (see pw saved); "
        "--param and --environment given here win",
    )
    add_param_option(p)
    p.add_argument("--name", default="", help="default: ENV-ID")
    add_idle_option(
        p, "delete it after N minutes idle, warned first (0: never; default: the site's)"
    )
    p.add_argument(
        "--count",
        "-n",
        type=positive_count,
        metavar="N",
        help="request N workers alike at once (named NAME-1 ... NAME-N when --name is given)",
    )
    p.add_argument("--wait", action="store_true", help="wait until it is (they are) connected")
    p.set_defaults(run=create)

    p = sub.add_parser(
        "again",
        help="request another worker like ID (same environment, fields and name)",
        parents=[common, output],
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("--wait", action="store_true", help="wait until it is connected")
    p.set_defaults(run=again)

    p = sub.add_parser("ls", help="list your workers", parents=[common, output])
    p.add_argument("--cluster", metavar="CLUSTER")
    p.add_argument("--status", choices=STATUSES)
    p.set_defaults(run=list_workers)

    p = sub.add_parser(
        "keep", help="keep an idle worker: its idle clock starts again", parents=[common, output]
    )
    p.add_argument("id", metavar="ID")
    p.set_defaults(run=keep)

    p = sub.add_parser("get", help="show one worker", parents=[common, output])
    p.add_argument("id", metavar="ID")
    p.set_defaults(run=get)

    p = sub.add_parser(
        "delete", help="delete a worker and cancel its job", parents=[common, output]
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("--wait", action="store_true", help="wait until it is stopped")
    p.set_defaults(run=delete)
