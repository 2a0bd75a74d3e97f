from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import SimpleRouter

from workers_app.api import keys, views
from workers_app.api.docs import SwaggerView

router = SimpleRouter()
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register(
    r"clusters/(?P<cluster>[^/]+)/environments", views.EnvironmentViewSet, basename="environment"
)
router.register("workers", views.WorkerViewSet, basename="worker")
router.register("api-keys", keys.ApiKeyViewSet, basename="api-key")
router.register("saved-requests", views.SavedRequestViewSet, basename="saved-request")

urlpatterns: list[URLPattern | URLResolver] = [
    path("me/", views.MeView.as_view(), name="api-me"),
    path("usage/", views.UsageView.as_view(), name="api-usage"),
    path("auth/oidc/", keys.OidcSignInView.as_view(), name="api-auth-oidc"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    *router.urls,
]
