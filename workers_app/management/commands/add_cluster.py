from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

import schedulers
from core.transport.hostkeys import HostKeyUnreadable, fetch_host_key, fingerprint
from workers_app.actions import clusters
from workers_app.models import AgentRoute, Cluster


class Command(BaseCommand):
    help = (
        "Register a cluster: pin its SSH host key, store its own account's key encrypted (used "
        "only to detect environments, unless --shared), detect environments."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--host", required=True)
        parser.add_argument("--port", type=int, default=22)
        parser.add_argument("--user", default="", help="The cluster's own account (optional).")
        parser.add_argument("--key-file", type=Path, help="That account's private key.")
        parser.add_argument(
            "--shared",
            action="store_true",
            help="Every user acts as the cluster's own account (one person or one lab only).",
        )
        parser.add_argument("--scheduler", required=True, choices=schedulers.names())
        parser.add_argument(
            "--host-key", help='Pin this key ("ssh-ed25519 AAAA...") instead of asking.'
        )
        parser.add_argument("--yes", action="store_true", help="Trust the key shown, no prompt.")
        parser.add_argument(
            "--agent-route",
            choices=AgentRoute.values,
            default=AgentRoute.DIRECT,
            help="How agents reach the platform: direct, or via_login_host (a relay there; "
            "needs --user and `run_relays`).",
        )
        parser.add_argument(
            "--relay-host",
            default="",
            help="via_login_host: the login host's address as compute nodes see it.",
        )
        parser.add_argument(
            "--relay-port", type=int, default=0, help="via_login_host: the relay's port (0: any)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["name"]
        pem = ""
        if options["key_file"]:
            try:
                pem = options["key_file"].read_text()
            except OSError as exc:
                raise CommandError(f"cannot read --key-file: {exc}") from None
        registration = clusters.ClusterRegistration(
            name=name,
            host=options["host"],
            port=options["port"],
            scheduler=options["scheduler"],
            host_key=options["host_key"] or "",
            username=options["user"],
            private_key=pem,
            shared=options["shared"],
            agent_route=options["agent_route"],
            relay_host=options["relay_host"],
            relay_port=options["relay_port"],
        )
        existing = Cluster.objects.filter(name=name).first()
        # Wrong input is told before the host key is fetched and the operator asked about it.
        errors = clusters.registration_errors(registration, cluster=existing)
        if errors:
            raise CommandError(described(errors))
        if options["host_key"] is None:
            host_key = self.trusted_host_key(options["host"], options["port"], yes=options["yes"])
            registration = replace(registration, host_key=host_key)
        try:
            registered = clusters.register_cluster(registration, cluster=existing, probe_now=True)
        except ValidationError as exc:
            raise CommandError(described(exc.message_dict)) from None
        cluster = registered.cluster
        mode = "shared: every user acts as " + cluster.username if cluster.shared else "per-user"
        self.stdout.write(
            f"Cluster {name} saved with host key {fingerprint(cluster.host_key)} (accounts: "
            f"{mode}; agents: {cluster.get_agent_route_display()})"
        )
        if registered.answered is None:
            self.stdout.write("No account of its own: environments are not detected; add them.")
            return
        cluster.refresh_from_db()
        if not registered.answered:
            raise CommandError(f"saved, but the cluster did not answer: {cluster.last_error}")
        for env in cluster.environments.all():
            self.stdout.write(
                f"  environment {env.name}: {env.nodes_available}/{env.nodes_total} nodes free"
            )

    def trusted_host_key(self, host: str, port: int, *, yes: bool) -> str:
        """The key the host shows, once the operator trusts it."""
        try:
            host_key = fetch_host_key(host, port, timeout=10)
        except HostKeyUnreadable as exc:
            raise CommandError(f"cannot reach {host}: {exc}") from None
        self.stdout.write(f"Host key of {host}:{port}: {host_key}")
        self.stdout.write(f"Fingerprint: {fingerprint(host_key)}")
        if not yes:
            if not sys.stdin.isatty():
                raise CommandError("not a terminal: confirm with --yes or pass --host-key")
            if input("Trust and pin this key? [y/N] ").strip().lower() not in {"y", "yes"}:
                raise CommandError("host key not trusted; nothing saved")
        return host_key


# The registration's fields as this command's options name them.
OPTIONS = {
    "username": "--user",
    "private_key": "--key-file",
    "host_key": "--host-key",
    "shared": "--shared",
    "agent_route": "--agent-route",
    "relay_host": "--relay-host",
    "relay_port": "--relay-port",
    "scheduler": "--scheduler",
    "host": "--host",
    "port": "--port",
}


def described(errors: dict[str, list[str]]) -> str:
    """One line naming each option that is wrong."""
    return "; ".join(
        message if field == NON_FIELD_ERRORS else f"{OPTIONS.get(field, field)}: {message}"
        for field, messages in errors.items()
        for message in messages
    )
