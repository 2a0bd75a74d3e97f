"""/oidc/: the single sign-on's start and callback, under the names mozilla-django-oidc
reverses (no namespace)."""

from __future__ import annotations

from django.urls import path

from identity.views import SignInCallback, SignInStart

urlpatterns = [
    path("authenticate/", SignInStart.as_view(), name="oidc_authentication_init"),
    path("callback/", SignInCallback.as_view(), name="oidc_authentication_callback"),
]
