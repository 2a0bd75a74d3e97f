"""Users' own accounts on clusters: connect one (a generated or a supplied key), verify the
login, disconnect. Whatever a user's workers do on a cluster runs as this account, so the
cluster's scheduler and OS, not the platform, keep users apart. On a cluster that trusts the
platform's certificates the account is made at the first request, named by the cluster's rule."""

from __future__ import annotations

import re

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.errors import ParameterError
from core.transport.errors import SSHError
from identity.unix_names import RuleInvalid, site_name_of, unix_name
from workers_app.cluster_access import new_connection
from workers_app.models import AccountOrigin, Cluster, ClusterAccount, Worker
from workers_app.statuses import LIVE

# POSIX portable user names (useradd's default rule, plus upper case some sites allow).
REMOTE_USERNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
MAX_KEY_LENGTH = 16384


class AccountRequired(ParameterError):
    """The user has no verified account on a cluster that is not shared."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(
            "cluster",
            f"You have no verified account on cluster {cluster.name}. Connect yours with "
            f"`pw cluster connect {cluster.name} --user YOUR_CLUSTER_USERNAME` (or on the "
            f"Clusters page), then `pw cluster verify {cluster.name}`.",
        )


class NoUnixName(ParameterError):
    """The cluster's naming rule makes no Unix name of the user's name, and no operator set one."""

    def __init__(self, cluster: Cluster, site_name: str) -> None:
        super().__init__(
            "cluster",
            f"You have no Unix name on cluster {cluster.name}: your name {site_name!r} does not "
            "map by its rule. Ask an operator to set one for you.",
        )


def generate_key_pair(comment: str) -> tuple[str, str]:
    """A new ed25519 key: (private key in OpenSSH format, public key line with ``comment``)."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    return private, f"{_public_line(key)} {comment}"


def _public_line(
    key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def public_key_of(private_key: str) -> str:
    """The public key line of a user-supplied private key; ParameterError if it is unusable."""
    if len(private_key) > MAX_KEY_LENGTH:
        raise ParameterError("private_key", "is too long to be an SSH private key")
    data = private_key.strip().encode() + b"\n"
    key: object
    try:
        if b"OPENSSH PRIVATE KEY" in data:
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ParameterError(
            "private_key", "is protected by a passphrase; supply a key without one"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise ParameterError(
            "private_key", "is not an ed25519, ECDSA or RSA private key in OpenSSH or PEM form"
        ) from None
    if not isinstance(
        key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    ):
        raise ParameterError("private_key", "must be an ed25519, ECDSA or RSA key")
    return _public_line(key)


def connect_account(
    user: User,
    cluster: Cluster,
    *,
    remote_username: str,
    private_key: str = "",
    origin: AccountOrigin | None = None,
) -> ClusterAccount:
    """Record the user's account on ``cluster`` (replacing any earlier one), unverified.

    Without ``private_key`` the platform generates a key pair; the user installs its public
    line in ``~/.ssh/authorized_keys`` on the cluster and then verifies.
    """
    remote_username = remote_username.strip()
    if not REMOTE_USERNAME.fullmatch(remote_username):
        raise ParameterError(
            "remote_username", "must be a user name on the cluster, e.g. alice or a_smith"
        )
    if private_key.strip():
        pem = private_key.strip() + "\n"
        public = public_key_of(pem)
        origin = origin or AccountOrigin.UPLOADED
    else:
        label = f"activate-{settings.ACTIVATE_INSTALLATION_ID}-{user.get_username()}@{cluster.name}"
        pem, public = generate_key_pair(label)
        origin = AccountOrigin.GENERATED
    with transaction.atomic():
        account = (
            ClusterAccount.objects.select_for_update().filter(user=user, cluster=cluster).first()
        )
        if account is not None and account.remote_username != remote_username:
            _refuse_if_in_use(account)
        account = account or ClusterAccount(user=user, cluster=cluster)
        account.remote_username = remote_username
        account.set_private_key(pem)
        account.public_key = public
        account.origin = origin
        account.verified_at = None
        account.last_error = ""
        account.save()
    return account


def _in_use(account: ClusterAccount) -> bool:
    in_use = Q(status__in=LIVE) | Q(cancel_requested=True)
    return Worker.objects.filter(in_use, account=account).exists()


def _refuse_if_in_use(account: ClusterAccount) -> None:
    if _in_use(account):
        raise ParameterError(
            "remote_username",
            f"your workers on {account.cluster.name} still run as {account.remote_username}; "
            "delete them first",
        )


def verify_account(account: ClusterAccount) -> bool:
    """Log in as the account and check who the cluster says we are; records the outcome."""
    connection = new_connection(
        account.cluster,
        account,
        max_channels=1,
        command_timeout=settings.ACTIVATE_SSH_CONNECT_TIMEOUT,
    )
    error = ""
    try:
        result = connection.run(["id", "-un"])
        if result.exit_status != 0:
            error = f"`id -un` failed on the cluster: {result.stderr.strip()[:200]}"
        elif result.stdout.strip() != account.remote_username:
            error = f"logged in as {result.stdout.strip()!r}, not {account.remote_username!r}"
    except SSHError as exc:
        error = str(exc)
        if "authentication" in error:
            error += f"; is the public key in ~{account.remote_username}/.ssh/authorized_keys?"
    finally:
        connection.close()
    verified_at = None if error else timezone.now()
    ClusterAccount.objects.filter(pk=account.pk).update(
        verified_at=verified_at, last_error=error[:2000]
    )
    account.verified_at, account.last_error = verified_at, error[:2000]
    return not error


def disconnect_account(account: ClusterAccount) -> None:
    """Forget the account; refused while workers still run as it."""
    with transaction.atomic():
        _refuse_if_in_use(account)
        Worker.objects.filter(account=account).update(account=None)
        account.delete()


def account_of(user: User, cluster: Cluster) -> ClusterAccount | None:
    return ClusterAccount.objects.filter(user=user, cluster=cluster).first()


def acting_account(user: User, cluster: Cluster) -> ClusterAccount | None:
    """The account a new worker of ``user`` runs as: theirs, or None on a shared cluster."""
    if cluster.shared:
        if not cluster.username or not cluster.has_private_key:
            raise ParameterError(
                "cluster", f"cluster {cluster.name} is shared but has no account configured"
            )
        return None
    account = account_of(user, cluster)
    if cluster.ca_public_key and (account is None or not account.private_key_encrypted):
        return certificate_account(user, cluster, account)
    if account is None or not account.is_verified or not account.private_key_encrypted:
        raise AccountRequired(cluster)
    return account


def certificate_account(
    user: User, cluster: Cluster, account: ClusterAccount | None
) -> ClusterAccount:
    """The account ``user`` logs in to ``cluster`` with by the platform's certificates: an
    operator's (their name as set), else one named by the cluster's rule, made at once and
    following the rule's name while no worker runs as it. NoUnixName when the rule makes none."""
    if account is not None and account.origin != AccountOrigin.CERTIFICATE:
        return account
    site_name = site_name_of(user)
    try:
        rule = (cluster.unix_name_rule, cluster.unix_name_match, cluster.unix_name_replace)
        name = unix_name(site_name, *rule)
    except RuleInvalid:
        name = None
    if name is None:
        raise NoUnixName(cluster, site_name)
    if account is None:
        account, _ = ClusterAccount.objects.get_or_create(
            user=user,
            cluster=cluster,
            defaults={
                "remote_username": name,
                "origin": AccountOrigin.CERTIFICATE,
                "verified_at": timezone.now(),
            },
        )
    renamed = account.remote_username != name
    if not renamed and account.is_verified:
        return account
    with transaction.atomic():
        account = ClusterAccount.objects.select_for_update().get(pk=account.pk)
        if account.origin != AccountOrigin.CERTIFICATE:
            return account  # an operator set it meanwhile
        if renamed and not _in_use(account):
            account.remote_username = name
        # Nothing to connect or verify: a refused login (a disabled user, a cluster that has
        # not installed the CA yet) is told on the worker, and the next request tries again.
        account.verified_at = account.verified_at or timezone.now()
        account.save(update_fields=["remote_username", "verified_at", "updated_at"])
    return account
