"""Who signed in: the platform user a provider's claims or a directory entry stand for, the
Identity recorded for them, and their groups as the provider or directory says.

Groups are synced, not mirrored: a sign-in adds the groups its source lists and removes only
those the previous sign-in had brought (kept in Identity.groups), so groups an operator gave a
person in the admin stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import Group
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from identity.models import Identity, Source

GROUP_NAME_MAX = 150


class SignInRefused(Exception):
    """The provider vouched for the person, but the platform will not sign them in."""


def group_names(value: Any) -> list[str]:
    """The group names a claim or directory lists: strings of a length Django keeps."""
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    names = {item.strip() for item in items if isinstance(item, str)}
    return sorted(name for name in names if name and len(name) <= GROUP_NAME_MAX)


def sync_groups(user: Any, before: Iterable[str], now: list[str]) -> None:
    """Put ``user`` in the groups ``now`` lists (made when missing) and out of those ``before``
    listed that ``now`` does not; groups from elsewhere are left alone."""
    gone = set(before) - set(now)
    if gone:
        user.groups.remove(*Group.objects.filter(name__in=gone))
    if now:
        user.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in now))


def record_identity(
    user: Any, *, source: str, subject: str, site_name: str, groups: list[str]
) -> Identity:
    """Write how ``user`` signed in, and sync their groups against the previous sign-in's."""
    identity, _ = Identity.objects.select_for_update().get_or_create(user=user)
    sync_groups(user, identity.groups, groups)
    identity.source = source
    identity.subject = subject
    identity.site_name = site_name
    identity.groups = groups
    identity.updated_at = timezone.now()
    identity.save()
    return identity


def _claim(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    return value.strip() if isinstance(value, str) else ""


def _match(subject: str, username: str) -> Any:
    """The user the provider's subject was signed in as before, else the one of that name
    (a local account, or the same person from the directory), else None."""
    known = Identity.objects.filter(source=Source.OIDC, subject=subject).select_related("user")
    identity = known.first()
    if identity is not None:
        return identity.user
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        return None
    if user.is_staff or user.is_superuser:
        # A provider that lets people pick their name would hand them an operator's account.
        raise SignInRefused(
            f"the name {username!r} is an operator's local account; an operator links it to "
            "single sign-on in the admin (Identities)"
        )
    other = Identity.objects.filter(user=user, source=Source.OIDC).exclude(subject="").first()
    if other is not None:
        raise SignInRefused(f"the name {username!r} belongs to another person of the provider")
    return user


@transaction.atomic
def oidc_user(claims: dict[str, Any]) -> AbstractBaseUser:
    """The platform user for a provider's verified claims: matched by subject, then by the
    username claim, else created; their Identity and groups brought up to date."""
    subject = _claim(claims, "sub")
    username = _claim(claims, settings.ACTIVATE_OIDC_USERNAME_CLAIM)
    if not subject:
        raise SignInRefused("the provider's token names no subject")
    if not username:
        raise SignInRefused(
            f"the provider sent no {settings.ACTIVATE_OIDC_USERNAME_CLAIM!r} claim to name you by"
        )
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise SignInRefused(f"{username!r} cannot be a platform user name") from None
    user = _match(subject, username)
    if user is None:
        user = get_user_model().objects.create_user(username)
    if not user.is_active:
        raise SignInRefused(f"the account {user.get_username()!r} is disabled")
    for field, claim in (
        ("email", "email"),
        ("first_name", "given_name"),
        ("last_name", "family_name"),
    ):
        value = _claim(claims, claim)
        if value:
            setattr(user, field, value[:150])
    user.save()
    record_identity(
        user,
        source=Source.OIDC,
        subject=subject,
        site_name=_claim(claims, settings.ACTIVATE_OIDC_UNIX_CLAIM),
        groups=group_names(claims.get(settings.ACTIVATE_OIDC_GROUPS_CLAIM)),
    )
    return user


def ldap_user_populated(sender: Any, user: Any, ldap_user: Any, **kwargs: Any) -> None:
    """django-auth-ldap's populate_user: record the directory Identity and groups (the user is
    saved first, as a new one has no row yet; the backend saves it again after)."""
    attribute = settings.ACTIVATE_LDAP_UNIX_ATTRIBUTE
    values = (ldap_user.attrs or {}).get(attribute) or [""]
    # Without a group base the directory's groups are not read (the backend cannot).
    groups = list(ldap_user.group_names) if settings.ACTIVATE_LDAP_GROUP_BASE else []
    with transaction.atomic():
        user.save()
        record_identity(
            user,
            source=Source.LDAP,
            subject=str(ldap_user.dn),
            site_name=str(values[0]),
            groups=group_names(groups),
        )
