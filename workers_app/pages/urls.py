from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from workers_app.pages import views

app_name = "pages"

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginPage.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("workers/", views.workers, name="workers"),
    path("workers/table/", views.workers_table, name="workers-table"),
    path("workers/new/", views.request_worker, name="request-worker"),
    path("workers/new/fields/", views.request_fields, name="request-fields"),
    path("workers/<str:public_id>/delete/", views.delete_worker, name="delete-worker"),
    path("workers/<str:public_id>/again/", views.request_again, name="request-again"),
    path("workers/<str:public_id>/keep/", views.keep_worker, name="keep-worker"),
    path("workers/<str:public_id>/terminal/", views.worker_terminal, name="worker-terminal"),
    path("clusters/", views.clusters, name="clusters"),
    path("clusters/<str:name>/account/", views.cluster_account, name="cluster-account"),
    path("clusters/<str:name>/account/verify/", views.verify_account, name="verify-account"),
    path(
        "clusters/<str:name>/account/disconnect/",
        views.disconnect_account,
        name="disconnect-account",
    ),
    path("usage/", views.usage_page, name="usage"),
    path("api-keys/", views.api_keys, name="api-keys"),
    path("api-keys/<int:pk>/revoke/", views.revoke_api_key, name="revoke-api-key"),
]
