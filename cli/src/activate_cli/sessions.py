"""pw sessions create|ls|get|stop|types: programs on workers (a desktop, VS Code, ...) opened
in the browser. The types are the server's: `pw sessions types` lists them."""

from __future__ import annotations

import argparse
import sys
import webbrowser
from typing import Any
from urllib.parse import quote

from activate_cli.client import ApiClient
from activate_cli.errors import CliError, Interrupted
from activate_cli.output import cell, emit, pairs, table, when
from activate_cli.params import add_idle_option, add_param_option, parse_param
from activate_cli.waiting import poll

# Session statuses as the API names them; a test checks them against its schema.
PENDING = "pending"
STARTING = "starting"
RUNNING = "running"
ENDED = "ended"
FAILED = "failed"
SESSION_STATUSES = (PENDING, STARTING, RUNNING, ENDED, FAILED)
KINDS_PATH = "/sessions/kinds/"
# Shell completion offers --type's values by running this pw command (the server's types).
TYPE_METAVAR = "TYPE"
TYPES_COMMAND = ("sessions", "types", "--names")

Session = dict[str, Any]


def session_path(session_id: str) -> str:
    return f"/sessions/{quote(session_id, safe='')}/"


def not_found(session_id: str) -> str:
    return f"session {session_id} not found"


def render_session(session: Session) -> str:
    return pairs(
        [
            ("ID", cell(session["id"])),
            ("Name", cell(session.get("name"))),
            ("Type", cell(session.get("type"))),
            ("Status", cell(session.get("status"))),
            ("Reason", cell(session.get("reason"))),
            ("URL", cell(session.get("url"))),
            ("Cluster", cell(session.get("cluster"))),
            ("Folder", cell(session.get("folder") or "~")),
            ("Environment", cell(session.get("environment"))),
            ("Partition", cell(session.get("partition"))),
            ("Node", cell(session.get("node"))),
            ("Job ID", cell(session.get("job_id"))),
            ("Worker", cell(session.get("worker"))),
            ("Worker status", cell(session.get("worker_status"))),
            ("Dedicated worker", cell(session.get("dedicated_worker"))),
            ("Created", when(session.get("created_at"))),
            ("Started", when(session.get("started_at"))),
            ("Ended", when(session.get("ended_at"))),
        ]
    )


def render_sessions(sessions: list[Session]) -> str:
    headers = ["ID", "NAME", "TYPE", "STATUS", "CLUSTER", "WORKER", "NODE", "REASON"]
    rows = [
        [
            cell(s["id"]),
            cell(s.get("name")),
            cell(s.get("type")),
            cell(s.get("status")),
            cell(s.get("cluster")),
            cell(s.get("worker")),
            cell(s.get("node")),
            cell(s.get("reason")),
        ]
        for s in sessions
    ]
    return table(headers, rows)


def progress_line(session: Session) -> str:
    line = f"{session['id']}: {session['status']}"
    if session["status"] == PENDING and session.get("worker_status"):
        line += f" (worker {session['worker']} {session['worker_status']})"
    if session.get("reason"):
        line += f": {session['reason']}"
    return line


def wait_running(client: ApiClient, session: Session) -> Session:
    def finished(current: Session) -> bool:
        if current["status"] in (ENDED, FAILED):
            reason = current.get("reason") or "no reason given"
            raise CliError(f"session {current['id']} {current['status']}: {reason}")
        return bool(current["status"] == RUNNING)

    return poll(
        session,
        lambda: client.get(session_path(session["id"]), not_found=not_found(session["id"])),
        progress=progress_line,
        finished=finished,
    )


def open_in_browser(session: Session) -> None:
    if not webbrowser.open(session["url"]):
        print(f"open {session['url']} in your browser", file=sys.stderr)


def session_types(client: ApiClient) -> list[dict[str, Any]]:
    return list(client.get(KINDS_PATH))


def check_type(client: ApiClient, name: str) -> None:
    known = [str(kind["name"]) for kind in session_types(client)]
    if name not in known:
        raise CliError(f"unknown session type {name!r}; {client.host} offers: {', '.join(known)}")


def render_types(types: list[dict[str, Any]]) -> str:
    rows = [[cell(t["name"]), cell(t.get("label")), cell(t.get("description"))] for t in types]
    return table(["TYPE", "LABEL", "DESCRIPTION"], rows)


def render_fields(types: list[dict[str, Any]]) -> str:
    rows = [
        [
            cell(t["name"]),
            cell(f["name"]),
            cell(f.get("label")),
            cell(f.get("default")),
            cell("yes" if f.get("required") else "no"),
            cell(", ".join(f.get("choices") or [])),
        ]
        for t in types
        for f in t.get("fields") or []
    ]
    return table(["TYPE", "FIELD", "LABEL", "DEFAULT", "REQUIRED", "CHOICES"], rows)


def list_types(client: ApiClient, args: argparse.Namespace) -> int:
    types = session_types(client)
    if args.names:
        print("\n".join(str(t["name"]) for t in types))
    elif args.fields:
        emit(sys.stdout, types, args.output, render_fields)
    else:
        emit(sys.stdout, types, args.output, render_types)
    return 0


def create(client: ApiClient, args: argparse.Namespace) -> int:
    if bool(args.environment) == bool(args.worker):
        raise CliError("give --environment ENV or --worker ID (one of them)")
    check_type(client, args.type)
    body: dict[str, Any] = {"type": args.type, "cluster": args.cluster}
    if args.value:
        body["values"] = dict(args.value)
    if args.environment:
        body["environment"] = args.environment
        body["params"] = dict(args.param or [])
    else:
        if args.param:
            raise CliError("--param applies to a new worker, not to --worker")
        body["worker"] = args.worker
    if args.name:
        body["name"] = args.name
    if args.folder:
        body["folder"] = args.folder
    if args.idle_minutes is not None:
        body["idle_minutes"] = args.idle_minutes
    return launched(client, args, client.post("/sessions/", body))


def keep(client: ApiClient, args: argparse.Namespace) -> int:
    path = f"{session_path(args.id)}keep/"
    session = client.post(path, {}, not_found=not_found(args.id))
    emit(sys.stdout, session, args.output, render_session)
    return 0


def again(client: ApiClient, args: argparse.Namespace) -> int:
    path = f"{session_path(args.id)}again/"
    return launched(client, args, client.post(path, {}, not_found=not_found(args.id)))


def launched(client: ApiClient, args: argparse.Namespace, session: Session) -> int:
    if args.wait or args.open:
        try:
            session = wait_running(client, session)
        except KeyboardInterrupt:
            raise Interrupted(
                f"stopped waiting; session {session['id']} is still starting "
                f"(stop it with: pw sessions stop {session['id']})"
            ) from None
        if args.open:
            open_in_browser(session)
    emit(sys.stdout, session, args.output, render_session)
    return 0


def list_sessions(client: ApiClient, args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("status", args.status), ("worker", args.worker)) if v}
    emit(sys.stdout, client.list_all("/sessions/", params=params), args.output, render_sessions)
    return 0


def get(client: ApiClient, args: argparse.Namespace) -> int:
    session = client.get(session_path(args.id), not_found=not_found(args.id))
    if args.open:
        if session["status"] != RUNNING:
            raise CliError(f"session {args.id} is {session['status']}, not running")
        open_in_browser(session)
    emit(sys.stdout, session, args.output, render_session)
    return 0


def stop(client: ApiClient, args: argparse.Namespace) -> int:
    session = client.delete(session_path(args.id), not_found=not_found(args.id))
    emit(sys.stdout, session, args.output, render_session)
    return 0


def add_parser(
    commands: Any, common: argparse.ArgumentParser, output: argparse.ArgumentParser
) -> None:
    sessions = commands.add_parser(
        "sessions", help="desktops, VS Code and more on workers, in the browser", parents=[common]
    )
    sub = sessions.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = sub.add_parser("create", help="launch a session", parents=[common, output])
    p.add_argument("cluster", metavar="CLUSTER")
    p.add_argument(
        "--type",
        "-t",
        required=True,
        metavar=TYPE_METAVAR,
        help="what to run (the server's types: pw sessions types)",
    )
    p.add_argument("--environment", "-e", metavar="ENV", help="on a new worker of ENV")
    p.add_argument("--worker", "-w", metavar="ID", help="on this connected worker of yours")
    add_param_option(p, what="a scheduling field of the new worker")
    p.add_argument(
        "--value",
        "-V",
        action="append",
        type=parse_param,
        metavar="FIELD=VALUE",
        help="a field of the type (pw sessions types --fields lists them), e.g. "
        "logdir=~/runs (repeatable)",
    )
    p.add_argument("--name", default="", help="letters, digits, underscores; default TYPE_TIME")
    p.add_argument(
        "--folder",
        default="",
        metavar="FOLDER",
        help="the folder on the cluster it opens in (absolute, or ~/...; default: your home)",
    )
    add_idle_option(
        p,
        "end it after N minutes with no traffic and nothing running, warned first (0: never; "
        "default: the environment's on a new worker, never on --worker)",
    )
    p.add_argument("--wait", action="store_true", help="wait until it is running")
    p.add_argument("--open", action="store_true", help="wait, then open it in your browser")
    p.set_defaults(run=create)

    p = sub.add_parser(
        "again",
        help="launch another session like ID (same type; a new worker like its own, or the "
        "same worker while connected)",
        parents=[common, output],
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("--wait", action="store_true", help="wait until it is running")
    p.add_argument("--open", action="store_true", help="wait, then open it in your browser")
    p.set_defaults(run=again)

    p = sub.add_parser(
        "keep", help="keep an idle session: its idle clock starts again", parents=[common, output]
    )
    p.add_argument("id", metavar="ID")
    p.set_defaults(run=keep)

    p = sub.add_parser("ls", help="list your sessions", parents=[common, output])
    p.add_argument("--status", choices=SESSION_STATUSES)
    p.add_argument("--worker", metavar="ID")
    p.set_defaults(run=list_sessions)

    p = sub.add_parser("get", help="show one session", parents=[common, output])
    p.add_argument("id", metavar="ID")
    p.add_argument("--open", action="store_true", help="open it in your browser")
    p.set_defaults(run=get)

    p = sub.add_parser(
        "stop", help="stop a session (and a worker launched for it)", parents=[common, output]
    )
    p.add_argument("id", metavar="ID")
    p.set_defaults(run=stop)

    p = sub.add_parser(
        "types", help="the types of session the server runs", parents=[common, output]
    )
    p.add_argument("--names", action="store_true", help="only their names, one a line")
    p.add_argument("--fields", action="store_true", help="the fields each type takes (--value)")
    p.set_defaults(run=list_types)
