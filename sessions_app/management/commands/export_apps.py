"""manage.py export_apps [NAME...]: operators' apps as YAML (what import_apps reads back)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.catalog import store
from sessions_app.catalog.yaml_files import dump


class Command(BaseCommand):
    help = "Print session apps as YAML, one document each (all of them without names)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", metavar="NAME")

    def handle(self, *args: Any, **options: Any) -> None:
        names = options["names"]
        specs = store.all_specs(names)
        missing = sorted(set(names) - {spec.name for spec in specs})
        if missing:
            raise CommandError(f"no app named {', '.join(missing)}")
        self.stdout.write(dump(specs), ending="")
