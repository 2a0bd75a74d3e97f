"""pw environments ls|get: what can be requested on a cluster, and which fields it takes."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import quote

from activate_cli.client import ApiClient
from activate_cli.output import cell, emit, pairs, table


def environments_path(cluster: str) -> str:
    return f"/clusters/{quote(cluster, safe='')}/environments/"


def nodes(env: dict[str, Any]) -> str:
    total, available = env.get("nodes_total"), env.get("nodes_available")
    if total is None and available is None:
        return "-"
    return f"{cell(available)}/{cell(total)}"


def render_environments(envs: list[dict[str, Any]]) -> str:
    rows = [
        [
            cell(e["name"]),
            cell(e.get("partition")),
            cell(e.get("active")),
            nodes(e),
            cell(", ".join(f["name"] + ("*" if f["required"] else "") for f in e["fields"])),
        ]
        for e in envs
    ]
    return table(["NAME", "PARTITION", "ACTIVE", "NODES FREE/TOTAL", "FIELDS (*required)"], rows)


def render_environment(env: dict[str, Any]) -> str:
    about = pairs(
        [
            ("Name", cell(env["name"])),
            ("Cluster", cell(env.get("cluster"))),
            ("Partition", cell(env.get("partition"))),
            ("Source", cell(env.get("source"))),
            ("Active", cell(env.get("active"))),
            ("Nodes free/total", nodes(env)),
        ]
    )
    rows = [
        [
            cell(f["name"]),
            cell(f.get("label")),
            cell(f.get("default")),
            cell(f.get("required")),
            cell(f.get("pattern")),
            cell(", ".join(str(c) for c in f.get("choices") or [])),
        ]
        for f in env["fields"]
    ]
    if not rows:
        return f"{about}\n\nNo settable fields."
    fields = table(["FIELD", "LABEL", "DEFAULT", "REQUIRED", "PATTERN", "CHOICES"], rows)
    return f"{about}\n\n{fields}"


def list_environments(client: ApiClient, args: argparse.Namespace) -> int:
    envs = client.list_all(
        environments_path(args.cluster), not_found=f"cluster {args.cluster} not found"
    )
    emit(sys.stdout, envs, args.output, render_environments)
    return 0


def get_environment(client: ApiClient, args: argparse.Namespace) -> int:
    env = client.get(
        f"{environments_path(args.cluster)}{quote(args.name, safe='')}/",
        not_found=f"environment {args.name} not found on cluster {args.cluster}",
    )
    emit(sys.stdout, env, args.output, render_environment)
    return 0


def add_parser(
    commands: Any, common: argparse.ArgumentParser, output: argparse.ArgumentParser
) -> None:
    envs = commands.add_parser(
        "environments",
        aliases=["env"],
        help="list environments and their scheduling fields",
        parents=[common],
    )
    sub = envs.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("ls", help="list a cluster's environments", parents=[common, output])
    p.add_argument("--cluster", "-c", required=True, metavar="CLUSTER")
    p.set_defaults(run=list_environments)
    p = sub.add_parser(
        "get", help="show an environment's settable fields", parents=[common, output]
    )
    p.add_argument("name", metavar="ENV")
    p.add_argument("--cluster", "-c", required=True, metavar="CLUSTER")
    p.set_defaults(run=get_environment)
