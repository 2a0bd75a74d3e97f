"""Clusters, their relays and the users' accounts on them."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, Group
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

import schedulers
from core.keystore import decrypt_private_key, encrypt_private_key
from identity.unix_names import RuleInvalid, check_rule
from workers_app.models.idle import idle_minutes_field


class Reachability(models.TextChoices):
    ONLINE = "online", "online"
    OFFLINE = "offline", "offline"
    # Reachable or not, the platform cannot use it as configured (e.g. a key it cannot decrypt).
    MISCONFIGURED = "misconfigured", "misconfigured"
    UNKNOWN = "unknown", "unknown"


class AgentRoute(models.TextChoices):
    # Agents call the platform's agents' server (ACTIVATE_AGENT_URL) from the compute node.
    DIRECT = "direct", "direct"
    # Compute nodes cannot reach the platform: agents call a relay on the login host, which
    # passes each connection back over the platform's own SSH connection (a remote forward).
    VIA_LOGIN_HOST = "via_login_host", "via login host"


class UnixNameRule(models.TextChoices):
    AS_IS = "as_is", "the site's name as it is"
    LOWER = "lower", "the site's name in lower case"
    REGEX = "regex", "a regular expression map"


def may_see_all(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))


class ClusterQuerySet(models.QuerySet["Cluster"]):
    def visible_to(self, user: AbstractBaseUser | AnonymousUser) -> ClusterQuerySet:
        """The clusters ``user`` may see: those limited to no group or to one of theirs
        (operators see all)."""
        if may_see_all(user):
            return self
        mine = Q(allowed_groups__isnull=True) | Q(allowed_groups__in=user_groups(user))
        return self.filter(pk__in=Cluster.objects.filter(mine).values("pk"))


def user_groups(user: AbstractBaseUser | AnonymousUser) -> models.QuerySet[Group]:
    return Group.objects.filter(user__pk=user.pk) if user.pk else Group.objects.none()


class Cluster(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    host = models.CharField(max_length=255)
    port = models.PositiveIntegerField(default=22)
    # The cluster's own account: probes partitions and node counts, and nothing of a user's
    # unless the cluster is shared.
    username = models.CharField(max_length=64, blank=True)
    private_key_encrypted = models.TextField(
        blank=True, help_text="Fernet-encrypted with a key derived from ACTIVATE_SECRET_KEY."
    )
    shared = models.BooleanField(
        default=False,
        help_text="Every user acts as the cluster's own account (a one-person or one-lab "
        "installation). Otherwise each user needs a cluster account of their own.",
    )
    host_key = models.TextField(
        blank=True, help_text='Pinned host key, e.g. "ssh-ed25519 AAAA...". Required to connect.'
    )
    # One of the registry's schedulers (a callable: a new scheduler needs no migration).
    scheduler = models.CharField(max_length=schedulers.NAME_MAX_LENGTH, choices=schedulers.choices)
    reachability = models.CharField(
        max_length=16, choices=Reachability.choices, default=Reachability.UNKNOWN
    )
    last_contact_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    agent_route = models.CharField(
        max_length=16,
        choices=AgentRoute.choices,
        default=AgentRoute.DIRECT,
        help_text="How agents on compute nodes reach the platform. Via login host: a relay "
        "there, over the cluster's own account's SSH connection (`run_relays` must run).",
    )
    relay_host = models.CharField(
        max_length=255,
        blank=True,
        help_text="Via login host only: the login host's address as compute nodes see it; the "
        "relay listens there. Empty: every interface, and agents get the login host's name.",
    )
    relay_port = models.PositiveIntegerField(
        default=0,
        help_text="Via login host only: the relay's port on the login host. 0: one is picked "
        "the first time and kept.",
    )
    idle_minutes = idle_minutes_field(
        "Site default for its workers: delete when idle this many minutes (blank: never). "
        "Users may change it per worker."
    )
    # The platform as this cluster's SSH certificate authority: set, users log in with
    # certificates it signs for minutes, and connect no key of their own.
    ca_private_key_encrypted = models.TextField(blank=True)
    ca_public_key = models.TextField(blank=True)
    unix_name_rule = models.CharField(
        max_length=8,
        choices=UnixNameRule.choices,
        default=UnixNameRule.AS_IS,
        help_text="How a person's Unix name here is made from the name the site gives them.",
    )
    unix_name_match = models.CharField(
        max_length=255,
        blank=True,
        help_text="Regular expression map only: the pattern the whole site name must match, "
        r"e.g. ^(.+)@example\.org$.",
    )
    unix_name_replace = models.CharField(
        max_length=255,
        blank=True,
        help_text=r"Regular expression map only: the Unix name, e.g. \1 (Python's re.sub).",
    )
    allowed_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="+",
        help_text="Only members of these groups see the cluster (none: everyone).",
    )

    objects = ClusterQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.agent_route == AgentRoute.VIA_LOGIN_HOST and not self.username:
            raise ValidationError(
                {"agent_route": "The relay runs as the cluster's own account: set one first."}
            )
        if self.relay_port > 65535:
            raise ValidationError({"relay_port": "A port is 1 to 65535 (0: picked once)."})
        try:
            check_rule(self.unix_name_rule, self.unix_name_match, self.unix_name_replace)
        except RuleInvalid as exc:
            raise ValidationError({"unix_name_match": str(exc)}) from None

    def set_private_key(self, pem: str) -> None:
        self.private_key_encrypted = encrypt_private_key(pem)

    def private_key(self) -> str:
        return decrypt_private_key(self.private_key_encrypted) if self.private_key_encrypted else ""

    @property
    def has_private_key(self) -> bool:
        return bool(self.private_key_encrypted)


class RelayState(models.TextChoices):
    STARTING = "starting", "starting"  # a supervisor holds the lease and is setting it up
    UP = "up", "up"  # forward and relay answer; agents get through
    DOWN = "down", "down"  # lost (SSH dropped, relay died); being re-established
    STOPPED = "stopped", "stopped"  # not wanted any more (route switched back to direct)
    # Not stored: shown when no supervisor confirmed the state lately (run_relays not running).
    UNKNOWN = "unknown", "unknown (no run_relays confirms it)"


class AgentRelay(models.Model):
    """The relay of a cluster in via-login-host mode, as its supervisor last saw it."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="agent_relay")
    state = models.CharField(max_length=16, choices=RelayState.choices, default=RelayState.STARTING)
    # host:port job scripts give agents; kept across restarts so running agents keep their route.
    address = models.CharField(max_length=300, blank=True)
    # The login host's loopback port the SSH connection forwards (changes with each connection).
    forwarded_port = models.PositiveIntegerField(null=True, blank=True)
    holder = models.CharField(max_length=128, blank=True, help_text="run_relays process: host:pid")
    # The relay lease's number of the holding that took the row (with ``holder``, its fence):
    # a keeper writes only while the row is still its holding's (workers_app/relays/records.py).
    fence = models.PositiveBigIntegerField(default=0)
    last_error = models.TextField(blank=True)
    up_since = models.DateTimeField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    # Times it was re-established after being lost.
    repairs = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name"]

    def __str__(self) -> str:
        return f"relay of {self.cluster.name}"

    def state_now(self, now: datetime) -> str:
        """The stored state, or unknown when no supervisor has confirmed it within its lease."""
        if self.state == RelayState.STOPPED:
            return self.state
        stale = now - timedelta(seconds=settings.ACTIVATE_RELAY_LEASE)
        if self.checked_at is None or self.checked_at < stale:
            return RelayState.UNKNOWN
        return self.state


class AccountOrigin(models.TextChoices):
    GENERATED = "generated", "key pair generated by the platform"
    UPLOADED = "uploaded", "private key supplied by the user"
    OPERATOR = "operator", "mapped by an operator"
    CERTIFICATE = "certificate", "certificates signed by the platform"


class ClusterAccount(models.Model):
    """A user's own login on a cluster: everything their workers do there runs as it."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cluster_accounts"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="accounts")
    remote_username = models.CharField(max_length=64)
    private_key_encrypted = models.TextField(
        blank=True,
        help_text="Fernet-encrypted with a key derived from ACTIVATE_SECRET_KEY. Empty on a "
        "cluster that trusts the platform's certificates.",
    )
    # The OpenSSH line to paste into ~/.ssh/authorized_keys (safe to show).
    public_key = models.TextField(blank=True)
    origin = models.CharField(max_length=16, choices=AccountOrigin.choices)
    verified_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "cluster"], name="account_unique_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.remote_username}@{self.cluster.name}"

    def set_private_key(self, pem: str) -> None:
        self.private_key_encrypted = encrypt_private_key(pem)

    def private_key(self) -> str:
        return decrypt_private_key(self.private_key_encrypted)

    @property
    def is_verified(self) -> bool:
        return self.verified_at is not None
