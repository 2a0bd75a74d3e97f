from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ParameterError
from workers_app.actions.cluster_accounts import connect_account, verify_account
from workers_app.models import AccountOrigin, Cluster


class Command(BaseCommand):
    help = "Map a platform user to their own account on a cluster, and verify the login."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="The platform user.")
        parser.add_argument("cluster")
        parser.add_argument("--remote-user", required=True, help="Their user name on the cluster.")
        parser.add_argument("--key-file", required=True, type=Path, help="Their private key.")
        parser.add_argument("--no-verify", action="store_true", help="Do not try the login now.")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no platform user {options['username']!r}")
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster {options['cluster']!r}")
        try:
            pem = options["key_file"].read_text()
        except OSError as exc:
            raise CommandError(f"cannot read --key-file: {exc}") from None
        try:
            account = connect_account(
                user,
                cluster,
                remote_username=options["remote_user"],
                private_key=pem,
                origin=AccountOrigin.OPERATOR,
            )
        except ParameterError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{user.get_username()} acts on {cluster.name} as {account}")
        if options["no_verify"]:
            return
        if not verify_account(account):
            raise CommandError(f"saved, but the login failed: {account.last_error}")
        self.stdout.write("verified: the cluster accepted the login")
