"""What `pw files` reads of the files API and sends to it is what the API documents."""

from __future__ import annotations

from typing import Any

import pytest
from activate_cli import files
from rest_framework.test import APIClient

from tests.cli.test_schema_contract import resolved

pytestmark = pytest.mark.django_db

Schema = dict[str, Any]
PREFIX = "/api/clusters/{cluster}/files/"


@pytest.fixture
def schema() -> Schema:
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def test_the_entry_types_pw_shows_are_the_ones_the_api_documents(schema: Schema) -> None:
    entry = schema["components"]["schemas"]["Entry"]["properties"]

    assert list(files.ENTRY_TYPES) == resolved(schema, entry["type"])["enum"]
    assert {"name", "mode", "size", "mtime", "type"} <= set(entry)


def test_what_pw_files_sends_is_what_the_api_takes(schema: Schema) -> None:
    listing = schema["paths"][PREFIX]["get"]["parameters"]
    assert {"path_b64"} <= {p["name"] for p in listing}
    for action in ("mkdir", "delete"):
        body = schema["paths"][f"{PREFIX}{action}/"]["post"]["requestBody"]
        fields = resolved(schema, body["content"]["application/json"]["schema"])["properties"]
        assert "path_b64" in fields
    delete = schema["paths"][f"{PREFIX}delete/"]["post"]["requestBody"]
    assert (
        "recursive"
        in resolved(schema, delete["content"]["application/json"]["schema"])["properties"]
    )
