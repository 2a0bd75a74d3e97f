"""The sessions' REST API: thin views over sessions_app.services.

A user sees their own sessions only (staff too: a session acts as its owner); any other id
answers 404. DELETE stops the session (and its dedicated worker) and answers its state.
"""

from __future__ import annotations

from dataclasses import asdict

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.errors import ApiErrorsMixin
from core.api.responses import (
    ANY_SEGMENT,
    NOT_AUTHENTICATED,
    NOT_FOUND,
    ErrorSerializer,
    Pagination,
)
from sessions_app import idle, kinds, services
from sessions_app.api.serializers import (
    SessionCreateSerializer,
    SessionEventSerializer,
    SessionKindSerializer,
    SessionSerializer,
)
from sessions_app.models import Session, SessionEvent
from sessions_app.statuses import SessionStatus


def _user(request: Request) -> User:
    assert isinstance(request.user, User)
    return request.user


@extend_schema_view(
    list=extend_schema(
        description="Your sessions, newest first.",
        parameters=[
            OpenApiParameter("status", enum=SessionStatus.values, description="Only these."),
            OpenApiParameter("worker", str, description="Only sessions on this worker (its id)."),
        ],
        responses={200: SessionSerializer(many=True), 400: ErrorSerializer, **NOT_AUTHENTICATED},
    ),
    retrieve=extend_schema(
        description="One session, with its URL.", responses={200: SessionSerializer, **NOT_FOUND}
    ),
)
class SessionViewSet(
    ApiErrorsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Session],
):
    serializer_class = SessionSerializer
    pagination_class = Pagination
    parser_classes = [JSONParser]
    lookup_field = "public_id"
    lookup_url_kwarg = "id"
    lookup_value_regex = ANY_SEGMENT
    queryset = Session.objects.all()

    def get_queryset(self) -> QuerySet[Session]:
        sessions = services.sessions_visible_to(_user(self.request))
        if self.action == "list":
            if session_status := self.request.query_params.get("status"):
                if session_status not in SessionStatus.values:
                    allowed = ", ".join(SessionStatus.values)
                    raise ValidationError({"status": f"must be one of: {allowed}"})
                sessions = sessions.filter(status=session_status)
            if worker := self.request.query_params.get("worker"):
                sessions = sessions.filter(worker__public_id=worker)
        return sessions.order_by("-created_at", "-id")

    @extend_schema(
        request=SessionCreateSerializer,
        responses={201: SessionSerializer, 400: ErrorSerializer, **NOT_AUTHENTICATED},
    )
    def create(self, request: Request) -> Response:
        """Launch a session: on an environment (a worker is requested for it alone) or on a
        connected worker of yours. It starts pending and runs once its program answers."""
        body = SessionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        session = services.create_session(
            owner=_user(request),
            session_type=data["type"],
            cluster=data["cluster"],
            environment=data["environment"],
            worker_id=data["worker"],
            params=data["params"],
            name=data["name"],
            idle_minutes=data["idle_minutes"],
            values=data["values"],
            folder=data["folder"],
        )
        session = services.sessions_visible_to(_user(request)).get(pk=session.pk)
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None, responses={201: SessionSerializer, 400: ErrorSerializer, **NOT_FOUND}
    )
    @action(detail=True, methods=["post"])
    def again(self, request: Request, **kwargs: str) -> Response:
        """Launch another session like this one (ended or not): of its type, on a new worker
        like the one launched for it, or on the same worker while that is connected."""
        session = services.create_again(self.get_object())
        session = services.sessions_visible_to(_user(request)).get(pk=session.pk)
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: SessionSerializer, **NOT_FOUND})
    @action(detail=True, methods=["post"])
    def keep(self, request: Request, **kwargs: str) -> Response:
        """Keep an idle session: its idle clock starts again now, and a warning that it is
        about to end is taken back."""
        session = self.get_object()
        idle.keep_session(session, owner=_user(request))
        return Response(SessionSerializer(session).data)

    @extend_schema(request=None, responses={202: SessionSerializer, **NOT_FOUND})
    def destroy(self, request: Request, **kwargs: str) -> Response:
        """Stop a session: its program ends; a worker launched for it is deleted too."""
        session = self.get_object()
        services.stop_session(session)
        session.refresh_from_db()
        return Response(SessionSerializer(session).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        responses={200: SessionKindSerializer(many=True), **NOT_AUTHENTICATED},
        filters=False,
    )
    @action(detail=False, methods=["get"], url_path="kinds", pagination_class=None)
    def list_kinds(self, request: Request) -> Response:
        """The types of session this platform launches for you: a name for `type`, a label,
        what it is, and the fields a launch may give `values` for."""
        return Response(
            [
                SessionKindSerializer(
                    {
                        "name": kind.name,
                        "label": kind.label,
                        "description": kind.description,
                        "fields": [asdict(item) for item in kind.fields],
                    }
                ).data
                for kind in kinds.seen_by(_user(request))
            ]
        )

    @extend_schema(
        responses={200: SessionEventSerializer(many=True), 400: ErrorSerializer, **NOT_FOUND}
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, **kwargs: str) -> Response:
        """The session's history: every status change with its reason, oldest first."""
        session = self.get_object()
        events = SessionEvent.objects.filter(session=session).order_by("at", "id")
        paginator = Pagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(SessionEventSerializer(page, many=True).data)
