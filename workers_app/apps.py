from __future__ import annotations

from django.apps import AppConfig


class WorkersAppConfig(AppConfig):
    name = "workers_app"
    verbose_name = "Workers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.metrics import scrape
        from workers_app import metrics_sources

        scrape.add_source("database", metrics_sources.workers_and_clusters)
        scrape.add_source("redis", metrics_sources.sweeps_and_breakers)
