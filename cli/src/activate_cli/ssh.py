"""pw ssh: a command, or a line-by-line shell, on a worker's node through the platform."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from activate_cli.client import ApiClient
from activate_cli.workers import not_found, worker_path

PROMPT_HELP = (
    "Each line runs as its own `bash -lc` command on the node, inside the worker's job "
    "(no state such as the current directory carries over). Ctrl-D to leave."
)


def run_remote(client: ApiClient, worker_id: str, argv: list[str]) -> int:
    result = client.post(f"{worker_path(worker_id)}exec/", {"command": argv})
    sys.stdout.write(result.get("stdout", ""))
    sys.stderr.write(result.get("stderr", ""))
    sys.stdout.flush()
    return int(result.get("exit_status", 1))


def ssh(client: ApiClient, args: argparse.Namespace) -> int:
    worker = client.get(worker_path(args.worker), not_found=not_found(args.worker))
    if args.command:
        return run_remote(client, worker["id"], list(args.command))
    print(f"{worker['name']} on {worker['node_hostname']}. {PROMPT_HELP}", file=sys.stderr)
    status = 0
    while True:
        try:
            line = input(f"{worker['node_hostname']}$ ")
        except EOFError:
            print(file=sys.stderr)
            return status
        if line.strip():
            status = run_remote(client, worker["id"], ["bash", "-lc", line])


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser(
        "ssh",
        help="run a command (or a line-by-line shell) on a worker's node",
        parents=[common],
    )
    p.add_argument("worker", metavar="WORKER")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND")
    p.set_defaults(run=ssh)
