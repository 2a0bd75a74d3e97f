from __future__ import annotations

from django.apps import AppConfig


class WorkersAppConfig(AppConfig):
    name = "workers_app"
    verbose_name = "Workers"
    default_auto_field = "django.db.models.BigAutoField"
