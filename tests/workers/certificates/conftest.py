from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.identity import trusted_user_ca
from workers_app import cluster_access
from workers_app.actions.clusters import make_cluster_authority
from workers_app.models import Cluster


@pytest.fixture
def ca_cluster(make_cluster) -> Iterator[Cluster]:
    """A per-user cluster whose sshd trusts the platform's CA for it; its rule makes the test
    users' Unix names of their platform names (alice: pwalice, bob: pwbob)."""
    cluster: Cluster = make_cluster(
        name="campus",
        shared=False,
        unix_name_rule="regex",
        unix_name_match=r"^([a-z]+)$",
        unix_name_replace=r"pw\1",
    )
    make_cluster_authority(cluster)
    with trusted_user_ca(cluster.ca_public_key):
        yield cluster
    cluster_access.close_all_connections()
