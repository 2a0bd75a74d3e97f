"""What pw spells out of the API is checked against the platform's own OpenAPI schema."""

from __future__ import annotations

from typing import Any

import pytest
from activate_cli import clusters, statuses, workers
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

Schema = dict[str, Any]


@pytest.fixture
def schema() -> Schema:
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def resolved(schema: Schema, node: Schema) -> Schema:
    """A property's own schema, through drf-spectacular's `allOf: [$ref]` and nullable wrappers."""
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/components/schemas/")
        return resolved(schema, schema["components"]["schemas"][name])
    for combined in ("allOf", "oneOf", "anyOf"):
        parts = [p for p in node.get(combined, []) if p.get("type") != "null" and p != {}]
        if len(parts) == 1:
            return resolved(schema, parts[0])
    return node


def test_worker_statuses_are_the_ones_the_api_documents(schema: Schema) -> None:
    worker = schema["components"]["schemas"]["Worker"]["properties"]
    listing = schema["paths"]["/api/workers/"]["get"]["parameters"]
    [status_filter] = [p for p in listing if p["name"] == "status"]

    assert list(statuses.STATUSES) == resolved(schema, worker["status"])["enum"]
    assert set(statuses.STATUSES) == set(status_filter["schema"]["enum"])
    assert set(workers.ENDINGS) <= set(statuses.STATUSES)


def test_the_account_fields_pw_reads_are_the_ones_the_api_documents(schema: Schema) -> None:
    cluster = schema["components"]["schemas"]["Cluster"]["properties"]
    assert "account" in cluster, "the API no longer describes a cluster's account; pw reads it"

    account = resolved(schema, cluster["account"])

    assert cluster["shared"]["type"] == "boolean"
    assert set(clusters.ACCOUNT_FIELDS) <= set(account["properties"])
    assert list(clusters.LOGINS) == resolved(schema, cluster["login"])["enum"]
    assert cluster["unix_name"]["type"] == "string"


def test_the_agent_routes_and_relay_states_pw_shows_are_the_ones_the_api_documents(
    schema: Schema,
) -> None:
    cluster = schema["components"]["schemas"]["Cluster"]["properties"]

    assert list(clusters.AGENT_ROUTES) == resolved(schema, cluster["agent_route"])["enum"]
    documented = {
        state
        for part in cluster["relay_state"]["oneOf"]
        for state in resolved(schema, part)["enum"]
        if state is not None
    }
    assert set(clusters.RELAY_STATES) == documented


def test_what_pw_cluster_connect_sends_is_what_the_api_takes(schema: Schema) -> None:
    connect = schema["paths"].get("/api/clusters/{name}/account/", {}).get("post")
    assert connect is not None, (
        "the API no longer takes a cluster account; pw cluster connect sends it"
    )

    body = resolved(schema, connect["requestBody"]["content"]["application/json"]["schema"])

    assert set(body["properties"]) == {"remote_username", "private_key"}
    assert body["required"] == ["remote_username"]
