from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from core.errors import ParameterError
from core.transport.hostkeys import HostKeyUnreadable, fetch_host_key, fingerprint
from identity.certificates import sshd_instructions
from workers_app import idle
from workers_app.actions import cluster_accounts as accounts
from workers_app.actions import clusters, deletion, usage
from workers_app.actions.cluster_accounts import public_key_of
from workers_app.liveness import Breakers
from workers_app.models import (
    AccountOrigin,
    AgentRelay,
    AgentRoute,
    ApiKey,
    Cluster,
    ClusterAccount,
    Environment,
    EnvironmentField,
    TerminalRecord,
    UnixNameRule,
    UsageCap,
    Worker,
    WorkerCommand,
    WorkerEvent,
)

# The product's name, and "View site" leads to the browser UI.
admin.site.site_header = "ACTIVATE administration"
admin.site.site_title = "ACTIVATE administration"
admin.site.index_title = "Clusters, environments, workers and keys"
admin.site.site_url = "/"


class ClusterForm(forms.ModelForm):
    # Write-only: the stored key is never rendered back, not even encrypted.
    private_key = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "autocomplete": "off"}),
        help_text="Paste an OpenSSH private key to set or replace it. Left empty, the key stays.",
    )

    class Meta:
        model = Cluster
        fields = [
            "name",
            "host",
            "port",
            "username",
            "host_key",
            "scheduler",
            "shared",
            "agent_route",
            "relay_host",
            "relay_port",
            "idle_minutes",
            "unix_name_rule",
            "unix_name_match",
            "unix_name_replace",
            "allowed_groups",
        ]

    def clean_idle_minutes(self) -> float | None:
        minutes: float | None = self.cleaned_data.get("idle_minutes")
        problem = idle.policy_problem(minutes)
        if problem:
            raise forms.ValidationError(problem)
        return minutes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Left out of a form post, the route stays direct and the relay's port is picked.
        self.fields["agent_route"].required = False
        self.fields["relay_port"].required = False
        self.fields["unix_name_rule"].required = False

    def clean_agent_route(self) -> str:
        return str(self.cleaned_data.get("agent_route") or AgentRoute.DIRECT)

    def clean_unix_name_rule(self) -> str:
        return str(self.cleaned_data.get("unix_name_rule") or UnixNameRule.AS_IS)

    def clean_relay_port(self) -> int:
        return int(self.cleaned_data.get("relay_port") or 0)

    def registration(self) -> clusters.ClusterRegistration:
        data = self.cleaned_data
        return clusters.ClusterRegistration(
            name=data["name"],
            host=data["host"],
            port=data["port"],
            scheduler=data["scheduler"],
            host_key=data.get("host_key", ""),
            username=data.get("username", ""),
            # Left empty, the stored key stays.
            private_key=data.get("private_key", "").strip() or None,
            shared=data.get("shared", False),
            agent_route=data["agent_route"],
            relay_host=data.get("relay_host", ""),
            relay_port=data["relay_port"],
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors:
            # The form checks each field and the model; the registration what lies between.
            for field, messages in clusters.registration_errors(
                self.registration(), cluster=self.instance
            ).items():
                for message in messages:
                    self.add_error(field, message)
        return data


class ClusterAccountForm(forms.ModelForm):
    # Write-only, like the cluster's own key.
    private_key = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "autocomplete": "off"}),
        help_text="The user's OpenSSH private key for this account. Left empty, the key stays; "
        "on a cluster the platform is the CA of, none is needed (the name is an override).",
    )

    class Meta:
        model = ClusterAccount
        fields = ["user", "cluster", "remote_username"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        pem = data.get("private_key", "").strip()
        if pem:
            try:
                data["public_key"] = public_key_of(pem)
            except ParameterError as exc:
                self.add_error("private_key", exc.message)
        elif not self.instance.private_key_encrypted:
            cluster = data.get("cluster")
            if cluster is None or not cluster.ca_public_key:
                self.add_error("private_key", "A new account needs its private key.")
        return data

    def save(self, commit: bool = True) -> ClusterAccount:
        account: ClusterAccount = super().save(commit=False)
        pem = self.cleaned_data.get("private_key", "").strip()
        if pem:
            account.set_private_key(pem + "\n")
            account.public_key = self.cleaned_data["public_key"]
            account.origin = AccountOrigin.OPERATOR
            account.verified_at = None
        elif not account.private_key_encrypted and (
            "remote_username" in self.changed_data or not account.origin
        ):
            # The operator's name for a certificate login: kept whatever the cluster's rule says.
            account.origin = AccountOrigin.OPERATOR
        if commit:
            account.save()
        return account


@admin.register(ClusterAccount)
class ClusterAccountAdmin(admin.ModelAdmin):
    form = ClusterAccountForm
    list_display = ["user", "cluster", "remote_username", "origin", "verified_at", "last_error"]
    list_filter = ["cluster", "origin"]
    search_fields = ["user__username", "remote_username"]
    readonly_fields = ["public_key", "origin", "verified_at", "last_error"]
    actions = ["verify"]

    @admin.action(description="Verify the login of the selected accounts")
    def verify(self, request: HttpRequest, queryset: QuerySet[ClusterAccount]) -> None:
        for account in queryset.select_related("cluster"):
            if accounts.verify_account(account):
                self.message_user(request, f"{account}: verified")
            else:
                self.message_user(request, f"{account}: {account.last_error}", messages.ERROR)


@admin.register(WorkerCommand)
class WorkerCommandAdmin(admin.ModelAdmin):
    list_display = ["started_at", "user", "worker", "__str__", "exit_status", "error"]
    list_filter = ["started_at"]
    search_fields = ["user__username", "worker__public_id"]
    raw_id_fields = ["worker", "user"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(TerminalRecord)
class TerminalRecordAdmin(admin.ModelAdmin):
    list_display = [
        "opened_at",
        "user",
        "worker_public_id",
        "kind",
        "client",
        "open_for",
        "exit_status",
        "close_reason",
    ]
    list_filter = ["opened_at", "pty", "client"]
    search_fields = ["user__username", "worker_public_id"]
    raw_id_fields = ["worker", "user"]

    @admin.display(description="what")
    def kind(self, record: TerminalRecord) -> str:
        shell = "shell" if not record.command else " ".join(record.command)[:60]
        return f"{shell} (terminal)" if record.pty else shell

    @admin.display(description="open for")
    def open_for(self, record: TerminalRecord) -> str:
        duration = record.duration
        return "still open" if duration is None else str(duration).split(".")[0]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def relay_of(cluster: Cluster) -> AgentRelay | None:
    try:
        return cluster.agent_relay
    except AgentRelay.DoesNotExist:
        return None


class EnvironmentInline(admin.TabularInline):
    model = Environment
    extra = 0
    fields = [
        "name",
        "partition",
        "source",
        "is_active",
        "idle_minutes",
        "nodes_total",
        "nodes_available",
    ]
    readonly_fields = ["nodes_total", "nodes_available"]
    show_change_link = True


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    list_display = [
        "name",
        "host",
        "scheduler",
        "accounts_mode",
        "reachability",
        "agents_route",
        "heartbeat_breaker",
        "last_contact_at",
        "key_is_set",
    ]
    list_select_related = ["agent_relay"]
    readonly_fields = [
        "reachability",
        "last_contact_at",
        "last_error",
        "key_is_set",
        "host_key_fingerprint",
        "relay_status",
        "certificate_authority",
    ]
    inlines = [EnvironmentInline]
    filter_horizontal = ["allowed_groups"]
    actions = ["probe", "pin_host_key", "confirm_lost_workers", "make_ca", "rotate_ca", "remove_ca"]

    def save_model(self, request: HttpRequest, obj: Cluster, form: Any, change: bool) -> None:
        clusters.register_cluster(form.registration(), cluster=obj)
        if obj.has_private_key:
            self.message_user(request, f"{obj.name}: its partitions are being probed.")

    @admin.display(boolean=True, description="private key set")
    def key_is_set(self, obj: Cluster) -> bool:
        return obj.has_private_key

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        # One Redis read for the whole page, not one per row.
        self._breakers = Breakers().all_open()
        return super().changelist_view(request, extra_context)

    @admin.display(description="heartbeat breaker")
    def heartbeat_breaker(self, obj: Cluster) -> str:
        held = getattr(self, "_breakers", {}).get(obj.pk)
        if held is None:
            return "-"
        return (
            f"OPEN: {held['silent']:.0f} of {held['connected']:.0f} silent at once; "
            "kept until confirmed"
        )

    @admin.action(description="Confirm lost workers (the heartbeat breaker holds them)")
    def confirm_lost_workers(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        breakers = Breakers()
        for cluster in queryset:
            breakers.confirm(cluster.pk)
            self.message_user(request, f"{cluster.name}: the next sweep stops its silent workers")

    @admin.display(description="agents")
    def agents_route(self, obj: Cluster) -> str:
        if obj.agent_route == AgentRoute.DIRECT:
            return "direct"
        relay = relay_of(obj)
        state = relay.state_now(timezone.now()) if relay else "not started (is run_relays running?)"
        return f"via login host: relay {state}"

    @admin.display(description="relay on the login host")
    def relay_status(self, obj: Cluster) -> str:
        relay = relay_of(obj)
        if relay is None:
            return "none" if obj.agent_route == AgentRoute.DIRECT else "not started yet"
        lines = [
            f"{relay.state_now(timezone.now())}; agents are given {relay.address or '-'}",
            f"kept by {relay.holder or '-'}, up since {relay.up_since or '-'}, "
            f"last checked {relay.checked_at or '-'}, repaired {relay.repairs} times",
        ]
        if relay.last_error:
            lines.append(f"last problem: {relay.last_error}")
        return "\n".join(lines)

    @admin.display(description="accounts")
    def accounts_mode(self, obj: Cluster) -> str:
        return f"SHARED: everyone acts as {obj.username}" if obj.shared else "per user"

    @admin.display(description="SSH certificate authority")
    def certificate_authority(self, obj: Cluster) -> str:
        # The public half only: the private key is never shown, not even encrypted.
        if not obj.ca_public_key:
            return "none: users log in with keys of their own (action: make the platform its CA)"
        return sshd_instructions(obj.ca_public_key)

    @admin.action(description="Make the platform their SSH certificate authority (kept if so)")
    def make_ca(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            public = clusters.make_cluster_authority(cluster)
            self.message_user(request, f"{cluster.name}: its login hosts need {public}")

    @admin.action(description="Rotate their SSH certificate authority's key")
    def rotate_ca(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            public = clusters.make_cluster_authority(cluster, rotate=True)
            message = f"{cluster.name}: new logins need {public} on its login hosts"
            self.message_user(request, message, messages.WARNING)

    @admin.action(description="Stop signing certificates for them")
    def remove_ca(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            clusters.remove_cluster_authority(cluster)
            self.message_user(request, f"{cluster.name}: the platform signs no more certificates")

    @admin.display(description="host key fingerprint")
    def host_key_fingerprint(self, obj: Cluster) -> str:
        try:
            return fingerprint(obj.host_key) if obj.host_key else "not pinned"
        except ValueError as exc:
            return f"invalid: {exc}"

    @admin.action(description="Probe now: reachability and auto-detected environments")
    def probe(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            if clusters.probe_cluster(cluster.pk):
                self.message_user(request, f"{cluster.name}: online", messages.SUCCESS)
            else:
                cluster.refresh_from_db()
                self.message_user(request, f"{cluster.name}: {cluster.last_error}", messages.ERROR)

    @admin.action(description="Fetch and pin the host key (only clusters with none pinned)")
    def pin_host_key(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            if cluster.host_key:
                self.message_user(
                    request, f"{cluster.name}: a key is already pinned; edit it to replace it"
                )
                continue
            try:
                key = fetch_host_key(cluster.host, cluster.port, timeout=10)
            except HostKeyUnreadable as exc:
                self.message_user(request, f"{cluster.name}: {exc}", messages.ERROR)
                continue
            Cluster.objects.filter(pk=cluster.pk, host_key="").update(host_key=key)
            self.message_user(
                request,
                f"{cluster.name}: pinned {fingerprint(key)}; compare it with the cluster's own.",
                messages.WARNING,
            )


class EnvironmentFieldInline(admin.TabularInline):
    model = EnvironmentField
    extra = 0


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "partition", "source", "is_active", "nodes_available"]
    list_filter = ["cluster", "source", "is_active"]
    filter_horizontal = ["allowed_groups"]
    inlines = [EnvironmentFieldInline]


class WorkerEventInline(admin.TabularInline):
    model = WorkerEvent
    extra = 0
    can_delete = False
    fields = ["at", "old_status", "new_status", "reason"]
    readonly_fields = ["at", "old_status", "new_status", "reason"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = [
        "public_id",
        "name",
        "owner",
        "cluster",
        "status",
        "status_reason",
        "scheduler_job_id",
        "node_hostname",
        "created_at",
    ]
    list_filter = ["status", "cluster", "owner"]
    search_fields = ["public_id", "name", "scheduler_job_id", "node_hostname"]
    list_select_related = ["owner", "cluster"]
    inlines = [WorkerEventInline]
    actions = ["delete_through_lifecycle"]
    readonly_fields = [f.name for f in Worker._meta.get_fields() if getattr(f, "concrete", False)]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Rows are the history; "deleting" a worker means stopping it through the lifecycle.
        return False

    @admin.action(description="Delete selected workers (cancel their jobs)")
    def delete_through_lifecycle(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        changed = sum(deletion.delete_worker(worker) for worker in queryset)
        self.message_user(request, f"Asked {changed} worker(s) to stop.", messages.SUCCESS)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "created_at", "last_used_at"]
    fields = ["user", "name"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key, secret = ApiKey.issue(obj.user, name=obj.name)
        obj.pk, obj.prefix = key.pk, key.prefix
        self.message_user(
            request, f"New API key (shown once, copy it now): {secret}", messages.WARNING
        )


@admin.register(UsageCap)
class UsageCapAdmin(admin.ModelAdmin):
    """Caps per user (or for everyone) on a cluster, above this month's totals to judge them by."""

    list_display = ["cluster", "user", "max_workers", "max_node_hours_month"]
    list_filter = ["cluster"]
    search_fields = ["user__username", "cluster__name"]
    autocomplete_fields = ["user"]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        since = usage.month_start(timezone.now())
        rows = usage.usage(since=since, until=usage.next_month(since))
        per_user: dict[str, int] = {}
        for row in rows:
            per_user[row.user] = per_user.get(row.user, 0) + row.node_seconds
        context = {
            **(extra_context or {}),
            "usage_since": since,
            "usage_rows": rows,
            "usage_per_user": [(user, usage.clock(s), s / 3600) for user, s in per_user.items()],
        }
        return super().changelist_view(request, extra_context=context)
