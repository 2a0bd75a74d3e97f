"""The node agent and the login host's relay: standard-library-only scripts the platform runs on
clusters (the agent in job scripts on compute nodes, the relay over SSH on login hosts)."""

from __future__ import annotations

from pathlib import Path

AGENT_SOURCE_PATH = Path(__file__).with_name("activate_agent.py")
RELAY_SOURCE_PATH = Path(__file__).with_name("activate_relay.py")


def agent_source() -> str:
    return AGENT_SOURCE_PATH.read_text()


def relay_source() -> str:
    return RELAY_SOURCE_PATH.read_text()
