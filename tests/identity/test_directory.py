"""The tests' LDAP directory (scripts/directory.sh, Debian's slapd) as django-auth-ldap will use
it: people bind with their password, groups are groupOfNames with member DNs, and a bound person
reads the groups but no one's password."""

from __future__ import annotations

from collections.abc import Iterator

import ldap
import pytest

from harness.identity import DAVE, ERIN, DirectorySettings, directory_settings


@pytest.fixture(scope="module")
def directory() -> DirectorySettings:
    return directory_settings()


@pytest.fixture
def as_dave(directory: DirectorySettings) -> Iterator[ldap.ldapobject.LDAPObject]:
    connection = ldap.initialize(directory.url)
    connection.simple_bind_s(directory.person_dn(DAVE.uid), DAVE.password)
    yield connection
    connection.unbind_s()


def groups_of(
    connection: ldap.ldapobject.LDAPObject, directory: DirectorySettings, uid: str
) -> set[str]:
    found = connection.search_s(
        directory.groups_dn,
        ldap.SCOPE_SUBTREE,
        f"(&(objectClass=groupOfNames)(member={directory.person_dn(uid)}))",
        ["cn"],
    )
    return {attrs["cn"][0].decode() for _dn, attrs in found}


def test_a_person_binds_with_their_password_and_not_another(directory: DirectorySettings) -> None:
    connection = ldap.initialize(directory.url)
    connection.simple_bind_s(directory.person_dn(DAVE.uid), DAVE.password)
    assert connection.whoami_s() == f"dn:{directory.person_dn(DAVE.uid)}"
    connection.unbind_s()
    for password in ("dave-pass-2", ERIN.password):
        with pytest.raises(ldap.INVALID_CREDENTIALS):
            ldap.initialize(directory.url).simple_bind_s(directory.person_dn(DAVE.uid), password)


def test_the_groups_and_the_person_as_seeded(
    as_dave: ldap.ldapobject.LDAPObject, directory: DirectorySettings
) -> None:
    assert groups_of(as_dave, directory, DAVE.uid) == set(DAVE.groups) == {"hpc-users"}
    assert groups_of(as_dave, directory, ERIN.uid) == set(ERIN.groups) == {"gpu-users"}
    [(_dn, dave)] = as_dave.search_s(
        directory.people_dn, ldap.SCOPE_ONELEVEL, f"(uid={DAVE.uid})", ["cn", "mail"]
    )
    assert dave == {"cn": [b"Dave Directory"], "mail": [b"dave@activate.test"]}


def test_no_one_reads_a_password_and_strangers_read_nothing(
    as_dave: ldap.ldapobject.LDAPObject, directory: DirectorySettings
) -> None:
    [(_dn, erin)] = as_dave.search_s(directory.person_dn(ERIN.uid), ldap.SCOPE_BASE)
    assert "uid" in erin and "userPassword" not in erin
    anonymous = ldap.initialize(directory.url)
    with pytest.raises(ldap.NO_SUCH_OBJECT):
        anonymous.search_s(directory.people_dn, ldap.SCOPE_ONELEVEL, "(uid=*)")


def test_the_service_account_searches_people(directory: DirectorySettings) -> None:
    # What django-auth-ldap does before it binds as the person: find them by uid.
    connection = ldap.initialize(directory.url)
    connection.simple_bind_s(directory.bind_dn, directory.bind_password)
    found = connection.search_s(directory.people_dn, ldap.SCOPE_ONELEVEL, "(uid=pwdave)", ["uid"])
    assert [dn for dn, _attrs in found] == [directory.person_dn(DAVE.uid)]
    connection.unbind_s()
