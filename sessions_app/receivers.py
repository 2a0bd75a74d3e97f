"""Sessions follow their worker: connected to workers_app's signals in SessionsAppConfig."""

from __future__ import annotations

from typing import Any

from sessions_app import services
from workers_app.models import Worker


def end_sessions(sender: object, *, worker: Worker, failed: bool, **kwargs: Any) -> None:
    services.finish_sessions_of_worker(worker.pk, reason=worker.status_reason, failed=failed)


def end_sessions_whose_launcher_ended(
    sender: object, *, worker: Worker, session_ids: list[str], **kwargs: Any
) -> None:
    services.end_sessions_whose_launcher_ended(worker.pk, session_ids)


def delete_sessions(sender: object, *, worker: Worker, **kwargs: Any) -> None:
    services.delete_sessions_of_worker(worker.pk)
