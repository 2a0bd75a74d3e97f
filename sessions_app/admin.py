from __future__ import annotations

from django.contrib import admin

from sessions_app.models import Session


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["name", "session_type", "owner", "worker", "status", "status_reason"]
    list_filter = ["status", "session_type"]
    readonly_fields = ["status", "status_reason", "ended_at"]
    raw_id_fields = ["worker"]
