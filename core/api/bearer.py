"""The Authorization scheme of API keys, shared by the REST API and the WebSockets."""

from __future__ import annotations

KEYWORD = "Bearer"
