from __future__ import annotations

from django.urls import path

from files_app.api import views

urlpatterns = [
    path("clusters/<str:cluster>/files/", views.ListingView.as_view(), name="files-list"),
    path("clusters/<str:cluster>/files/roots/", views.RootsView.as_view(), name="files-roots"),
    path("clusters/<str:cluster>/files/mkdir/", views.MkdirView.as_view(), name="files-mkdir"),
    path("clusters/<str:cluster>/files/rename/", views.RenameView.as_view(), name="files-rename"),
    path("clusters/<str:cluster>/files/delete/", views.DeleteView.as_view(), name="files-delete"),
]
