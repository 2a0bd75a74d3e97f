"""API keys over the API (full-scope keys and the browser's session only), and the command
line's sign-in: an ID token from the provider's device grant exchanged for a key."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import ApiErrorsMixin
from core.api.responses import ANY_SEGMENT, NOT_AUTHENTICATED, ErrorSerializer, Pagination
from identity.oidc import ProviderUnavailable, TokenRefused
from identity.sign_in import SignInRefused
from workers_app.actions.api_keys import sign_in_command_line
from workers_app.api.authentication import FullKeyOnly
from workers_app.models import ApiKey


class ApiKeySerializer(serializers.ModelSerializer[ApiKey]):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scope", "created_at", "last_used_at", "expires_at"]
        read_only_fields = ["id", "prefix", "scope", "created_at", "last_used_at", "expires_at"]


class NewApiKeySerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; only its hash is kept.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


REFUSED = {403: ErrorSerializer, **NOT_AUTHENTICATED}


@extend_schema_view(
    list=extend_schema(
        responses={200: ApiKeySerializer(many=True), 400: ErrorSerializer, **REFUSED}
    )
)
class ApiKeyViewSet(
    ApiErrorsMixin,
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[ApiKey],
):
    serializer_class = ApiKeySerializer
    pagination_class = Pagination
    parser_classes = [JSONParser]
    permission_classes = [IsAuthenticated, FullKeyOnly]
    lookup_value_regex = ANY_SEGMENT

    def get_queryset(self) -> Any:
        return ApiKey.objects.filter(user=self.request.user.pk)

    @extend_schema(responses={201: NewApiKeySerializer, 400: ErrorSerializer, **REFUSED})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = ApiKeySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        assert isinstance(request.user, User)  # IsAuthenticated ran
        key, secret = ApiKey.issue(request.user, name=body.validated_data.get("name", ""))
        key.key = secret  # type: ignore[attr-defined]  # shown this once
        return Response(NewApiKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def get_object(self) -> ApiKey:
        if not self.kwargs["pk"].isdigit():
            raise NotFound("No such API key.")
        return get_object_or_404(self.get_queryset(), pk=self.kwargs["pk"])

    @extend_schema(responses={204: None, 404: ErrorSerializer, **REFUSED})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Revoke one of your keys."""
        return super().destroy(request, *args, **kwargs)


class SignInSerializer(serializers.Serializer[Any]):
    id_token = serializers.CharField(max_length=16384)


class SignOnOfferSerializer(serializers.Serializer[Any]):
    enabled = serializers.BooleanField()
    issuer = serializers.CharField()
    client_id = serializers.CharField(help_text="The public client of the device grant.")
    scopes = serializers.CharField()


class SignedInSerializer(serializers.Serializer[Any]):
    key = serializers.CharField()
    username = serializers.CharField()
    expires_at = serializers.DateTimeField()


class OidcSignInView(ApiErrorsMixin, APIView):
    """GET: whether single sign-on is on, and what the command line needs for the device grant.
    POST: an ID token from that grant, for an API key that expires (scope "session")."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: SignOnOfferSerializer})
    def get(self, request: Request) -> Response:
        enabled = bool(settings.ACTIVATE_OIDC_ISSUER and settings.ACTIVATE_OIDC_CLI_CLIENT_ID)
        return Response(
            {
                "enabled": enabled,
                "issuer": settings.ACTIVATE_OIDC_ISSUER if enabled else "",
                "client_id": settings.ACTIVATE_OIDC_CLI_CLIENT_ID if enabled else "",
                "scopes": settings.ACTIVATE_OIDC_SCOPES,
            }
        )

    @extend_schema(
        request=SignInSerializer,
        responses={
            200: SignedInSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            503: ErrorSerializer,
        },
    )
    def post(self, request: Request) -> Response:
        if not (settings.ACTIVATE_OIDC_ISSUER and settings.ACTIVATE_OIDC_CLI_CLIENT_ID):
            raise ValidationError({"id_token": "single sign-on is not set up on this platform"})
        body = SignInSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            key, secret = sign_in_command_line(body.validated_data["id_token"])
        except TokenRefused as exc:
            raise PermissionDenied(f"The ID token was refused: {exc}.") from None
        except SignInRefused as exc:
            raise PermissionDenied(f"Single sign-on refused: {exc}.") from None
        except ProviderUnavailable as exc:
            return Response(
                {"field": None, "detail": f"The sign-on provider cannot be reached: {exc}"},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
        return Response(
            {"key": secret, "username": key.user.get_username(), "expires_at": key.expires_at}
        )
