"""DATABASE_URL with libpq's several hosts (a primary and its standbys), and what is refused."""

from __future__ import annotations

import pytest

from core.database_url import parse_database_url


def test_several_hosts_become_libpqs_host_and_port_lists_with_the_query_as_options() -> None:
    parsed = parse_database_url(
        "postgres://app:s3cret@db1:5440,db2:5441/activate?target_session_attrs=read-write",
        conn_max_age=60,
    )
    assert (parsed["HOST"], parsed["PORT"], parsed["NAME"]) == ("db1,db2", "5440,5441", "activate")
    assert (parsed["USER"], parsed["PASSWORD"]) == ("app", "s3cret")
    assert parsed["OPTIONS"] == {"target_session_attrs": "read-write"}
    assert parsed["CONN_MAX_AGE"] == 60


def test_a_host_without_a_port_takes_postgresqls_and_ipv6_keeps_its_address() -> None:
    parsed = parse_database_url("postgresql://app@[::1]:5440,db2/activate", conn_max_age=0)
    assert (parsed["HOST"], parsed["PORT"]) == ("::1,db2", "5440,5432")
    unported = parse_database_url("postgres://app@db1,db2/activate", conn_max_age=0)
    assert (unported["HOST"], unported["PORT"]) == ("db1,db2", "")


def test_one_host_is_as_before() -> None:
    parsed = parse_database_url("postgres://app@db1:5432/activate", conn_max_age=60)
    assert (parsed["HOST"], parsed["PORT"]) == ("db1", 5432)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mysql://app@db1,db2/activate", "PostgreSQL only"),
        ("postgres://app@db1:x,db2/activate", "'db1:x' is not host or host:port"),
        ("postgres://app@,db2/activate", "is not host or host:port"),
    ],
)
def test_a_list_that_names_no_hosts_is_refused_saying_why(url: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_database_url(url, conn_max_age=0)
