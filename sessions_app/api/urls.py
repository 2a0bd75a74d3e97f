from __future__ import annotations

from rest_framework.routers import SimpleRouter

from sessions_app.api import views

router = SimpleRouter()
router.register("sessions", views.SessionViewSet, basename="session")

urlpatterns = router.urls
