"""Logins by the platform's certificates on the real sshd of the test cluster, which trusts the
cluster's CA (its TrustedUserCAKeys file): as the mapped Unix name and nobody else, only while
valid, only from the trusted CA, never for a disabled user; and nothing of it on disk, in the
logs or in the API."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from core.errors import ParameterError
from core.keystore import decrypt_private_key
from core.transport.connection import SSHConnection
from core.transport.errors import AuthenticationFailed
from harness.cluster import SshTarget
from harness.waiting import wait_for
from identity import certificates, revocations
from tests.factories import WorkerFactory
from workers_app import cluster_access
from workers_app.actions import cluster_accounts as accounts
from workers_app.actions.cluster_accounts import AccountRequired, acting_account
from workers_app.models import AccountOrigin, Cluster, ClusterAccount, Worker

pytestmark = pytest.mark.slurm


def login_with(
    ssh_target: SshTarget, username: str, signed: certificates.UserCertificate
) -> SSHConnection:
    return SSHConnection(
        host=ssh_target.host,
        port=ssh_target.port,
        username=username,
        private_key=signed.private_key,
        certificate=signed.certificate,
        host_key=ssh_target.host_key,
        connect_timeout=10,
        command_timeout=30,
        max_channels=1,
    )


def whoami(connection: SSHConnection) -> str:
    try:
        return connection.run(["id", "-un"]).stdout.strip()
    finally:
        connection.close()


def key_lines(pem: str) -> list[str]:
    """The lines of a private key worth looking for: its base64 body but the first line, which
    every unencrypted ed25519 key in OpenSSH's form shares."""
    return [line for line in pem.splitlines() if len(line) >= 40 and not line.startswith("-")][1:]


def ca_lines(cluster: Cluster) -> list[str]:
    return key_lines(decrypt_private_key(cluster.ca_private_key_encrypted))


def test_a_user_without_an_account_gets_one_by_the_rule_and_logs_in_as_it(
    ca_cluster: Cluster, user: User
) -> None:
    # Given alice has connected nothing on a cluster that trusts the platform's CA
    assert not ClusterAccount.objects.filter(user=user).exists()
    # When her worker needs an account there
    account = acting_account(user, ca_cluster)
    # Then one is made at once, verified, named by the cluster's rule, with no key at all
    assert (account.remote_username, account.origin) == ("pwalice", AccountOrigin.CERTIFICATE)
    assert account.is_verified and not account.private_key_encrypted and not account.public_key
    # And the cluster says she is pwalice
    assert whoami(cluster_access.new_connection(ca_cluster, account)) == "pwalice"


def test_alices_certificate_does_not_log_in_as_bob(
    ca_cluster: Cluster, ssh_target: SshTarget
) -> None:
    signed = certificates.sign_user_certificate(
        ca_cluster.ca_private_key_encrypted, principal="pwalice", key_id="test:alice"
    )
    assert whoami(login_with(ssh_target, "pwalice", signed)) == "pwalice"
    with pytest.raises(AuthenticationFailed):
        whoami(login_with(ssh_target, "pwbob", signed))


def test_an_expired_certificate_is_refused(ca_cluster: Cluster, ssh_target: SshTarget) -> None:
    signed = certificates.sign_user_certificate(
        ca_cluster.ca_private_key_encrypted, principal="pwalice", key_id="test:alice", lifetime=2
    )
    assert whoami(login_with(ssh_target, "pwalice", signed)) == "pwalice"
    time.sleep(max(0.0, signed.valid_before - time.time()) + 1.5)
    with pytest.raises(AuthenticationFailed):
        whoami(login_with(ssh_target, "pwalice", signed))


def test_a_certificate_from_another_ca_is_refused(
    ca_cluster: Cluster, ssh_target: SshTarget
) -> None:
    stranger = certificates.new_authority("activate-ca:elsewhere")
    signed = certificates.sign_user_certificate(
        stranger.private_key_encrypted, principal="pwalice", key_id="test:alice"
    )
    with pytest.raises(AuthenticationFailed):
        whoami(login_with(ssh_target, "pwalice", signed))


def test_a_disabled_user_gets_no_certificate_and_their_connections_close_within_the_bound(
    transactional_db: None, ca_cluster: Cluster, user: User
) -> None:
    # Given alice holds a pooled connection as her certificate account
    account = acting_account(user, ca_cluster)
    pooled = cluster_access.connection_for(ca_cluster, account)
    assert pooled.run(["id", "-un"]).stdout.strip() == "pwalice" and pooled.is_connected
    # When an operator disables her (the admin saves the user)
    user.is_active = False
    user.save()
    disabled_at = time.monotonic()
    # Then no new login gets a certificate, and no retry would help
    with pytest.raises(cluster_access.UserDisabled):
        whoami(cluster_access.new_connection(ca_cluster, account))
    # And the connection she held closes within the bound (the process's check, no call of ours)
    wait_for(lambda: not pooled.is_connected, timeout=revocations.CHECK_EVERY + 10)
    closed_after = time.monotonic() - disabled_at
    assert closed_after <= revocations.CHECK_EVERY + 5, closed_after
    print(f"closed {closed_after:.1f} s after the user was disabled")


def test_no_certificate_or_ca_key_is_written_to_disk_during_a_login(
    ca_cluster: Cluster, user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed: list[certificates.UserCertificate] = []
    sign = certificates.sign_user_certificate

    def spy(*args: object, **kwargs: object) -> certificates.UserCertificate:
        signed.append(sign(*args, **kwargs))  # type: ignore[arg-type]
        return signed[-1]

    monkeypatch.setattr(certificates, "sign_user_certificate", spy)
    started = time.time() - 1
    account = acting_account(user, ca_cluster)
    assert whoami(cluster_access.new_connection(ca_cluster, account)) == "pwalice"
    assert len(signed) == 1
    certificate = signed[0]
    secrets = [certificate.certificate.split()[1], *ca_lines(ca_cluster)]
    secrets += key_lines(certificate.private_key)

    home = Path(os.path.expanduser("~pwalice"))
    places = [Path("/tmp"), Path(settings.DATA_DIR), Path.home(), home, Path("/var/tmp")]
    found = []
    for place in places:
        for root, _, names in os.walk(place):
            for name in names:
                path = Path(root) / name
                try:
                    if not path.is_file() or path.stat().st_mtime < started:
                        continue
                    if path.stat().st_size > 10_000_000:
                        continue
                    text = path.read_bytes().decode("utf-8", "replace")
                except OSError:
                    continue
                found += [str(path) for secret in secrets if secret in text]
    assert found == []


def test_the_ca_private_key_appears_in_no_log_api_answer_or_admin_page(
    ca_cluster: Cluster, user: User, caplog: pytest.LogCaptureFixture, admin_client: Client
) -> None:
    caplog.set_level(logging.DEBUG)
    account = acting_account(user, ca_cluster)
    assert whoami(cluster_access.new_connection(ca_cluster, account)) == "pwalice"
    client = Client()
    client.force_login(user)
    answers = client.get("/api/clusters/").content.decode()
    answers += client.get(f"/api/clusters/{ca_cluster.name}/").content.decode()
    admin_page = admin_client.get(f"/admin/workers_app/cluster/{ca_cluster.pk}/change/")
    page = admin_page.content.decode()

    assert '"login":"certificate"' in answers.replace(" ", "")
    assert ca_cluster.ca_public_key.split()[1] in page and "TrustedUserCAKeys" in page
    for secret in [*ca_lines(ca_cluster), ca_cluster.ca_private_key_encrypted]:
        assert secret not in caplog.text
        assert secret not in answers
        assert secret not in page


def test_an_operator_makes_rotates_and_removes_the_ca_from_the_command_line(
    ca_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    first = ca_cluster.ca_public_key
    call_command("cluster_ca", ca_cluster.name)
    out = capsys.readouterr()
    assert out.out.strip() == first and "TrustedUserCAKeys" in out.err

    call_command("cluster_ca", ca_cluster.name, "--rotate")
    rotated = capsys.readouterr().out.strip()
    ca_cluster.refresh_from_db()
    assert rotated == ca_cluster.ca_public_key != first
    assert rotated.startswith("ssh-ed25519 ") and "PRIVATE" not in rotated

    call_command("cluster_ca", ca_cluster.name, "--remove")
    ca_cluster.refresh_from_db()
    assert ca_cluster.ca_public_key == ca_cluster.ca_private_key_encrypted == ""


def test_an_operators_name_overrides_the_rule_and_logs_in_by_certificate(
    ca_cluster: Cluster, user: User, admin_client: Client
) -> None:
    # Given an operator maps alice to pwbob in the admin, with no key
    made = admin_client.post(
        "/admin/workers_app/clusteraccount/add/",
        {"user": user.pk, "cluster": ca_cluster.pk, "remote_username": "pwbob", "private_key": ""},
    )
    assert made.status_code == 302, made.content.decode()[-2000:]
    # When she requests a worker there, she acts as the operator's name, by certificate
    account = acting_account(user, ca_cluster)
    assert (account.remote_username, account.origin) == ("pwbob", AccountOrigin.OPERATOR)
    assert whoami(cluster_access.new_connection(ca_cluster, account)) == "pwbob"


def test_a_name_that_does_not_map_is_told_plainly(ca_cluster: Cluster, django_user_model) -> None:
    odd = django_user_model.objects.create_user("Foo")
    with pytest.raises(ParameterError) as refused:
        acting_account(odd, ca_cluster)
    assert refused.value.field == "cluster"
    assert refused.value.message == (
        "You have no Unix name on cluster campus: your name 'Foo' does not map by its rule. "
        "Ask an operator to set one for you."
    )
    assert not ClusterAccount.objects.filter(user=odd).exists()


def test_a_certificate_account_follows_its_new_name_only_while_no_worker_runs_as_it(
    ca_cluster: Cluster, user: User
) -> None:
    account = acting_account(user, ca_cluster)
    Cluster.objects.filter(pk=ca_cluster.pk).update(unix_name_replace=r"\1")
    ca_cluster.refresh_from_db()
    running = WorkerFactory(owner=user, cluster=ca_cluster, account=account, status="connected")
    assert acting_account(user, ca_cluster).remote_username == "pwalice"  # in use: kept
    Worker.objects.filter(pk=running.pk).update(status="stopped")
    assert acting_account(user, ca_cluster).remote_username == "alice"


def test_clusters_without_a_ca_need_a_verified_account_with_a_key_as_before(
    make_cluster, user: User
) -> None:
    cluster = make_cluster(name="keys-only", shared=False)
    with pytest.raises(AccountRequired):
        acting_account(user, cluster)
    keyless = ClusterAccount.objects.create(
        user=user, cluster=cluster, remote_username="pwalice", origin=AccountOrigin.OPERATOR
    )
    with pytest.raises(AccountRequired):
        acting_account(user, cluster)
    keyless.delete()
    account = accounts.connect_account(user, cluster, remote_username="pwalice")
    with pytest.raises(AccountRequired):
        acting_account(user, cluster)  # not verified yet
    ClusterAccount.objects.filter(pk=account.pk).update(verified_at="2020-01-01T00:00:00Z")
    assert acting_account(user, cluster) == account
