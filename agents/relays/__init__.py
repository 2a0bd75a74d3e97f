"""Relays on login hosts: how agents reach the platform on clusters whose compute nodes cannot.

A cluster in via-login-host mode gets a relay on its login host (``transport/tunnel.py``) that
`run_relays` (``scripts/start.sh relays``) keeps: a keeper thread per cluster holds a Redis lease
(one relay per cluster and installation, whatever the number of run_relays processes), checks the
SSH connection and the relay process, and sets both up again when either is lost. Job scripts
of such a cluster give agents the relay's address, which stays the same across repairs. What
each keeper sees is written to the cluster's AgentRelay row, for the admin, the API and `pw`.

What job scripts are told and the AgentRelay rows are the worker domain's
(``workers_app/relays``).

- ``lease``: the Redis lease (over ``core/lease.py``), one holder per cluster and installation
- ``keeper``: one cluster's relay kept up on a thread of its own
- ``supervisor``: what one `run_relays` process keeps
"""

from __future__ import annotations

from agents.relays.keeper import RelayKeeper, tunnel_for
from agents.relays.supervisor import RelaySupervisor

__all__ = ["RelayKeeper", "RelaySupervisor", "tunnel_for"]
