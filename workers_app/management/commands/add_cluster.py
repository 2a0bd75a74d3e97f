from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers_app import clusters
from workers_app.models import AgentRoute, Cluster, SchedulerKind
from workers_app.transport.hostkeys import HostKeyUnreadable, fetch_host_key, fingerprint


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
        parser.add_argument("--scheduler", required=True, choices=SchedulerKind.values)
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
        if bool(options["user"]) != bool(options["key_file"]):
            raise CommandError("--user and --key-file go together (the cluster's own account)")
        if options["shared"] and not options["user"]:
            raise CommandError("--shared needs the account users share: --user and --key-file")
        pem = ""
        if options["key_file"]:
            try:
                pem = options["key_file"].read_text()
            except OSError as exc:
                raise CommandError(f"cannot read --key-file: {exc}") from None
            if "PRIVATE KEY" not in pem:
                raise CommandError("--key-file does not look like a private key")
        host_key: str | None = options["host_key"]
        if host_key is None:
            try:
                host_key = fetch_host_key(options["host"], options["port"], timeout=10)
            except HostKeyUnreadable as exc:
                raise CommandError(f"cannot reach {options['host']}: {exc}") from None
            self.stdout.write(f"Host key of {options['host']}:{options['port']}: {host_key}")
            self.stdout.write(f"Fingerprint: {fingerprint(host_key)}")
            if not options["yes"]:
                if not sys.stdin.isatty():
                    raise CommandError("not a terminal: confirm with --yes or pass --host-key")
                if input("Trust and pin this key? [y/N] ").strip().lower() not in {"y", "yes"}:
                    raise CommandError("host key not trusted; nothing saved")
        try:
            fingerprint(host_key)
        except ValueError as exc:
            raise CommandError(f"--host-key: {exc}") from None
        cluster = Cluster.objects.filter(name=name).first() or Cluster(name=name)
        cluster.host, cluster.port, cluster.username = (
            options["host"],
            options["port"],
            options["user"],
        )
        cluster.scheduler, cluster.host_key = options["scheduler"], host_key
        cluster.shared = options["shared"]
        cluster.agent_route = options["agent_route"]
        cluster.relay_host, cluster.relay_port = options["relay_host"], options["relay_port"]
        cluster.private_key_encrypted = ""
        if pem:
            cluster.set_private_key(pem)
        try:
            cluster.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        cluster.save()
        mode = "shared: every user acts as " + cluster.username if cluster.shared else "per-user"
        self.stdout.write(
            f"Cluster {name} saved with host key {fingerprint(host_key)} (accounts: {mode}; "
            f"agents: {cluster.get_agent_route_display()})"
        )
        if not pem:
            self.stdout.write("No account of its own: environments are not detected; add them.")
        elif clusters.probe_cluster(cluster.pk):
            cluster.refresh_from_db()
            for env in cluster.environments.all():
                self.stdout.write(
                    f"  environment {env.name}: {env.nodes_available}/{env.nodes_total} nodes free"
                )
        else:
            cluster.refresh_from_db()
            raise CommandError(f"saved, but the cluster did not answer: {cluster.last_error}")
