"""The site's directory (LDAP) through django-auth-ldap: its AUTH_LDAP_* settings made from
ACTIVATE_LDAP_* variables. What a sign-in records is in `identity.sign_in`.

The password form stays as it is: Django tries the local accounts first, then the directory.
"""

from __future__ import annotations

from typing import Any

import ldap
from django_auth_ldap.config import GroupOfNamesType, LDAPSearch, PosixGroupType

from core.env import ConfigurationError, EnvReader

GROUP_TYPES = {"groupOfNames": GroupOfNamesType, "posixGroup": PosixGroupType}


def ldap_settings(env: EnvReader) -> dict[str, Any]:
    """ACTIVATE_LDAP_URL and its companions as django-auth-ldap's settings, plus the two the
    platform reads itself (ACTIVATE_LDAP_UNIX_ATTRIBUTE, ACTIVATE_LDAP_GROUP_BASE). An empty
    URL means no directory: nothing but those two, empty."""
    url = env.matching(
        "ACTIVATE_LDAP_URL",
        "",
        pattern=r"|ldaps?://\S+",
        meaning="empty or an ldap:// or ldaps:// URL",
    )
    unix_attribute = env.matching(
        "ACTIVATE_LDAP_UNIX_ATTRIBUTE",
        "uid",
        pattern=r"[A-Za-z][A-Za-z0-9-]*",
        meaning="an LDAP attribute name",
    )
    group_base = env.string("ACTIVATE_LDAP_GROUP_BASE", "")
    own = {"ACTIVATE_LDAP_URL": url, "ACTIVATE_LDAP_UNIX_ATTRIBUTE": unix_attribute}
    if not url:
        return {**own, "ACTIVATE_LDAP_GROUP_BASE": ""}
    user_base = env.optional_string("ACTIVATE_LDAP_USER_BASE")
    if user_base is None:
        raise ConfigurationError("ACTIVATE_LDAP_USER_BASE must be set when ACTIVATE_LDAP_URL is")
    user_filter = env.string("ACTIVATE_LDAP_USER_FILTER", "(uid=%(user)s)")
    if "%(user)s" not in user_filter:
        raise ConfigurationError(
            f"ACTIVATE_LDAP_USER_FILTER must contain %(user)s, got {user_filter!r}"
        )
    group_type = env.matching(
        "ACTIVATE_LDAP_GROUP_TYPE",
        "groupOfNames",
        pattern="|".join(GROUP_TYPES),
        meaning=" or ".join(GROUP_TYPES),
    )
    found: dict[str, Any] = {
        **own,
        "ACTIVATE_LDAP_GROUP_BASE": group_base,
        "AUTH_LDAP_SERVER_URI": url,
        "AUTH_LDAP_BIND_DN": env.string("ACTIVATE_LDAP_BIND_DN", ""),
        "AUTH_LDAP_BIND_PASSWORD": env.string("ACTIVATE_LDAP_BIND_PASSWORD", ""),
        "AUTH_LDAP_START_TLS": env.boolean("ACTIVATE_LDAP_START_TLS", False),
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(user_base, ldap.SCOPE_SUBTREE, user_filter),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        # A directory that does not answer fails the login within seconds, not minutes.
        "AUTH_LDAP_CONNECTION_OPTIONS": {ldap.OPT_NETWORK_TIMEOUT: 5, ldap.OPT_TIMEOUT: 10},
    }
    if group_base:
        found["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(group_base, ldap.SCOPE_SUBTREE)
        found["AUTH_LDAP_GROUP_TYPE"] = GROUP_TYPES[group_type](name_attr="cn")
    return found
