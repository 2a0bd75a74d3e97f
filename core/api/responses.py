"""What every API view shares: the error body's documented shape, the answers it documents,
one path segment, and the pagination of lists."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

ANY_SEGMENT = "[^/]+"


class ErrorSerializer(serializers.Serializer[None]):
    """The body of every error answer (documentation only)."""

    field = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="On 400: the input that is wrong, or null if the request as a whole is.",
    )
    detail = serializers.CharField()


NOT_AUTHENTICATED = {401: ErrorSerializer}
NOT_FOUND = {401: ErrorSerializer, 404: ErrorSerializer}


class Pagination(LimitOffsetPagination):
    max_limit = 1000
