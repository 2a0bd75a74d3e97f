"""pw usage: node-hours from connected to stopped, per cluster and cluster account, in a month."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from activate_cli.client import ApiClient
from activate_cli.output import cell, emit, table


def clock(seconds: int) -> str:
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def render_usage(body: dict[str, Any], *, everyone: bool = False) -> str:
    rows = [
        [
            *([cell(row["user"])] if everyone else []),
            cell(row["cluster"]),
            cell(row["account"] or "(shared)"),
            cell(row["workers"]),
            f"{row['node_hours']:.4f}",
            clock(row["node_seconds"]),
        ]
        for row in body["rows"]
    ]
    headers = [*(["USER"] if everyone else []), "CLUSTER", "ACCOUNT", "WORKERS", "NODE-HOURS"]
    month = str(body["since"])[:7]
    total = f"total {body['node_hours']:.4f} node-hours ({clock(body['node_seconds'])}) in {month}"
    if not rows:
        return f"no worker was connected in {month}"
    return table([*headers, "H:MM:SS"], rows) + "\n" + total


def show(client: ApiClient, args: argparse.Namespace) -> int:
    params = {"month": args.month} if args.month else {}
    if args.all:
        params["all"] = "true"
    body = client.get("/usage/", params=params)
    emit(sys.stdout, body, args.output, lambda b: render_usage(b, everyone=args.all))
    return 0


def add_parser(
    commands: Any, common: argparse.ArgumentParser, output: argparse.ArgumentParser
) -> None:
    p = commands.add_parser(
        "usage",
        help="node-hours your workers held in a month, per cluster and account",
        parents=[common, output],
    )
    p.add_argument("--month", metavar="YYYY-MM", help="default: this month (UTC)")
    p.add_argument("--all", action="store_true", help="every user's (staff only)")
    p.set_defaults(run=show)
