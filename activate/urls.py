from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from workers_app.views import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("health/", health, name="health"),
    path("agent/v1/", include("workers_app.agent_urls")),
    path("api/", include("workers_app.api.urls")),
    path("", include("workers_app.pages.urls")),
]
