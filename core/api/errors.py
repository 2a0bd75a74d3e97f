"""One error shape for the whole API.

Every error body has ``detail``, a sentence. A 400 also has ``field``: the name of the input
that is wrong (a body key, a query parameter or a scheduling field such as ``walltime``), or
null when the request as a whole is malformed. Only the first problem is reported.
"""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler

from core.errors import ParameterError


def first_error(detail: Any, field: str | None = None) -> tuple[str | None, str]:
    """The innermost field name and message of DRF's (possibly nested) error detail."""
    if isinstance(detail, dict):
        if not detail:
            return field, "Invalid input."
        key, value = next(iter(detail.items()))
        name = None if key == api_settings.NON_FIELD_ERRORS_KEY else str(key)
        if name is not None and name.isdigit():
            name = field
        return first_error(value, name if name is not None else field)
    if isinstance(detail, list):
        return first_error(detail[0], field) if detail else (field, "Invalid input.")
    return field, str(detail)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ParameterError):
        return Response(
            {"field": exc.field, "detail": exc.message}, status=status.HTTP_400_BAD_REQUEST
        )
    if isinstance(exc, ValidationError):
        field, message = first_error(exc.detail)
        return Response({"field": field, "detail": message}, status=exc.status_code)
    response = exception_handler(exc, context)
    if response is not None and response.status_code == status.HTTP_400_BAD_REQUEST:
        detail = response.data.get("detail") if isinstance(response.data, dict) else None
        response.data = {"field": None, "detail": str(detail or "Bad request.")}
    return response


class ApiErrorsMixin:
    """On every API view: the error shape, and no NUL byte ever reaching a query.

    PostgreSQL cannot store or compare a NUL byte and fails the query, which would be a 500.
    """

    kwargs: dict[str, Any]

    def get_exception_handler(self) -> Any:
        # Whatever EXCEPTION_HANDLER the settings name.
        return api_exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if any("\x00" in str(value) for value in self.kwargs.values()):
            raise NotFound()
        for name, value in request.query_params.items():
            if "\x00" in value:
                raise ValidationError({name: "must not contain NUL characters"})
