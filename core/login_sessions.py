"""The platform's login sessions (``SESSION_ENGINE``): Django's database sessions, but the table
keeps a hash of each session key instead of the key.

Django's ``django_session`` table has the key the browser presents as its ``sessionid`` cookie
as its primary key, so whoever reads the table (a backup, a replica, a leaked dump) could log in
as anyone logged in. Here the row's ``session_key`` is the SHA-256 of the cookie's key, cut to
the column's 40 hex characters (160 bits): the cookie finds its row, the row gives no cookie.
Keys are 32 random characters, so an unsalted hash is enough (as for API keys).

Sessions made before this engine (rows keyed by the key itself) are no longer found: their
users log in once more, and their rows are useless to a reader and go at their expiry
(``clearsessions``).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.contrib.sessions.backends import db
from django.core.exceptions import SuspiciousOperation
from django.utils import timezone

# django.contrib.sessions' Session.session_key is a CharField(max_length=40).
STORED_LENGTH = 40


def stored_key(session_key: str) -> str:
    """What the table keeps of a session key."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:STORED_LENGTH]


class SessionStore(db.SessionStore):
    """db.SessionStore with every read and write of ``session_key`` going through
    ``stored_key``."""

    def _get_session_from_db(self) -> Any:
        try:
            return self.model.objects.get(
                session_key=stored_key(self.session_key or ""), expire_date__gt=timezone.now()
            )
        except (self.model.DoesNotExist, SuspiciousOperation) as e:
            _warn_if_suspicious(e)
            self._session_key = None
            return None

    async def _aget_session_from_db(self) -> Any:
        try:
            return await self.model.objects.aget(
                session_key=stored_key(self.session_key or ""), expire_date__gt=timezone.now()
            )
        except (self.model.DoesNotExist, SuspiciousOperation) as e:
            _warn_if_suspicious(e)
            self._session_key = None
            return None

    def exists(self, session_key: str) -> bool:
        return bool(self.model.objects.filter(session_key=stored_key(session_key)).exists())

    async def aexists(self, session_key: str) -> bool:
        return bool(await self.model.objects.filter(session_key=stored_key(session_key)).aexists())

    def create_model_instance(self, data: dict[str, Any]) -> Any:
        return self.model(
            # Django's own method, missing from django-stubs.
            session_key=stored_key(self._get_or_create_session_key()),  # type: ignore[attr-defined]
            session_data=self.encode(data),
            expire_date=self.get_expiry_date(),
        )

    async def acreate_model_instance(self, data: dict[str, Any]) -> Any:
        return self.model(
            # Django's own method, missing from django-stubs.
            session_key=stored_key(await self._aget_or_create_session_key()),  # type: ignore[attr-defined]
            session_data=self.encode(data),
            expire_date=await self.aget_expiry_date(),
        )

    def delete(self, session_key: str | None = None) -> None:
        if session_key is None:
            session_key = self.session_key
        if session_key is not None:
            self.model.objects.filter(session_key=stored_key(session_key)).delete()

    async def adelete(self, session_key: str | None = None) -> None:
        if session_key is None:
            session_key = self.session_key
        if session_key is not None:
            await self.model.objects.filter(session_key=stored_key(session_key)).adelete()


def _warn_if_suspicious(error: Exception) -> None:
    # As db.SessionStore does.
    if isinstance(error, SuspiciousOperation):
        logger = logging.getLogger(f"django.security.{error.__class__.__name__}")
        logger.warning(str(error))
