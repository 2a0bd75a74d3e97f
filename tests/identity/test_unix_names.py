"""A person's Unix name on a cluster, by the cluster's rule."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AbstractUser

from identity.models import Identity, Source
from identity.unix_names import RuleInvalid, check_rule, site_name_of, unix_name, unix_name_on


@pytest.mark.parametrize(
    ("site_name", "rule", "match", "replace", "expected"),
    [
        ("PWCarol", "as_is", "", "", "PWCarol"),
        ("PWCarol", "lower", "", "", "pwcarol"),
        ("carol@example.org", "regex", r"^(.+)@example\.org$", r"\1", "carol"),
        ("carol@elsewhere.org", "regex", r"^(.+)@example\.org$", r"\1", None),
        ("Carol.Smith", "regex", r"^(\w)\w*\.(\w+)$", r"\1\2", "CSmith"),
        ("carol smith", "as_is", "", "", None),  # not a Unix name
        ("-rf", "lower", "", "", None),
        ("a" * 33, "as_is", "", "", None),
        ("x;id", "regex", r"^(.*)$", r"\1", None),
    ],
)
def test_each_rule_maps_or_refuses(
    site_name: str, rule: str, match: str, replace: str, expected: str | None
) -> None:
    assert unix_name(site_name, rule, match, replace) == expected


@pytest.mark.parametrize(
    ("match", "replace", "problem"),
    [("(", r"\1", "does not compile"), ("^a$", r"\1", "names a group"), ("", "x", "both")],
)
def test_an_unusable_regex_rule_is_named(match: str, replace: str, problem: str) -> None:
    with pytest.raises(RuleInvalid, match=problem):
        check_rule("regex", match, replace)


@pytest.mark.django_db
def test_the_site_name_comes_from_the_identity_else_the_platform_user_name(
    user: AbstractUser,
) -> None:
    assert site_name_of(user) == user.get_username()

    Identity.objects.create(user=user, source=Source.OIDC, subject="s-1", site_name="PWCarol")
    user.refresh_from_db()

    assert site_name_of(user) == "PWCarol"

    class Lower:
        unix_name_rule, unix_name_match, unix_name_replace = "lower", "", ""

    class Broken:
        unix_name_rule, unix_name_match, unix_name_replace = "regex", "(", r"\1"

    assert unix_name_on(user, Lower()) == "pwcarol"
    assert unix_name_on(user, Broken()) is None
