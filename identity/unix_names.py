"""A person's Unix name on a cluster, made from the name their site gives them by the
cluster's rule (as is, lower-cased, or a regular expression map as Open OnDemand's
user_map_match), unless an operator set one for them."""

from __future__ import annotations

import re
from typing import Protocol

from django.contrib.auth.models import AbstractBaseUser

# POSIX portable user names (useradd's default rule, plus upper case some sites allow).
UNIX_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
AS_IS, LOWER, REGEX = "as_is", "lower", "regex"


class RuleInvalid(ValueError):
    """An operator's rule cannot be applied (a pattern that does not compile)."""


def site_name_of(user: AbstractBaseUser) -> str:
    """The name the site gives ``user``: from their single sign-on or directory entry, else
    their platform user name."""
    identity = getattr(user, "identity", None)
    if identity is not None and identity.site_name:
        return str(identity.site_name)
    return str(user.get_username())


def check_rule(rule: str, match: str, replace: str) -> None:
    if rule != REGEX:
        return
    if not match or not replace:
        raise RuleInvalid("a regular expression map needs both a pattern and a replacement")
    try:
        compiled = re.compile(match)
    except re.error as exc:
        raise RuleInvalid(f"the pattern does not compile: {exc}") from None
    if compiled.groups < max((int(n) for n in re.findall(r"\\(\d+)", replace)), default=0):
        raise RuleInvalid("the replacement names a group the pattern does not have")


def unix_name(site_name: str, rule: str, match: str = "", replace: str = "") -> str | None:
    """The Unix name ``rule`` makes of ``site_name``; None when the rule maps it to nothing
    (no match, or not a valid Unix name)."""
    if rule == LOWER:
        candidate = site_name.lower()
    elif rule == REGEX:
        check_rule(rule, match, replace)
        found = re.fullmatch(match, site_name)
        if found is None:
            return None
        candidate = found.expand(replace)
    else:
        candidate = site_name
    return candidate if UNIX_NAME.fullmatch(candidate) else None


class NamingCluster(Protocol):
    unix_name_rule: str
    unix_name_match: str
    unix_name_replace: str


def unix_name_on(user: AbstractBaseUser, cluster: NamingCluster) -> str | None:
    """``user``'s Unix name by ``cluster``'s rule; None when it maps them to nothing (an
    operator's override is an account of its own, not a rule)."""
    try:
        return unix_name(
            site_name_of(user),
            cluster.unix_name_rule,
            cluster.unix_name_match,
            cluster.unix_name_replace,
        )
    except RuleInvalid:
        return None
