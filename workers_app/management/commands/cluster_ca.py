from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from identity.certificates import sshd_instructions
from workers_app.actions.clusters import make_cluster_authority, remove_cluster_authority
from workers_app.models import Cluster


class Command(BaseCommand):
    help = (
        "Make the platform a cluster's SSH certificate authority (kept if it is one), and print "
        "the CA's public line and the sshd_config lines its login hosts need."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("cluster")
        change = parser.add_mutually_exclusive_group()
        change.add_argument("--rotate", action="store_true", help="Replace the CA's key.")
        change.add_argument("--remove", action="store_true", help="Sign no more certificates.")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster {options['cluster']!r}")
        if options["remove"]:
            remove_cluster_authority(cluster)
            self.stdout.write(f"{cluster.name}: the platform signs no more certificates for it")
            return
        public = make_cluster_authority(cluster, rotate=options["rotate"])
        self.stdout.write(public)
        self.stderr.write(sshd_instructions(public))
