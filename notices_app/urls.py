from __future__ import annotations

from django.urls import path

from notices_app import views

app_name = "notices"

urlpatterns = [
    path("notices/", views.settings_page, name="settings"),
    path("notices/feed/", views.feed, name="feed"),
]
