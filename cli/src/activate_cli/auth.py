"""pw auth login: check an API key against the platform, then store it."""

from __future__ import annotations

import argparse
import getpass
import os
from typing import Any

from activate_cli.client import ApiClient
from activate_cli.config import HOST_ENV, KEY_ENV, Config, normalize_host, write_credentials
from activate_cli.errors import CliError


def ask(prompt: str, *, secret: bool = False) -> str:
    try:
        answer = getpass.getpass(prompt) if secret else input(prompt)
    except EOFError:
        answer = ""
    if not answer.strip():
        raise CliError(f"no {prompt.rstrip(': ').lower()} given")
    return answer.strip()


def login(args: argparse.Namespace) -> int:
    host = args.platform_host or os.environ.get(HOST_ENV) or ask("Platform host: ")
    key = args.api_key or os.environ.get(KEY_ENV) or ask("API key: ", secret=True)
    config = Config(platform_host=normalize_host(host), api_key=key.strip())
    with ApiClient(config) as client:
        me = client.get("/me/")
    path = write_credentials(config)
    print(f"Logged in to {config.platform_host} as {me.get('username')}; key saved in {path}")
    return 0


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    auth = commands.add_parser("auth", help="log in with an API key", parents=[common])
    sub = auth.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser(
        "login", help="check an API key and save it for later commands", parents=[common]
    )
    p.add_argument("--api-key", help=f"default: {KEY_ENV}, else asked for")
    p.set_defaults(run=login, needs_client=False)
