"""manage.py import_apps FILE...: create or update operators' apps from YAML, all or none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.catalog.yaml_files import CatalogFileError, import_files


class Command(BaseCommand):
    help = "Create or update session apps from YAML files (by name; nothing changes on an error)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            done = import_files(Path(name) for name in options["files"])
        except CatalogFileError as exc:
            raise CommandError(f"nothing imported:\n{exc}") from None
        for name, created in done:
            self.stdout.write(f"{'created' if created else 'updated'} {name}")
