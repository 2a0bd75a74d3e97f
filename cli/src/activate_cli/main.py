"""pw: request and manage ACTIVATE workers from the command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import httpx

from activate_cli import (
    auth,
    clusters,
    completion,
    environments,
    files,
    saved,
    sessions,
    ssh,
    usage,
    workers,
)
from activate_cli.client import ApiClient
from activate_cli.config import HOST_ENV, load_config
from activate_cli.errors import CliError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the hint says where the usage is.
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> Parser:
    # Accepted before or after the command; SUPPRESS keeps a sub-command from resetting it.
    common = Parser(add_help=False)
    common.add_argument(
        "--platform-host", default=argparse.SUPPRESS, help=f"platform URL (default: {HOST_ENV})"
    )
    output = Parser(add_help=False)
    output.add_argument("-o", "--output", choices=["table", "json"], default="table")

    parser = Parser(prog="pw", description=__doc__)
    parser.add_argument("--platform-host", help=f"platform URL (default: {HOST_ENV})")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    auth.add_parser(commands, common)
    workers.add_parser(commands, common, output)
    clusters.add_parser(commands, common, output)
    environments.add_parser(commands, common, output)
    sessions.add_parser(commands, common, output)
    saved.add_parser(commands, common, output)
    usage.add_parser(commands, common, output)
    files.add_parser(commands, common, output)
    ssh.add_parser(commands, common)
    completion.add_parser(commands, common, parser)
    return parser


def main(argv: Sequence[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "needs_client", True):
            with ApiClient(load_config(args.platform_host), transport=transport) as client:
                return int(args.run(client, args))
        return int(args.run(args))
    except CliError as exc:
        print(f"pw: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("pw: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `pw workers ls | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
