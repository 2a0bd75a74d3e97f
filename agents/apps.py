from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """The agents' server: no models of its own, its management command runs the relays."""

    name = "agents"
    verbose_name = "Agents"
