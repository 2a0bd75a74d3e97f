"""Notices follow workers: connected to workers_app's signals in NoticesAppConfig."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from notices_app import services
from sessions_app.models import Session
from workers_app.models import Worker


def tell_connected(sender: object, *, worker: Worker, **kwargs: Any) -> None:
    services.tell_connected(worker)


def warn_idle(
    sender: object, *, worker: Worker, session: Session | None, ends_at: datetime, **kwargs: Any
) -> None:
    services.tell_idle_warning(worker, session, ends_at)


def take_back_idle_warning(
    sender: object, *, worker: Worker, session: Session | None, **kwargs: Any
) -> None:
    services.take_back_idle_warning(worker, session)
