"""Relays on login hosts: how agents reach the platform on clusters whose compute nodes cannot.

A cluster in via-login-host mode gets a relay on its login host (``transport/tunnel.py``) that
`run_relays` (``scripts/start.sh relays``) keeps: a keeper thread per cluster holds a Redis lease
(one relay per cluster and installation, whatever the number of run_relays processes), checks the
SSH connection and the relay process, and sets both up again when either is lost. Job scripts
of such a cluster give agents the relay's address, which stays the same across repairs. What
each keeper sees is written to the cluster's AgentRelay row, for the admin, the API and `pw`.

- ``addresses``: what job scripts are told, and what names and places a relay
- ``records``: the AgentRelay rows: what keepers note, what operators and sweeps read
- ``lease``: the Redis lease, one holder per cluster and installation
- ``keeper``: one cluster's relay kept up on a thread of its own
- ``supervisor``: what one `run_relays` process keeps
"""

from __future__ import annotations

from workers_app.agents.relays.addresses import (
    RelayNotReady,
    agent_url_for,
    relay_fingerprint,
    relay_tag,
    upstream_address,
)
from workers_app.agents.relays.keeper import RelayKeeper, tunnel_for
from workers_app.agents.relays.lease import Lease, holder_name
from workers_app.agents.relays.records import (
    clusters_agents_cannot_reach,
    note_started,
    stop_unwanted_relays,
)
from workers_app.agents.relays.supervisor import RelaySupervisor

__all__ = [
    "Lease",
    "RelayKeeper",
    "RelayNotReady",
    "RelaySupervisor",
    "agent_url_for",
    "clusters_agents_cannot_reach",
    "holder_name",
    "note_started",
    "relay_fingerprint",
    "relay_tag",
    "stop_unwanted_relays",
    "tunnel_for",
    "upstream_address",
]
