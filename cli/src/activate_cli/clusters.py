"""pw cluster ls|connect|verify|disconnect: clusters, and your own account on each."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from activate_cli.client import ApiClient
from activate_cli.errors import CliError
from activate_cli.output import cell, emit, table

Account = dict[str, Any]
# What the CLI reads of an account; a test checks them against the platform's API schema.
ACCOUNT_FIELDS = ("remote_username", "verified", "public_key", "origin", "last_error")
# How agents reach the platform, and the states of a relay on the login host (checked likewise).
AGENT_ROUTES = ("direct", "via_login_host")
RELAY_STATES = ("starting", "up", "down", "stopped", "unknown")
# How a user logs in to a cluster (checked likewise).
LOGINS = ("certificate", "key", "shared")
PUBLIC_KEY_PREFIXES = ("ssh-", "ecdsa-", "sk-ssh-", "sk-ecdsa-")


def account_path(cluster: str) -> str:
    return f"/clusters/{quote(cluster, safe='')}/account/"


def no_account(cluster: str) -> str:
    return f"you have no account on cluster {cluster} (connect one with: pw cluster connect)"


def account_cell(cluster: dict[str, Any]) -> str:
    account = cluster.get("account")
    certificate = cluster.get("login") == LOGINS[0]
    if account:
        state = (
            "certificate"
            if certificate
            else ("verified" if account.get("verified") else "not verified")
        )
        return f"{account.get('remote_username')} ({state})"
    if cluster.get("shared"):
        return "shared"
    if certificate:
        if cluster.get("unix_name"):
            return f"{cluster['unix_name']} (certificate)"
        return "none - your name maps to no Unix name there; ask an operator"
    return f"none - run: pw cluster connect {cluster['name']} --user USER"


def agents_cell(cluster: dict[str, Any]) -> str:
    """How agents reach the platform: direct, or through the login host's relay (its state)."""
    if cluster.get("agent_route", "direct") == "direct":
        return "direct"
    return f"login-host-relay:{cluster.get('relay_state') or 'unknown'}"


def render_clusters(clusters: list[dict[str, Any]]) -> str:
    rows = [
        [
            cell(c["name"]),
            cell(c["scheduler"]),
            cell(c["reachability"]),
            cell(agents_cell(c)),
            account_cell(c),
        ]
        for c in clusters
    ]
    return table(["NAME", "SCHEDULER", "STATUS", "AGENTS", "ACCOUNT"], rows)


def one_line(text: str) -> str:
    return " ".join(text.split())


def read_private_key(path: str) -> str:
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"cannot read {path}: not a text key file") from None
    if text.lstrip().startswith(PUBLIC_KEY_PREFIXES):
        raise CliError(f"{path} is a public key; pass the private key file (e.g. without .pub)")
    return text


def report_verification(cluster: str, account: Account) -> int:
    user = account.get("remote_username")
    if account.get("verified"):
        print(f"verified: you act on {cluster} as {user}")
        return 0
    reason = one_line(str(account.get("last_error") or "")) or "no reason given"
    raise CliError(f"cannot log in to {cluster} as {user}: {reason}")


def verify_account(client: ApiClient, cluster: str) -> int:
    account = client.post(f"{account_path(cluster)}verify/", {}, not_found=no_account(cluster))
    return report_verification(cluster, account)


def list_clusters(client: ApiClient, args: argparse.Namespace) -> int:
    emit(sys.stdout, client.list_all("/clusters/"), args.output, render_clusters)
    return 0


def connect(client: ApiClient, args: argparse.Namespace) -> int:
    body = {"remote_username": args.remote_username}
    if args.key_file:
        body["private_key"] = read_private_key(args.key_file)
    account = client.post(
        account_path(args.cluster), body, not_found=f"cluster {args.cluster} not found"
    )
    user = account.get("remote_username", args.remote_username)
    if args.key_file:
        print(f"{args.cluster}: key for {user} saved; trying it", file=sys.stderr, flush=True)
        return verify_account(client, args.cluster)
    public_key = one_line(str(account.get("public_key") or ""))
    if not public_key:
        raise CliError(f"the platform sent no public key for {user} on {args.cluster}")
    # The key alone on stdout, so that `pw cluster connect ... > key.pub` keeps just the key.
    print(
        f"Append this public key to ~/.ssh/authorized_keys of {user} on {args.cluster}:",
        file=sys.stderr,
        flush=True,
    )
    print(public_key, flush=True)
    print(f"then run: pw cluster verify {args.cluster}", file=sys.stderr)
    return 0


def verify(client: ApiClient, args: argparse.Namespace) -> int:
    return verify_account(client, args.cluster)


def disconnect(client: ApiClient, args: argparse.Namespace) -> int:
    client.delete(account_path(args.cluster), not_found=no_account(args.cluster))
    print(f"disconnected: the platform no longer acts on {args.cluster} as you")
    return 0


def add_parser(
    commands: Any, common: argparse.ArgumentParser, output: argparse.ArgumentParser
) -> None:
    cluster = commands.add_parser(
        "cluster",
        aliases=["clusters"],
        help="list clusters and connect your account on them",
        parents=[common],
    )
    sub = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser(
        "ls", help="list clusters and your account on each", parents=[common, output]
    )
    p.set_defaults(run=list_clusters)

    p = sub.add_parser(
        "connect",
        help="act on a cluster as your own user there (a new key pair, or --key-file)",
        parents=[common],
    )
    p.add_argument("cluster", metavar="CLUSTER")
    p.add_argument("--user", "-u", dest="remote_username", required=True, metavar="REMOTE_USER")
    p.add_argument(
        "--key-file",
        metavar="FILE",
        help="an existing private key for that user (default: the platform makes a key pair)",
    )
    p.set_defaults(run=connect)

    p = sub.add_parser(
        "verify", help="check that the platform can log in with your account", parents=[common]
    )
    p.add_argument("cluster", metavar="CLUSTER")
    p.set_defaults(run=verify)

    p = sub.add_parser(
        "disconnect", help="remove your account on a cluster from the platform", parents=[common]
    )
    p.add_argument("cluster", metavar="CLUSTER")
    p.set_defaults(run=disconnect)
