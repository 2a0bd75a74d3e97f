from __future__ import annotations

from django.contrib import admin

from files_app.models import FileRoot


@admin.register(FileRoot)
class FileRootAdmin(admin.ModelAdmin):
    list_display = ("cluster", "label", "path")
    list_filter = ("cluster",)
    search_fields = ("label", "path", "cluster__name")
