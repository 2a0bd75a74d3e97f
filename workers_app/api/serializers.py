from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from identity.unix_names import unix_name_on
from workers_app import idle
from workers_app.actions.requests import BULK_MAX, NAME_MAX
from workers_app.models import (
    AgentRelay,
    Cluster,
    ClusterAccount,
    Environment,
    EnvironmentField,
    RelayState,
    SavedRequest,
    Worker,
    WorkerEvent,
)
from workers_app.statuses import WorkerStatus


class UserSerializer(serializers.Serializer[Any]):
    username = serializers.CharField()
    is_staff = serializers.BooleanField()


class ClusterAccountSerializer(serializers.ModelSerializer[ClusterAccount]):
    verified = serializers.BooleanField(source="is_verified", read_only=True)

    class Meta:
        model = ClusterAccount
        # The private key never leaves the server; the public line is what the user installs.
        fields = [
            "remote_username",
            "verified",
            "verified_at",
            "public_key",
            "origin",
            "last_error",
        ]
        read_only_fields = fields


class ClusterAccountCreateSerializer(serializers.Serializer[None]):
    remote_username = serializers.CharField(max_length=64, help_text="Your user name there.")
    private_key = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=16384,
        trim_whitespace=False,
        help_text="Your own private key; leave it out and the platform generates a key pair.",
    )


class ClusterSerializer(serializers.ModelSerializer[Cluster]):
    account = serializers.SerializerMethodField(
        help_text="Your own account on this cluster, if any (null on a shared cluster too)."
    )
    login = serializers.SerializerMethodField(
        help_text="How you log in there: `certificate` (the platform signs one for you: connect "
        "nothing), `key` (your own account's key) or `shared` (the cluster's own account)."
    )
    unix_name = serializers.SerializerMethodField(
        help_text="Your Unix name there: your account's, else (certificate clusters) the one "
        "the cluster's rule makes of your name; null when there is none."
    )

    class Meta:
        model = Cluster
        # Deliberately an allowlist: host, user and key material never leave the server (nor
        # the relay's address on the login host).
        fields = [
            "name",
            "scheduler",
            "reachability",
            "last_contact_at",
            "shared",
            "account",
            "login",
            "unix_name",
            "agent_route",
            "relay_state",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=["certificate", "key", "shared"]))
    def get_login(self, cluster: Cluster) -> str:
        if cluster.shared:
            return "shared"
        return "certificate" if cluster.ca_public_key else "key"

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_unix_name(self, cluster: Cluster) -> str | None:
        mine = getattr(cluster, "my_accounts", [])
        if mine:
            return str(mine[0].remote_username)
        request = self.context.get("request")
        if cluster.shared or not cluster.ca_public_key or request is None:
            return None
        return unix_name_on(request.user, cluster)

    relay_state = serializers.SerializerMethodField(
        help_text="Agents via the login host: their relay there, as the platform last saw it "
        "(unknown when nothing keeps it). Null when agents reach the platform directly."
    )

    @extend_schema_field(serializers.ChoiceField(choices=RelayState.choices, allow_null=True))
    def get_relay_state(self, cluster: Cluster) -> str | None:
        if cluster.agent_route == "direct":
            return None
        try:
            relay: AgentRelay = cluster.agent_relay
        except AgentRelay.DoesNotExist:
            return RelayState.UNKNOWN
        return relay.state_now(timezone.now())

    @extend_schema_field(ClusterAccountSerializer(allow_null=True))
    def get_account(self, cluster: Cluster) -> dict[str, Any] | None:
        mine = getattr(cluster, "my_accounts", [])
        return ClusterAccountSerializer(mine[0]).data if mine else None


class EnvironmentFieldSerializer(serializers.ModelSerializer[EnvironmentField]):
    choices = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = EnvironmentField
        fields = ["name", "label", "kind", "default", "required", "pattern", "choices"]
        read_only_fields = fields


class EnvironmentSerializer(serializers.ModelSerializer[Environment]):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    active = serializers.BooleanField(source="is_active", read_only=True)
    # The metaclass moves declared fields away, so this does not shadow Serializer.fields.
    fields = EnvironmentFieldSerializer(many=True, read_only=True)  # type: ignore[assignment]

    class Meta:
        model = Environment
        fields = [
            "name",
            "cluster",
            "partition",
            "source",
            "active",
            "nodes_total",
            "nodes_available",
            "nodes_updated_at",
            "fields",
        ]
        read_only_fields = fields


class WorkerListSerializer(serializers.ListSerializer[Worker]):
    """A list reads how idle its workers are at once (one Redis round trip, one query)."""

    def to_representation(self, data: Any) -> list[Any]:
        workers = list(data.all() if hasattr(data, "all") else data)
        assert isinstance(self.child, WorkerSerializer)
        self.child.idleness = idle.idleness_of(workers)
        return super().to_representation(workers)


class WorkerSerializer(serializers.ModelSerializer[Worker]):
    id = serializers.CharField(source="public_id", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    environment = serializers.CharField(source="environment.name", read_only=True, allow_null=True)
    params = serializers.DictField(child=serializers.CharField(), read_only=True)
    idle_since = serializers.SerializerMethodField(
        help_text="Since when nothing has run or been used on the connected worker (its job's "
        "CPU and I/O as its agent measures them, terminals, proxied session traffic); null "
        "when busy or not measured."
    )
    activity = serializers.SerializerMethodField(
        help_text="The agent's last report: the job's share of a core and its bytes a second."
    )

    idleness: dict[int, idle.Idleness] | None = None

    class Meta:
        model = Worker
        list_serializer_class = WorkerListSerializer
        fields = [
            "id",
            "name",
            "cluster",
            "environment",
            "status",
            "status_reason",
            "scheduler_job_id",
            "node_hostname",
            "params",
            "scheduler_state",
            "exit_code",
            "created_at",
            "updated_at",
            "submitted_at",
            "connected_at",
            "finished_at",
            "idle_minutes",
            "idle_since",
            "idle_warned_at",
            "activity",
        ]
        read_only_fields = fields

    def _idleness(self, worker: Worker) -> idle.Idleness | None:
        """Read for the whole list at once (WorkerListSerializer); a worker alone, here."""
        if worker.status != WorkerStatus.CONNECTED:
            return None
        found = self.idleness
        if found is None or worker.pk not in found:
            found = {**(found or {}), **idle.idleness_of([worker])}
            self.idleness = found
        state: idle.Idleness | None = found.get(worker.pk)
        return state

    @extend_schema_field(OpenApiTypes.DATETIME)
    def get_idle_since(self, worker: Worker) -> datetime | None:
        state = self._idleness(worker)
        if state is None or state.idle_for(timezone.now()) <= 0:
            return None
        return state.quiet_since

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "properties": {"cpu": {"type": "number"}, "io": {"type": "number"}},
        }
    )
    def get_activity(self, worker: Worker) -> dict[str, float] | None:
        state = self._idleness(worker)
        if state is None or state.cpu is None or state.io is None:
            return None
        return {"cpu": state.cpu, "io": state.io}


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": 'Scheduling fields of the environment, e.g. {"walltime": "01:00:00"}.',
    }
)
class ParamsField(serializers.DictField):
    """Values are checked by the environment's field rules, which name the offending field."""


class WorkerCreateSerializer(serializers.Serializer[None]):
    cluster = serializers.CharField(max_length=64, help_text="Cluster name.")
    environment = serializers.CharField(max_length=64, help_text="Environment name.")
    params = ParamsField(required=False, default=dict)
    name = serializers.CharField(
        max_length=NAME_MAX,
        required=False,
        allow_blank=True,
        default="",
        help_text="Defaults to <environment>-<id>.",
    )
    idle_minutes = serializers.FloatField(
        required=False,
        allow_null=True,
        min_value=0,
        help_text="Delete the worker after this many minutes idle (a warning comes first); 0: "
        "never. Left out: the site's default for the environment.",
    )
    count = serializers.IntegerField(
        min_value=1,
        max_value=BULK_MAX,
        required=False,
        help_text="Request this many workers alike at once (named <name>-1 ... <name>-N when a "
        "name is given); the answer is then {count, workers}.",
    )


class WorkerBatchSerializer(serializers.Serializer[None]):
    count = serializers.IntegerField(help_text="How many workers the request made.")
    workers = WorkerSerializer(many=True)


class WorkerEventSerializer(serializers.ModelSerializer[WorkerEvent]):
    class Meta:
        model = WorkerEvent
        fields = ["old_status", "new_status", "reason", "at"]
        read_only_fields = fields


class CommandRequestSerializer(serializers.Serializer[None]):
    command = serializers.ListField(
        child=serializers.CharField(max_length=4096, trim_whitespace=False),
        min_length=1,
        max_length=256,
        help_text="The command and its arguments; each is quoted, none goes through a shell.",
    )


class CommandResultSerializer(serializers.Serializer[None]):
    exit_status = serializers.IntegerField(help_text="-1 when the output was cut short.")
    stdout = serializers.CharField(allow_blank=True)
    stderr = serializers.CharField(allow_blank=True)
    truncated = serializers.BooleanField(
        help_text="The output passed the platform's limit; the command was left running."
    )


class SavedRequestSerializer(serializers.ModelSerializer[SavedRequest]):
    cluster = serializers.CharField(source="environment.cluster.name", read_only=True)
    environment = serializers.CharField(source="environment.name", read_only=True)
    params = serializers.DictField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = SavedRequest
        fields = ["name", "cluster", "environment", "params", "created_at", "updated_at"]
        read_only_fields = fields


class SavedRequestCreateSerializer(serializers.Serializer[None]):
    name = serializers.CharField(
        max_length=64, help_text="Letters, digits, '-' and '_'; saving a name again replaces it."
    )
    cluster = serializers.CharField(max_length=64, help_text="Cluster name.")
    environment = serializers.CharField(max_length=64, help_text="Environment name.")
    params = ParamsField(required=False, default=dict)


class UsageRowSerializer(serializers.Serializer[dict[str, Any]]):
    user = serializers.CharField()
    cluster = serializers.CharField()
    account = serializers.CharField(help_text="Your cluster account's user name; empty if shared.")
    workers = serializers.IntegerField(help_text="Workers that were connected in the period.")
    node_seconds = serializers.IntegerField()
    node_hours = serializers.FloatField()


class UsageSerializer(serializers.Serializer[dict[str, Any]]):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    node_seconds = serializers.IntegerField()
    node_hours = serializers.FloatField()
    rows = UsageRowSerializer(many=True)
