"""Users' own accounts on clusters: connect one (a generated or a supplied key), verify the
login, disconnect. Whatever a user's workers do on a cluster runs as this account, so the
cluster's scheduler and OS, not the platform, keep users apart."""

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


def _refuse_if_in_use(account: ClusterAccount) -> None:
    in_use = Q(status__in=LIVE) | Q(cancel_requested=True)
    if Worker.objects.filter(in_use, account=account).exists():
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
    if account is None or not account.is_verified:
        raise AccountRequired(cluster)
    return account
