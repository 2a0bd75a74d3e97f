"""A launch's values for an app's fields: checked as the environments' scheduling fields are
(``workers_app.params``), each refusal naming the field. They reach the program as separate
arguments or environment values on the node, never through a shell."""

from __future__ import annotations

import re
from collections.abc import Mapping

from core.errors import ParameterError
from sessions_app.catalog.spec import AppSpec

MAX_VALUE_LENGTH = 4096


def check_values(spec: AppSpec, values: Mapping[str, object]) -> dict[str, str]:
    """A launch's values for the app's fields, defaults filled in; raises ParameterError
    naming the field (as the environments' fields do)."""
    fields = {item.name: item for item in spec.fields}
    for name in values:
        if name not in fields:
            known = ", ".join(fields) or "none"
            raise ParameterError(f"values.{name}", f"unknown field (this app takes: {known})")
    resolved: dict[str, str] = {}
    for name, item in fields.items():
        raw = values.get(name)
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, str | int | float)):
            raise ParameterError(f"values.{name}", "must be a string")
        value = "" if raw is None else str(raw)
        if not value.strip():
            value = item.default
        label = item.label or name
        if not value:
            if item.required:
                raise ParameterError(f"values.{name}", f"{label}: is required")
            resolved[name] = ""
            continue
        if len(value) > MAX_VALUE_LENGTH or "\x00" in value:
            raise ParameterError(
                f"values.{name}", f"{label}: must be at most {MAX_VALUE_LENGTH} characters"
            )
        if item.choices and value not in item.choices:
            allowed = ", ".join(item.choices)
            raise ParameterError(f"values.{name}", f"{label}: must be one of: {allowed}")
        if item.pattern and not re.fullmatch(item.pattern, value):
            hint = f"; example: {item.default}" if item.default else ""
            raise ParameterError(f"values.{name}", f"{label}: {value!r} is not a valid value{hint}")
        resolved[name] = value
    return resolved
