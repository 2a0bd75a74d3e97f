"""What the worker domain knows of relays: the address a job script gives its agent
(``addresses``) and the AgentRelay rows keepers write and sweeps read (``records``). The keepers
themselves run in the agents' room (``agents/relays``)."""

from __future__ import annotations

from workers_app.relays.addresses import (
    RelayNotReady,
    agent_url_for,
    relay_fingerprint,
    relay_tag,
    upstream_address,
)
from workers_app.relays.records import (
    clusters_agents_cannot_reach,
    note_started,
    stop_unwanted_relays,
)

__all__ = [
    "RelayNotReady",
    "agent_url_for",
    "clusters_agents_cannot_reach",
    "note_started",
    "relay_fingerprint",
    "relay_tag",
    "stop_unwanted_relays",
    "upstream_address",
]
