"""Celery tasks: thin wrappers over ``notices_app.services``."""

from __future__ import annotations

from celery import shared_task

from notices_app import services


@shared_task(autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def email_notice(notice_id: int) -> bool:
    return services.email_notice(notice_id)


@shared_task
def warn_walltimes() -> int:
    return services.warn_walltimes()
