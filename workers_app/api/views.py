"""The REST API: thin views over workers_app.actions.

Visibility: a user sees their own workers (staff: everyone's), and a finished worker only until
ACTIVATE_PURGE_AFTER has passed; lists, GET, DELETE and events all follow that one rule, so any
other worker id answers 404. DELETE is idempotent: it answers 202 with the worker's current
state whether this call stopped it, an earlier call did, or it had already ended on its own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Prefetch, QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import ApiErrorsMixin
from core.api.responses import (
    ANY_SEGMENT,
    NOT_AUTHENTICATED,
    NOT_FOUND,
    ErrorSerializer,
    Pagination,
)
from core.transport.errors import SSHError
from schedulers.base import QueryFailed, SchedulerError
from workers_app import idle
from workers_app.actions import NotOwner, commands, deletion, requests, usage
from workers_app.actions import cluster_accounts as accounts
from workers_app.api.serializers import (
    ClusterAccountCreateSerializer,
    ClusterAccountSerializer,
    ClusterSerializer,
    CommandRequestSerializer,
    CommandResultSerializer,
    EnvironmentSerializer,
    SavedRequestCreateSerializer,
    SavedRequestSerializer,
    UsageSerializer,
    UserSerializer,
    WorkerBatchSerializer,
    WorkerCreateSerializer,
    WorkerEventSerializer,
    WorkerSerializer,
)
from workers_app.models import (
    Cluster,
    ClusterAccount,
    Environment,
    SavedRequest,
    Worker,
    WorkerEvent,
)
from workers_app.statuses import WorkerStatus

# Any path segment reaches the view, so an unknown name or id is the API's JSON 404 rather
# than the router's HTML one.
IDEMPOTENCY_KEY_MAX = 255
STATE_FIELDS = [f.attname for f in Worker._meta.concrete_fields if not f.is_relation]


def _user(request: Request) -> User:
    # IsAuthenticated has run: the user is a real one, not AnonymousUser.
    assert isinstance(request.user, User)
    return request.user


def _idempotency_key(request: Request) -> str:
    key = request.headers.get("Idempotency-Key", "")
    if len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable():
        raise ValidationError(
            {"Idempotency-Key": f"must be at most {IDEMPOTENCY_KEY_MAX} printable characters"}
        )
    return key


CREATED = PolymorphicProxySerializer(
    component_name="WorkerCreated",
    serializers=[WorkerSerializer, WorkerBatchSerializer],
    resource_type_field_name=None,
)


def _batch(workers: list[Worker]) -> dict[str, Any]:
    return {"count": len(workers), "workers": WorkerSerializer(workers, many=True).data}


class MeView(ApiErrorsMixin, APIView):
    @extend_schema(responses={200: UserSerializer, **NOT_AUTHENTICATED})
    def get(self, request: Request) -> Response:
        """The authenticated user (lets a client check its API key)."""
        return Response(UserSerializer(_user(request)).data)


class UsageView(ApiErrorsMixin, APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("month", OpenApiTypes.STR, description="YYYY-MM (UTC); default: this"),
            OpenApiParameter(
                "all", OpenApiTypes.BOOL, description="Staff: every user's, not only yours."
            ),
        ],
        responses={200: UsageSerializer, 400: ErrorSerializer, **NOT_AUTHENTICATED},
    )
    def get(self, request: Request) -> Response:
        """Node-hours from connected to stopped, per cluster and cluster account, in a month.
        A worker still connected counts up to now; one spanning months, for its part in each."""
        user = _user(request)
        since = _month(request.query_params.get("month", ""))
        until = usage.next_month(since)
        everyone = request.query_params.get("all", "").lower() in {"1", "true", "yes"}
        if everyone and not user.is_staff:
            raise ValidationError({"all": "only staff see every user's usage"})
        rows = usage.usage(since=since, until=until, users=None if everyone else [user])
        total = sum(row.node_seconds for row in rows)
        body: dict[str, Any] = {
            "since": since,
            "until": until,
            "node_seconds": total,
            "node_hours": round(total / 3600, 4),
            "rows": [{**vars(row), "node_hours": row.node_hours} for row in rows],
        }
        return Response(UsageSerializer(body).data)


def _month(raw: str) -> datetime:
    if not raw:
        return usage.month_start(timezone.now())
    try:
        first = datetime.strptime(raw, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise ValidationError({"month": "must be YYYY-MM, e.g. 2026-12"}) from None
    return first


@extend_schema_view(
    list=extend_schema(
        description="Clusters workers can be requested on.",
        responses={200: ClusterSerializer(many=True), 400: ErrorSerializer, **NOT_AUTHENTICATED},
    ),
    retrieve=extend_schema(
        description="One cluster, by name.", responses={200: ClusterSerializer, **NOT_FOUND}
    ),
)
class ClusterViewSet(ApiErrorsMixin, viewsets.ReadOnlyModelViewSet[Cluster]):
    serializer_class = ClusterSerializer
    pagination_class = Pagination
    lookup_field = "name"
    lookup_value_regex = ANY_SEGMENT
    # Never load the connection secrets, not even into memory.
    queryset = Cluster.objects.select_related("agent_relay").only(
        "id",
        "name",
        "scheduler",
        "reachability",
        "last_contact_at",
        "shared",
        "ca_public_key",
        "unix_name_rule",
        "unix_name_match",
        "unix_name_replace",
        "agent_route",
        "agent_relay__state",
        "agent_relay__checked_at",
    )

    def get_queryset(self) -> QuerySet[Cluster]:
        mine = ClusterAccount.objects.filter(user=_user(self.request))
        return self.queryset.visible_to(_user(self.request)).prefetch_related(
            Prefetch("accounts", queryset=mine, to_attr="my_accounts")
        )

    def _my_account(self, cluster: Cluster) -> ClusterAccount:
        account = accounts.account_of(_user(self.request), cluster)
        if account is None:
            raise NotFound(f"you have no account on {cluster.name}")
        return account

    @extend_schema(
        request=ClusterAccountCreateSerializer,
        responses={201: ClusterAccountSerializer, 400: ErrorSerializer, **NOT_FOUND},
        methods=["POST"],
        description="Connect your own account on the cluster. Without a private key the "
        "platform generates a key pair: install `public_key` in ~/.ssh/authorized_keys there, "
        "then verify.",
    )
    @extend_schema(
        responses={204: None, 400: ErrorSerializer, **NOT_FOUND},
        methods=["DELETE"],
        description="Forget your account on the cluster (refused while workers run as it).",
    )
    @action(detail=True, methods=["post", "delete"], url_path="account")
    def account(self, request: Request, **kwargs: str) -> Response:
        cluster = self.get_object()
        if request.method == "DELETE":
            accounts.disconnect_account(self._my_account(cluster))
            return Response(status=status.HTTP_204_NO_CONTENT)
        body = ClusterAccountCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        account = accounts.connect_account(
            _user(request),
            cluster,
            remote_username=body.validated_data["remote_username"],
            private_key=body.validated_data["private_key"],
        )
        return Response(ClusterAccountSerializer(account).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None,
        responses={200: ClusterAccountSerializer, **NOT_FOUND},
        description="Try the login of your account now; `verified` and `last_error` say how "
        "it went.",
    )
    @action(detail=True, methods=["post"], url_path="account/verify")
    def verify(self, request: Request, **kwargs: str) -> Response:
        account = self._my_account(self.get_object())
        accounts.verify_account(account)
        return Response(ClusterAccountSerializer(account).data)


@extend_schema_view(
    list=extend_schema(
        description="A cluster's environments, with the scheduling fields each lets you set.",
        responses={200: EnvironmentSerializer(many=True), 400: ErrorSerializer, **NOT_FOUND},
    ),
    retrieve=extend_schema(
        description="One environment of a cluster, by name.",
        responses={200: EnvironmentSerializer, **NOT_FOUND},
    ),
)
class EnvironmentViewSet(ApiErrorsMixin, viewsets.ReadOnlyModelViewSet[Environment]):
    serializer_class = EnvironmentSerializer
    pagination_class = Pagination
    lookup_field = "name"
    lookup_value_regex = ANY_SEGMENT
    queryset = Environment.objects.all()

    def get_queryset(self) -> QuerySet[Environment]:
        user = _user(self.request)
        cluster = get_object_or_404(
            Cluster.objects.visible_to(user).only("id", "name"), name=self.kwargs["cluster"]
        )
        return (
            Environment.objects.visible_to(user)
            .filter(cluster=cluster)
            .select_related("cluster")
            .prefetch_related("fields")
            .order_by("name")
        )


CLUSTER_FILTER = OpenApiParameter("cluster", OpenApiTypes.STR, description="A cluster name.")
STATUS_FILTER = OpenApiParameter("status", OpenApiTypes.STR, enum=WorkerStatus.values)


@extend_schema_view(
    list=extend_schema(
        description="Your workers (staff: everyone's), newest first. Finished workers are "
        "listed until ACTIVATE_PURGE_AFTER has passed.",
        parameters=[CLUSTER_FILTER, STATUS_FILTER],
        responses={200: WorkerSerializer(many=True), 400: ErrorSerializer, **NOT_AUTHENTICATED},
    ),
    retrieve=extend_schema(
        description="One worker, by id, while it is listed.",
        responses={200: WorkerSerializer, **NOT_FOUND},
    ),
)
class WorkerViewSet(
    ApiErrorsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Worker],
):
    serializer_class = WorkerSerializer
    pagination_class = Pagination
    parser_classes = [JSONParser]
    lookup_field = "public_id"
    lookup_url_kwarg = "id"
    lookup_value_regex = ANY_SEGMENT
    queryset = Worker.objects.all()

    def get_queryset(self) -> QuerySet[Worker]:
        workers: QuerySet[Worker] = Worker.objects.visible_to(_user(self.request))
        if self.action == "list":
            workers = self._filter(workers, self.request.query_params)
        return workers.select_related("cluster", "environment").order_by("-created_at", "-id")

    @staticmethod
    def _filter(workers: QuerySet[Worker], query: Any) -> QuerySet[Worker]:
        if cluster := query.get("cluster"):
            workers = workers.filter(cluster__name=cluster)
        if worker_status := query.get("status"):
            if worker_status not in WorkerStatus.values:
                allowed = ", ".join(WorkerStatus.values)
                raise ValidationError({"status": f"must be one of: {allowed}"})
            workers = workers.filter(status=worker_status)
        return workers

    @extend_schema(
        request=WorkerCreateSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="Any unique string per intended worker; a retry sends the same.",
            )
        ],
        responses={
            200: CREATED,
            201: CREATED,
            400: ErrorSerializer,
            **NOT_AUTHENTICATED,
        },
    )
    def create(self, request: Request) -> Response:
        """Request a worker; it starts pending and is submitted to the cluster's scheduler.

        With ``count``, that many workers alike in one request, answered as ``{count,
        workers}``; they are submitted together.

        Send an ``Idempotency-Key`` header to retry safely: a request that repeats a key you
        used before answers 200 with the worker (or workers) made then, and makes no more.
        """
        key = _idempotency_key(request)
        owner = _user(request)
        body = WorkerCreateSerializer(data=request.data)
        if isinstance(request.data, dict) and "count" in request.data:
            return self._create_many(owner, key, body)
        if key and (earlier := requests.worker_requested_with(owner, key)) is not None:
            return Response(WorkerSerializer(earlier).data, status=status.HTTP_200_OK)
        body.is_valid(raise_exception=True)
        worker = requests.request_worker(owner=owner, idempotency_key=key, **body.validated_data)
        return Response(WorkerSerializer(worker).data, status=status.HTTP_201_CREATED)

    def _create_many(self, owner: User, key: str, body: WorkerCreateSerializer) -> Response:
        if key and (earlier := requests.workers_requested_with(owner, key)):
            return Response(_batch(earlier), status=status.HTTP_200_OK)
        body.is_valid(raise_exception=True)
        workers = requests.request_workers(owner=owner, idempotency_key=key, **body.validated_data)
        return Response(_batch(workers), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: WorkerSerializer, **NOT_FOUND})
    def destroy(self, request: Request, **kwargs: str) -> Response:
        """Delete a worker: its sessions are deleted and its job cancelled.

        It answers at once: status ``stopping`` until the scheduler confirms the job gone, or
        ``stopped`` if no job was submitted yet. Deleting a finished worker changes nothing.
        """
        worker = self.get_object()
        deletion.delete_worker(worker)
        # Not the relations: the joined cluster and environment stay loaded for the answer.
        worker.refresh_from_db(fields=STATE_FIELDS)
        return Response(WorkerSerializer(worker).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="As for a new request: a retry sends the same and makes no more.",
            )
        ],
        responses={201: WorkerSerializer, 400: ErrorSerializer, 403: ErrorSerializer, **NOT_FOUND},
    )
    @action(detail=True, methods=["post"])
    def again(self, request: Request, **kwargs: str) -> Response:
        """Request another worker like this one: its environment, fields and name (finished or
        not; the fields are checked as the environment has them now)."""
        worker = self.get_object()
        key = _idempotency_key(request)
        owner = _user(request)
        if key and (earlier := requests.worker_requested_with(owner, key)) is not None:
            return Response(WorkerSerializer(earlier).data, status=status.HTTP_200_OK)
        try:
            again = requests.request_again(worker, owner=owner, idempotency_key=key)
        except NotOwner as exc:
            return Response({"field": None, "detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        return Response(WorkerSerializer(again).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None, responses={200: WorkerSerializer, 403: ErrorSerializer, **NOT_FOUND}
    )
    @action(detail=True, methods=["post"])
    def keep(self, request: Request, **kwargs: str) -> Response:
        """Keep an idle worker: its idle clock starts again now, and a warning that it is about
        to be deleted is taken back."""
        worker = self.get_object()
        try:
            idle.keep_worker(worker, owner=_user(request))
        except NotOwner as exc:
            return Response({"field": None, "detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        return Response(WorkerSerializer(worker).data)

    @extend_schema(
        responses={200: WorkerEventSerializer(many=True), 400: ErrorSerializer, **NOT_FOUND}
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, **kwargs: str) -> Response:
        """The worker's history: every status change with its reason, oldest first."""
        worker = self.get_object()
        events = WorkerEvent.objects.filter(worker=worker).order_by("at", "id")
        paginator = Pagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(WorkerEventSerializer(page, many=True).data)

    @extend_schema(
        request=CommandRequestSerializer,
        responses={
            200: CommandResultSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            409: ErrorSerializer,
            429: ErrorSerializer,
            502: ErrorSerializer,
            **NOT_FOUND,
        },
    )
    @action(detail=True, methods=["post"], url_path="exec")
    def run_command(self, request: Request, **kwargs: str) -> Response:
        """Run one command on a connected worker's node, inside its job (what `pw ssh` uses)."""
        worker = self.get_object()
        if worker.owner_id != _user(request).pk:
            # Staff see every worker; a command runs as the owner's own account, so only they.
            return Response(
                {"field": None, "detail": "only the worker's owner may run commands on it"},
                status=status.HTTP_403_FORBIDDEN,
            )
        body = CommandRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            result = commands.run_on_worker(
                worker, body.validated_data["command"], user=_user(request)
            )
        except commands.WorkerNotReady as exc:
            return Response({"field": None, "detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except commands.TooManyCommands as exc:
            return Response(
                {"field": None, "detail": str(exc)}, status=status.HTTP_429_TOO_MANY_REQUESTS
            )
        except (SSHError, QueryFailed, SchedulerError) as exc:
            return Response(
                {"field": None, "detail": f"cluster {worker.cluster.name}: {exc}"},
                status=status.HTTP_502_BAD_GATEWAY,
            )
        return Response(
            {
                "exit_status": result.exit_status,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "truncated": result.truncated,
            }
        )


@extend_schema_view(
    list=extend_schema(
        responses={
            200: SavedRequestSerializer(many=True),
            400: ErrorSerializer,
            **NOT_AUTHENTICATED,
        }
    ),
    retrieve=extend_schema(responses={200: SavedRequestSerializer, **NOT_FOUND}),
)
class SavedRequestViewSet(
    ApiErrorsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[SavedRequest],
):
    """Your saved worker requests: an environment and its fields under a name of yours, to
    request again (`pw workers create --from NAME`, the request dialog's list)."""

    serializer_class = SavedRequestSerializer
    pagination_class = Pagination
    parser_classes = [JSONParser]
    lookup_field = "name"
    lookup_url_kwarg = "name"
    lookup_value_regex = ANY_SEGMENT
    queryset = SavedRequest.objects.all()

    def get_queryset(self) -> QuerySet[SavedRequest]:
        return requests.saved_requests_of(_user(self.request))

    @extend_schema(
        request=SavedRequestCreateSerializer,
        responses={
            200: SavedRequestSerializer,
            201: SavedRequestSerializer,
            400: ErrorSerializer,
            **NOT_AUTHENTICATED,
        },
    )
    def create(self, request: Request) -> Response:
        """Save a request under a name: 201 when new, 200 when it replaced one of that name.
        The fields are checked now, as a request would be, and kept with defaults filled in."""
        body = SavedRequestCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        saved, created = requests.save_request(owner=_user(request), **body.validated_data)
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(SavedRequestSerializer(saved).data, status=code)

    @extend_schema(request=None, responses={204: None, **NOT_FOUND})
    def destroy(self, request: Request, **kwargs: str) -> Response:
        """Forget a saved request (workers requested from it are not touched)."""
        requests.delete_saved_request(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
