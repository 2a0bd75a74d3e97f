"""An operator's naming rule is checked when the cluster is saved, not when a person first
needs it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.exceptions import ValidationError

from workers_app.models import Cluster

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("match", "replace", "problem"),
    [("(", r"\1", "does not compile"), (r"^(\w+)$", r"\2", "names a group")],
)
def test_a_cluster_with_an_unusable_naming_rule_is_refused(
    make_cluster: Callable[..., Cluster], match: str, replace: str, problem: str
) -> None:
    cluster = make_cluster("named")
    cluster.unix_name_rule, cluster.unix_name_match, cluster.unix_name_replace = (
        "regex",
        match,
        replace,
    )

    with pytest.raises(ValidationError, match=problem):
        cluster.full_clean()

    cluster.unix_name_replace = r"\1"
    cluster.unix_name_match = r"^(\w+)@site$"
    cluster.full_clean()
