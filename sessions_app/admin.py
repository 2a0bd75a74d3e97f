from __future__ import annotations

from django.contrib import admin

from sessions_app.catalog import admin as catalog_admin  # noqa: F401 - registers the apps
from sessions_app.models import Session, SessionEvent


class SessionEventInline(admin.TabularInline):
    model = SessionEvent
    extra = 0
    can_delete = False
    readonly_fields = ["old_status", "new_status", "reason", "at"]

    def has_add_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "public_id",
        "session_type",
        "owner",
        "worker",
        "status",
        "status_reason",
    ]
    list_filter = ["status", "session_type"]
    search_fields = ["name", "public_id", "owner__username"]
    # Statuses change only through sessions_app.lifecycle; secrets are never shown.
    readonly_fields = [
        "public_id",
        "status",
        "status_reason",
        "node_host",
        "node_port",
        "node_pid",
        "created_at",
        "started_at",
        "ended_at",
    ]
    exclude = ["secret_encrypted", "login_cookie_encrypted"]
    raw_id_fields = ["worker"]
    inlines = [SessionEventInline]
