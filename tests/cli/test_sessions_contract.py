"""What `pw sessions` spells out of the API is checked against the platform's OpenAPI schema."""

from __future__ import annotations

import pytest
from activate_cli import sessions

from tests.cli.test_schema_contract import Schema, resolved, schema  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db


def test_session_statuses_are_the_ones_the_api_documents(schema: Schema) -> None:  # noqa: F811
    session = schema["components"]["schemas"]["Session"]["properties"]
    listing = schema["paths"]["/api/sessions/"]["get"]["parameters"]
    status_filter = next(p for p in listing if p["name"] == "status")
    assert list(sessions.SESSION_STATUSES) == resolved(schema, session["status"])["enum"]
    assert set(sessions.SESSION_STATUSES) == set(status_filter["schema"]["enum"])


def test_the_session_types_pw_reads_are_a_documented_list_of_name_label_description(
    schema: Schema,  # noqa: F811
) -> None:
    # pw spells no type out: it asks the server's list, documented as such.
    answer = schema["paths"]["/api" + sessions.KINDS_PATH]["get"]["responses"]["200"]
    listed = answer["content"]["application/json"]["schema"]
    assert listed["type"] == "array"
    kind = resolved(schema, listed["items"])
    assert {"name", "label", "description"} <= set(kind["properties"])


def test_the_session_fields_pw_reads_are_the_ones_the_api_documents(schema: Schema) -> None:  # noqa: F811
    session = schema["components"]["schemas"]["Session"]["properties"]
    read = {
        "id",
        "name",
        "type",
        "status",
        "reason",
        "url",
        "cluster",
        "environment",
        "partition",
        "node",
        "job_id",
        "worker",
        "worker_status",
        "dedicated_worker",
        "created_at",
        "started_at",
        "ended_at",
    }
    assert read <= set(session)
    create = schema["components"]["schemas"]["SessionCreateRequest"]["properties"]
    assert {"type", "cluster", "environment", "worker", "params", "name"} <= set(create)
