"""Notices follow workers: connected to workers_app's signals in NoticesAppConfig."""

from __future__ import annotations

from typing import Any

from notices_app import services
from workers_app.models import Worker


def tell_connected(sender: object, *, worker: Worker, **kwargs: Any) -> None:
    services.tell_connected(worker)
