"""Validation of the scheduling fields a user sets, before anything reaches a cluster."""

from __future__ import annotations

import re
from collections.abc import Mapping

from workers_app.models import Environment, EnvironmentField, FieldKind
from workers_app.schedulers.base import SAFE_VALUE

MAX_VALUE_LENGTH = 512
FORBIDDEN_CHARACTERS = ("\n", "\r", "\x00")


class ParameterError(Exception):
    """A request parameter is wrong; ``field`` names it for a 400 answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _check_value(spec: EnvironmentField, value: str, directive_pattern: re.Pattern[str]) -> None:
    if len(value) > MAX_VALUE_LENGTH:
        raise ParameterError(spec.name, f"must be at most {MAX_VALUE_LENGTH} characters")
    if spec.kind == FieldKind.DIRECTIVES:
        for line in value.splitlines():
            line = line.strip()
            if line and not directive_pattern.fullmatch(line):
                raise ParameterError(spec.name, f"{line!r} is not an allowed scheduler directive")
        if "\x00" in value:
            raise ParameterError(spec.name, "must not contain NUL characters")
        return
    if any(ch in value for ch in FORBIDDEN_CHARACTERS):
        raise ParameterError(spec.name, "must not contain newlines or NUL characters")
    if spec.choices and value not in spec.choices:
        allowed = ", ".join(str(c) for c in spec.choices)
        raise ParameterError(spec.name, f"must be one of: {allowed}")
    if spec.pattern and not re.fullmatch(spec.pattern, value):
        raise ParameterError(spec.name, f"{value!r} does not match the pattern {spec.pattern}")
    if spec.directive and not SAFE_VALUE.fullmatch(value):
        raise ParameterError(spec.name, f"{value!r} contains characters that are not allowed")


def validate_params(
    environment: Environment,
    params: Mapping[str, object],
    *,
    directive_pattern: re.Pattern[str],
) -> dict[str, str]:
    """Return the complete, validated parameters (defaults filled in) or raise ParameterError."""
    specs = {spec.name: spec for spec in environment.fields.all()}
    for name in params:
        if name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise ParameterError(name, f"unknown field (this environment accepts: {known})")
    resolved: dict[str, str] = {}
    for name, spec in specs.items():
        raw = params.get(name)
        if raw is not None and not isinstance(raw, str | int | float):
            raise ParameterError(name, "must be a string")
        value = "" if raw is None else str(raw).strip()
        if not value:
            value = spec.default
        if not value:
            if spec.required:
                raise ParameterError(name, "is required")
            continue
        _check_value(spec, value, directive_pattern)
        resolved[name] = value
    return resolved


def directives_for(environment: Environment, resolved: Mapping[str, str]) -> list[str]:
    """Turn validated parameters into scheduler options, in the fields' order."""
    out: list[str] = []
    for spec in environment.fields.all():
        value = resolved.get(spec.name)
        if not value:
            continue
        if spec.kind == FieldKind.DIRECTIVES:
            out += [line.strip() for line in value.splitlines() if line.strip()]
        elif spec.directive:
            out.append(spec.directive.replace("{value}", value))
    return out
