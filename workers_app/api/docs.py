"""Swagger UI served from our own static files: deployments may have no internet access."""

from __future__ import annotations

from django.templatetags.static import static
from drf_spectacular.views import SpectacularSwaggerView

SIDECAR_DIST = "drf_spectacular_sidecar/swagger-ui-dist"


class SwaggerView(SpectacularSwaggerView):
    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return static(f"{SIDECAR_DIST}/{filename}")

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return static(f"{SIDECAR_DIST}/favicon-32x32.png")
