"""The catalogue in the admin: an app with its fields inline, checked by ``rules`` as the
importer checks a file; Export as YAML (an action) and Import YAML (a page of its own)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from sessions_app.catalog import rules, store
from sessions_app.catalog.models import App, AppField
from sessions_app.catalog.yaml_files import CatalogFileError, dump, import_texts
from sessions_app.models import Session
from sessions_app.statuses import LIVE

MAX_UPLOAD = 1024 * 1024


class AppFieldFormSet(BaseInlineFormSet):
    """Checks the whole app once its fields are known (a command names them)."""

    def clean(self) -> None:
        super().clean()
        app: App = self.instance
        fields = [
            {key: form.cleaned_data.get(key) for key in rules.FIELD_KEYS}
            for form in self.forms
            if form.cleaned_data and not form.cleaned_data.get("DELETE")
        ]
        data = {
            "name": app.name,
            "label": app.label,
            "description": app.description,
            "icon": app.icon,
            "command": app.command,
            "env": app.env,
            "reach": app.reach,
            "keeps_prefix": app.keeps_prefix,
            "ready": {
                "path": app.ready_path,
                "statuses": app.ready_statuses,
                "timeout": app.start_timeout,
            },
            "login": app.login,
            "landing_path": app.landing_path,
            "fields": fields,
        }
        try:
            rules.read(data)
        except rules.AppProblems as exc:
            raise ValidationError(
                [f"{rules.spell(p) or 'app'}: {message}" for p, message in exc.problems]
            ) from None


class AppFieldInline(admin.TabularInline):
    model = AppField
    formset = AppFieldFormSet
    extra = 0
    fields = ["position", "name", "label", "default", "pattern", "required", "choices"]


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    widget = MultipleFileInput

    def clean(self, data: Any, initial: Any = None) -> list[Any]:
        each = data if isinstance(data, list | tuple) else [data]
        return [super(MultipleFileField, self).clean(item, initial) for item in each]


class ImportForm(forms.Form):
    uploads = MultipleFileField(
        help_text="One or more .yaml files (what Export as YAML and manage.py export_apps write)."
    )


@admin.register(App)
class AppAdmin(admin.ModelAdmin):
    list_display = ["name", "label", "reach", "enabled", "updated_at"]
    list_filter = ["enabled", "reach"]
    search_fields = ["name", "label", "description"]
    filter_horizontal = ["clusters", "environments", "groups"]
    inlines = [AppFieldInline]
    actions = ["export_yaml"]
    change_list_template = "admin/sessions_app/app/change_list.html"

    def has_delete_permission(self, request: HttpRequest, obj: App | None = None) -> bool:
        # A live session of the app still needs it (its proxy, its stop): disable it instead.
        if obj is not None and Session.objects.filter(session_type=obj.name, status__in=LIVE):
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[App]) -> None:
        used = set(
            Session.objects.filter(
                session_type__in=queryset.values("name"), status__in=LIVE
            ).values_list("session_type", flat=True)
        )
        if used:
            self.message_user(
                request,
                f"Not deleted: {', '.join(sorted(used))} still run sessions (disable them).",
                messages.ERROR,
            )
            return
        super().delete_queryset(request, queryset)

    @admin.action(description="Export as YAML")
    def export_yaml(self, request: HttpRequest, queryset: QuerySet[App]) -> HttpResponse:
        specs = store.all_specs(queryset.values_list("name", flat=True))
        response = HttpResponse(dump(specs), content_type="application/yaml; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="apps.yaml"'
        return response

    def get_urls(self) -> list[URLPattern]:
        mine = [
            path(
                "import/",
                self.admin_site.admin_view(self.import_view),
                name="sessions_app_app_import",
            )
        ]
        return mine + super().get_urls()

    def import_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_add_permission(request) or not self.has_change_permission(request):
            return HttpResponse(status=403)
        form = ImportForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            uploads = form.cleaned_data["uploads"]
            texts = []
            error = ""
            for upload in uploads:
                raw = upload.read(MAX_UPLOAD + 1)
                if len(raw) > MAX_UPLOAD:
                    error = f"{upload.name}: larger than {MAX_UPLOAD} bytes"
                    break
                try:
                    texts.append((str(upload.name), raw.decode("utf-8")))
                except UnicodeDecodeError:
                    error = f"{upload.name}: not UTF-8 text"
                    break
            if not error:
                try:
                    done = import_texts(texts)
                except CatalogFileError as exc:
                    error = str(exc)
                else:
                    said = ", ".join(
                        f"{name} ({'created' if new else 'updated'})" for name, new in done
                    )
                    messages.success(request, f"Imported: {said}.")
                    return HttpResponseRedirect(reverse("admin:sessions_app_app_changelist"))
            form.add_error(
                "uploads", ValidationError(["Nothing was imported.", *error.splitlines()])
            )
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Import apps from YAML",
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/sessions_app/app/import.html", context)
