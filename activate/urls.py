from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from core.metrics.views import metrics
from identity.views import SignOut
from workers_app.health import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("health/", health, name="health"),
    path("metrics", metrics, name="metrics"),
    path("agent/v1/", include("agents.urls")),
    path("api/", include("workers_app.api.urls")),
    path("api/", include("sessions_app.api.urls")),
    path("api/", include("files_app.api.urls")),
    # With single sign-on, logging out ends the provider's session too: this /logout/ is found
    # before the pages' own.
    *(
        [path("oidc/", include("identity.urls")), path("logout/", SignOut.as_view())]
        if settings.ACTIVATE_OIDC_ISSUER
        else []
    ),
    path("", include("workers_app.pages.urls")),
    path("", include("sessions_app.pages.urls")),
    path("", include("files_app.pages.urls")),
    path("", include("notices_app.urls")),
    # Browsers ask for it on every page, the admin's included.
    path("favicon.ico", RedirectView.as_view(url=static("workers_app/favicon.svg"))),
]
