"""The single sign-on's pages: mozilla-django-oidc's start and callback with the provider found
by discovery and every failure said on the login page, and a logout that ends the provider's
session too when it offers RP-initiated logout. Wired by activate/urls.py when SSO is on."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from identity.oidc import ProviderUnavailable, TokenRefused, discover
from identity.sign_in import SignInRefused

logger = logging.getLogger(__name__)
ID_TOKEN = "oidc_id_token"  # noqa: S105 - the session key mozilla-django-oidc keeps it under


def _refused(request: HttpRequest, reason: str) -> HttpResponseRedirect:
    messages.error(request, f"Single sign-on failed: {reason}")
    return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))


class SignInStart(OIDCAuthenticationRequestView):
    """Sends the browser to the provider (state, nonce and PKCE kept in the session)."""

    def __init__(self, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(**kwargs)
        self.OIDC_RP_CLIENT_ID = settings.ACTIVATE_OIDC_CLIENT_ID

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discover().authorization_endpoint
        except ProviderUnavailable as exc:
            logger.warning("single sign-on: %s", exc)
            return _refused(request, "the sign-on provider cannot be reached; try again later.")
        response: HttpResponse = super().get(request)
        return response


class SignInCallback(OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back; any failure ends on the login page with a
    sentence, never a 500."""

    @property
    def failure_url(self) -> str:
        return resolve_url(settings.LOGIN_URL)

    def get(self, request: HttpRequest) -> HttpResponseRedirect:
        if request.GET.get("error"):
            super().get(request)  # forgets the state and logs out, as the library does
            reason = request.GET.get("error_description") or request.GET["error"]
            return _refused(request, f"the provider said: {reason[:200]}")
        try:
            response: HttpResponseRedirect = super().get(request)
        except ProviderUnavailable as exc:
            logger.warning("single sign-on: %s", exc)
            return _refused(request, "the sign-on provider cannot be reached; try again later.")
        except requests.RequestException as exc:
            logger.warning("single sign-on: the token request failed: %s", exc)
            return _refused(request, "the provider did not give a token; try again.")
        except TokenRefused as exc:
            logger.warning("single sign-on: ID token refused: %s", exc)
            return _refused(request, "the provider's answer did not pass our checks.")
        except SignInRefused as exc:
            return _refused(request, f"{exc}.")
        except SuspiciousOperation:
            return _refused(request, "this sign-in was not started here or has expired; try again.")
        if response.url == self.failure_url and not request.user.is_authenticated:
            return _refused(request, "try again.")
        return response


class SignOut(auth_views.LogoutView):
    """Ends the platform's session, then the provider's when its discovery document lists an
    end_session_endpoint (RP-initiated logout), which sends the browser back to our login."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        id_token = request.session.get(ID_TOKEN)
        response: HttpResponse = super().post(request, *args, **kwargs)
        if not id_token:
            return response
        try:
            endpoint = discover().end_session_endpoint
        except ProviderUnavailable as exc:
            logger.warning("single sign-on: logged out here only: %s", exc)
            return response
        if not endpoint:
            return response
        query = urlencode(
            {
                "id_token_hint": id_token,
                "client_id": settings.ACTIVATE_OIDC_CLIENT_ID,
                "post_logout_redirect_uri": request.build_absolute_uri(
                    resolve_url(settings.LOGIN_URL)
                ),
            }
        )
        return HttpResponseRedirect(f"{endpoint}?{query}")
