from __future__ import annotations

from django.apps import AppConfig


class NoticesAppConfig(AppConfig):
    name = "notices_app"
    label = "notices_app"
    verbose_name = "Notices"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from notices_app import receivers
        from workers_app import signals

        signals.worker_connected.connect(receivers.tell_connected, dispatch_uid="notice-connected")
        signals.idle_warning.connect(receivers.warn_idle, dispatch_uid="notice-idle")
        signals.idle_warning_cleared.connect(
            receivers.take_back_idle_warning, dispatch_uid="notice-idle-taken-back"
        )
