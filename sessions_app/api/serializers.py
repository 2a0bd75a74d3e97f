from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers

from sessions_app.models import Session, SessionEvent
from sessions_app.statuses import SessionStatus
from workers_app.api.serializers import ParamsField


class SessionSerializer(serializers.ModelSerializer[Session]):
    id = serializers.CharField(source="public_id", read_only=True)
    type = serializers.CharField(
        source="session_type", read_only=True, help_text="As GET /api/sessions/kinds/ lists."
    )
    values = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        read_only=True,
        help_text="What was given the type's fields (defaults filled in).",
    )
    folder = serializers.CharField(
        read_only=True, help_text="The folder on the cluster it opened in (empty: your home)."
    )
    status = serializers.ChoiceField(choices=SessionStatus.choices, read_only=True)
    reason = serializers.CharField(source="status_reason", read_only=True)
    cluster = serializers.CharField(source="worker.cluster.name", read_only=True)
    environment = serializers.SerializerMethodField()
    partition = serializers.CharField(source="worker.job_partition", read_only=True)
    worker = serializers.CharField(source="worker.public_id", read_only=True)
    worker_name = serializers.CharField(source="worker.name", read_only=True)
    worker_status = serializers.CharField(source="worker.status", read_only=True)
    node = serializers.CharField(source="worker.node_hostname", read_only=True)
    job_id = serializers.CharField(source="worker.scheduler_job_id", read_only=True)
    url = serializers.SerializerMethodField(help_text="Where the browser opens it.")

    class Meta:
        model = Session
        fields = [
            "id",
            "name",
            "type",
            "values",
            "folder",
            "status",
            "reason",
            "cluster",
            "environment",
            "partition",
            "worker",
            "worker_name",
            "worker_status",
            "dedicated_worker",
            "node",
            "job_id",
            "url",
            "created_at",
            "started_at",
            "ended_at",
            "idle_minutes",
            "idle_warned_at",
        ]
        read_only_fields = fields

    def get_environment(self, session: Session) -> str | None:
        environment = session.worker.environment
        return environment.name if environment is not None else None

    def get_url(self, session: Session) -> str:
        return settings.ACTIVATE_PUBLIC_URL.rstrip("/") + session.url_path


class ValueField(serializers.CharField):
    """A value as given: the type's own fields check it (sessions_app.catalog.values), so that
    a refusal names ``values.<field>`` however the value is wrong."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=True, trim_whitespace=False, **kwargs)
        self.validators = [
            v for v in self.validators if not isinstance(v, ProhibitNullCharactersValidator)
        ]


class SessionCreateSerializer(serializers.Serializer[None]):
    type = serializers.CharField(
        max_length=32, help_text="A session type, as GET /api/sessions/kinds/ lists."
    )
    values = serializers.DictField(
        child=ValueField(),
        required=False,
        default=dict,
        help_text="Values for the type's fields, by name (as GET /api/sessions/kinds/ lists "
        "them); a field left out takes its default.",
    )
    cluster = serializers.CharField(max_length=64, help_text="Cluster name.")
    environment = serializers.CharField(
        max_length=64,
        required=False,
        default="",
        allow_blank=True,
        help_text="Launch on a new worker of this environment, dedicated to the session.",
    )
    worker = serializers.CharField(
        max_length=16,
        required=False,
        default="",
        allow_blank=True,
        help_text="Or run on this connected worker of yours.",
    )
    params = ParamsField(required=False, default=dict)
    folder = serializers.CharField(
        max_length=4096,
        required=False,
        default="",
        allow_blank=True,
        trim_whitespace=False,
        help_text='The folder on the cluster its program opens in: absolute, or "~/..." in '
        "your home (the default). The cluster says whether you may.",
    )
    idle_minutes = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        min_value=0,
        help_text="End the session after this many minutes without traffic or work on the node "
        "(a warning comes first); 0: never. Left out: the environment's default on a new "
        "worker, never on a worker of yours.",
    )
    name = serializers.CharField(
        max_length=64,
        required=False,
        allow_blank=True,
        default="",
        help_text="Letters, digits and underscores; defaults to <type>_<timestamp>.",
    )


class SessionKindFieldSerializer(serializers.Serializer[dict[str, object]]):
    name = serializers.CharField(read_only=True, help_text="What `values` takes it by.")
    label = serializers.CharField(read_only=True)  # type: ignore[assignment]
    default = serializers.CharField(read_only=True)
    pattern = serializers.CharField(read_only=True, help_text="A value must match it whole.")
    required = serializers.BooleanField(read_only=True)  # type: ignore[assignment]
    choices = serializers.ListField(child=serializers.CharField(), read_only=True)


class SessionKindSerializer(serializers.Serializer[dict[str, object]]):
    name = serializers.CharField(read_only=True, help_text="What `type` takes.")
    # A field named like Field.label: the serializer's metaclass takes it out of the class.
    label = serializers.CharField(read_only=True)  # type: ignore[assignment]
    description = serializers.CharField(read_only=True)
    fields = SessionKindFieldSerializer(  # type: ignore[assignment]
        many=True, read_only=True, help_text="What a launch may give in `values`."
    )


class SessionEventSerializer(serializers.ModelSerializer[SessionEvent]):
    class Meta:
        model = SessionEvent
        fields = ["old_status", "new_status", "reason", "at"]
        read_only_fields = fields
