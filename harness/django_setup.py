"""Django for a benchmark or drill run outside pytest: its own PostgreSQL database (created when
missing, then migrated) and its own Redis number."""

from __future__ import annotations

import os
import sys
from urllib.parse import unquote, urlparse

from harness import REPO, HarnessError

# Used when the caller sets nothing (make bench / make drills set both).
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/activate_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/5"


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database named in ``url`` if it does not exist yet."""
    import psycopg
    from psycopg import sql

    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise HarnessError(f"benchmarks and drills need PostgreSQL; DATABASE_URL is {url!r}")
    name = unquote(parsed.path.lstrip("/"))
    try:
        with psycopg.connect(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 5432,
            user=unquote(parsed.username or "postgres"),
            password=unquote(parsed.password) if parsed.password else None,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                print(f"created database {name}", file=sys.stderr)
    except psycopg.OperationalError as exc:
        raise HarnessError(f"cannot reach PostgreSQL at {parsed.hostname}: {exc}") from None


def prepare_django(installation: str) -> None:
    """Point Django at the run's database and Redis, create and migrate the database.

    ``installation`` becomes ACTIVATE_INSTALLATION_ID (unless set): the run's jobs are named
    apart from the test suite's on the shared cluster account.
    """
    os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
    os.environ.setdefault("ACTIVATE_LOG_LEVEL", "WARNING")
    os.environ.setdefault("ACTIVATE_INSTALLATION_ID", installation)
    os.environ["DJANGO_SETTINGS_MODULE"] = "activate.settings.test"
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
