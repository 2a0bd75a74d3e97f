"""What runs on clusters: standard-library-only scripts the platform sends there and that import
nothing of the server. The node agent (in job scripts on compute nodes), the login host's relay
(over SSH), a session's launcher and its kinds' starters (``starters/``, one per session kind)."""

from __future__ import annotations

from pathlib import Path

AGENT_SOURCE_PATH = Path(__file__).with_name("activate_agent.py")
RELAY_SOURCE_PATH = Path(__file__).with_name("activate_relay.py")
SESSION_LAUNCHER_PATH = Path(__file__).with_name("activate_session.py")
STARTERS_PATH = Path(__file__).with_name("starters")


def agent_source() -> str:
    return AGENT_SOURCE_PATH.read_text()


def relay_source() -> str:
    return RELAY_SOURCE_PATH.read_text()


def session_launcher_source() -> str:
    return SESSION_LAUNCHER_PATH.read_text()


def starter_source(kind: str) -> str:
    """The starter of the session kind named ``kind`` (``starters/<kind>.py``)."""
    return (STARTERS_PATH / f"{kind}.py").read_text()
