"""pw saved ls|create|get|delete: worker requests under a name, for `pw workers create --from`."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import quote

from activate_cli.client import ApiClient
from activate_cli.output import cell, emit, pairs, table
from activate_cli.params import add_param_option

SavedRequest = dict[str, Any]


def saved_path(name: str) -> str:
    return f"/saved-requests/{quote(name, safe='')}/"


def not_found(name: str) -> str:
    return f"no saved request named {name!r} (see: pw saved ls)"


def params_text(params: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def render_saved_list(saved: list[SavedRequest]) -> str:
    rows = [
        [cell(s["name"]), cell(s["cluster"]), cell(s["environment"]), params_text(s["params"])]
        for s in saved
    ]
    return table(["NAME", "CLUSTER", "ENVIRONMENT", "PARAMS"], rows)


def render_saved(saved: SavedRequest) -> str:
    return pairs(
        [
            ("Name", cell(saved["name"])),
            ("Cluster", cell(saved["cluster"])),
            ("Environment", cell(saved["environment"])),
            ("Params", params_text(saved["params"]) or "-"),
            ("Updated", cell(saved.get("updated_at"))),
        ]
    )


def list_saved(client: ApiClient, args: argparse.Namespace) -> int:
    emit(sys.stdout, client.list_all("/saved-requests/"), args.output, render_saved_list)
    return 0


def create(client: ApiClient, args: argparse.Namespace) -> int:
    body = {
        "name": args.name,
        "cluster": args.cluster,
        "environment": args.environment,
        "params": dict(args.param or []),
    }
    emit(sys.stdout, client.post("/saved-requests/", body), args.output, render_saved)
    return 0


def get(client: ApiClient, args: argparse.Namespace) -> int:
    saved = client.get(saved_path(args.name), not_found=not_found(args.name))
    emit(sys.stdout, saved, args.output, render_saved)
    return 0


def delete(client: ApiClient, args: argparse.Namespace) -> int:
    client.delete(saved_path(args.name), not_found=not_found(args.name))
    print(f"{args.name}: deleted", file=sys.stderr)
    return 0


def add_parser(
    commands: Any, common: argparse.ArgumentParser, output: argparse.ArgumentParser
) -> None:
    saved = commands.add_parser(
        "saved", help="worker requests saved under a name of yours", parents=[common]
    )
    sub = saved.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = sub.add_parser("ls", help="list your saved requests", parents=[common, output])
    p.set_defaults(run=list_saved)

    p = sub.add_parser(
        "create",
        help="save a request under NAME (replacing one of that name)",
        parents=[common, output],
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("cluster", metavar="CLUSTER")
    p.add_argument("--environment", "-e", required=True, metavar="ENV")
    add_param_option(p)
    p.set_defaults(run=create)

    p = sub.add_parser("get", help="show one saved request", parents=[common, output])
    p.add_argument("name", metavar="NAME")
    p.set_defaults(run=get)

    p = sub.add_parser("delete", help="forget a saved request", parents=[common])
    p.add_argument("name", metavar="NAME")
    p.set_defaults(run=delete)
