"""`pw usage` against the live test server: the month's node-hours, to the second."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import AbstractUser

from tests.cli.conftest import Pw
from tests.workers.api.test_usage import november  # noqa: F401 - a fixture, found by pytest here
from workers_app.models import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_pw_usage_shows_a_months_node_hours_to_the_second(
    pw: Pw,
    user: AbstractUser,
    november: list[Worker],  # noqa: F811
) -> None:
    result = pw("usage", "--month", "2026-11")

    assert result.returncode == 0, result.stderr
    header, row, total = result.stdout.splitlines()
    assert header.split() == ["CLUSTER", "ACCOUNT", "WORKERS", "NODE-HOURS", "H:MM:SS"]
    assert row.split() == ["test-slurm", "(shared)", "4", "1.5458", "1:32:45"]
    assert total == "total 1.5458 node-hours (1:32:45) in 2026-11"
    body = json.loads(pw("usage", "--month", "2026-11", "-o", "json").stdout)
    assert body["node_seconds"] == 5565
    empty = pw("usage", "--month", "2026-09")
    assert empty.stdout.strip() == "no worker was connected in 2026-09"
    refused = pw("usage", "--month", "nov")
    assert refused.returncode != 0 and "month: must be YYYY-MM" in refused.stderr
