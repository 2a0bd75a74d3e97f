from __future__ import annotations

from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.metrics import scrape
        from sessions_app import metrics, receivers
        from workers_app import signals

        signals.worker_finished.connect(receivers.end_sessions, dispatch_uid="sessions-end")
        signals.worker_deleted.connect(receivers.delete_sessions, dispatch_uid="sessions-delete")
        signals.agent_sessions_ended.connect(
            receivers.end_sessions_whose_launcher_ended, dispatch_uid="sessions-launcher-ended"
        )
        scrape.add_source("sessions", metrics.sessions_by_kind_and_status)
