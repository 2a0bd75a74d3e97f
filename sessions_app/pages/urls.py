from __future__ import annotations

from django.urls import path

from sessions_app.pages import views

app_name = "sessions"

urlpatterns = [
    path("sessions/", views.sessions, name="sessions"),
    path("sessions/table/", views.sessions_table, name="sessions-table"),
    path("sessions/new/", views.launch, name="launch"),
    path("sessions/<str:public_id>/", views.session_details, name="session"),
    path("sessions/<str:public_id>/stop/", views.stop, name="stop"),
    path("sessions/<str:public_id>/again/", views.again, name="again"),
    path("sessions/<str:public_id>/keep/", views.keep, name="keep"),
]
