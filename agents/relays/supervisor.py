"""What one `run_relays` process keeps: a keeper per via-login-host cluster whose lease it took."""

from __future__ import annotations

from django.db import close_old_connections

from agents.relays.keeper import RelayKeeper
from agents.relays.lease import Lease
from core.lease import holder_name
from workers_app.models import AgentRoute, Cluster, RelayState
from workers_app.relays.addresses import relay_fingerprint
from workers_app.relays.records import stop_unwanted_relays


class RelaySupervisor:
    """What one `run_relays` process keeps: a keeper per via-login-host cluster whose lease it
    could take. Another process holding a lease is left alone; its keeper's death frees it."""

    def __init__(self) -> None:
        self.holder = holder_name()
        self.keepers: dict[int, RelayKeeper] = {}

    def step(self) -> int:
        """Start, stop and restart keepers to match the clusters; returns how many it holds."""
        close_old_connections()
        wanted = {
            cluster.pk: cluster
            for cluster in Cluster.objects.filter(agent_route=AgentRoute.VIA_LOGIN_HOST)
        }
        for cluster_id, keeper in list(self.keepers.items()):
            cluster = wanted.get(cluster_id)
            if cluster is None:
                keeper.stop(state=RelayState.STOPPED, why="the cluster's agents go direct now")
            elif keeper.fingerprint != relay_fingerprint(cluster):
                keeper.stop(state=RelayState.DOWN, why="the cluster's settings changed")
            elif not keeper.is_alive():
                keeper.stop(state=RelayState.DOWN, why="its keeper ended")
            else:
                continue
            del self.keepers[cluster_id]
        for cluster_id, cluster in wanted.items():
            if cluster_id in self.keepers:
                continue
            lease = Lease(cluster_id)
            if lease.take():
                keeper = RelayKeeper(cluster, lease, holder=self.holder)
                self.keepers[cluster_id] = keeper
                keeper.start()
        stop_unwanted_relays()
        return len(self.keepers)

    def stop_all(self) -> None:
        for keeper in self.keepers.values():
            keeper.stop(state=RelayState.DOWN, why=f"run_relays {self.holder} stopped")
        self.keepers.clear()
