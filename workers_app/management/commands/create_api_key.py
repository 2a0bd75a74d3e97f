from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers_app.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for a user and print it. It is shown only this once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="What the key is for, e.g. 'laptop'.")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        user_model = get_user_model()
        user = user_model.objects.filter(**{user_model.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive; its keys would not work")
        _, secret = ApiKey.issue(user, name=name)
        self.stdout.write(secret)
        self.stderr.write("Store this key now: it cannot be shown again.")
