from __future__ import annotations

from django.urls import path

from files_app.pages import views

app_name = "files_pages"

urlpatterns = [
    path("files/", views.files_index, name="index"),
    path("clusters/<str:name>/files/", views.files_page, name="files"),
]
