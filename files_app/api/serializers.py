"""The files API's shapes, for its documentation (views answer plain dicts built in services)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

ENTRY_TYPES = ("file", "dir", "link", "other")
PATH_HELP = "A UTF-8 path; use the _b64 form for any other bytes."
B64_HELP = "The path's raw bytes, urlsafe base64 (always accepted)."


class RootSerializer(serializers.Serializer[None]):
    # The API's field, not the serializer's own label.
    label = serializers.CharField(  # type: ignore[assignment]
        help_text="`~` (the home) first, then the operator's."
    )
    path = serializers.CharField(help_text="For display: UTF-8, U+FFFD for other bytes.")
    path_b64 = serializers.CharField()


class EntrySerializer(serializers.Serializer[None]):
    name = serializers.CharField(help_text="For display: UTF-8, U+FFFD for other bytes.")
    name_b64 = serializers.CharField(help_text="The name's raw bytes, urlsafe base64.")
    path_b64 = serializers.CharField(help_text="The entry's path's raw bytes, urlsafe base64.")
    type = serializers.ChoiceField(choices=ENTRY_TYPES, help_text="A link is not followed.")
    size = serializers.IntegerField()
    mtime = serializers.DateTimeField(allow_null=True, help_text="ISO 8601, UTC.")
    mode = serializers.CharField(help_text="Permission bits in octal, e.g. 0644.")


class ListingSerializer(serializers.Serializer[None]):
    path = serializers.CharField(help_text="The folder, resolved by the cluster (absolute).")
    path_b64 = serializers.CharField()
    parent_b64 = serializers.CharField(allow_null=True, help_text="null at /.")
    entries = EntrySerializer(many=True, help_text="Folders first, then by name.")


class PathSerializer(serializers.Serializer[None]):
    path = serializers.CharField(required=False, help_text=PATH_HELP)
    path_b64 = serializers.CharField(required=False, help_text=B64_HELP)


class DeleteSerializer(PathSerializer):
    recursive = serializers.BooleanField(
        required=False, default=False, help_text="A folder with all it holds."
    )


class RenameSerializer(serializers.Serializer[None]):
    from_b64 = serializers.CharField(required=False, help_text=B64_HELP)
    to = serializers.CharField(required=False, help_text=PATH_HELP)
    to_b64 = serializers.CharField(required=False, help_text=B64_HELP)

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # "from" is a Python keyword, so it cannot be declared as an attribute.
        fields = super().get_fields()
        fields["from"] = serializers.CharField(required=False, help_text=PATH_HELP)
        return fields
