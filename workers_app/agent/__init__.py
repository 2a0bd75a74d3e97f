"""The node agent: a standard-library-only script that job scripts run on compute nodes."""

from __future__ import annotations

from pathlib import Path

AGENT_SOURCE_PATH = Path(__file__).with_name("activate_agent.py")


def agent_source() -> str:
    return AGENT_SOURCE_PATH.read_text()
