"""Validation of the scheduling fields a user sets, before anything reaches a cluster."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from core.errors import ParameterError
from schedulers.base import SAFE_VALUE, SchedulerAdapter
from workers_app.models import Environment, EnvironmentField, FieldKind

MAX_VALUE_LENGTH = 512
FORBIDDEN_CHARACTERS = ("\n", "\r", "\x00")


def _check_directives(
    spec: EnvironmentField,
    value: str,
    scheduler: type[SchedulerAdapter],
    set_by_fields: Mapping[str, str],
) -> None:
    if "\x00" in value:
        raise ParameterError(spec.name, "must not contain NUL characters")
    for line in value.splitlines():
        line = line.strip()
        if not line:
            continue
        problem = scheduler.directive_problem(
            line, set_by_fields=set_by_fields
        ) or _walltime_problem(line, scheduler)
        if problem:
            raise ParameterError(spec.name, problem)


def _walltime_problem(directive: str, scheduler: type[SchedulerAdapter]) -> str | None:
    # A zero wall time passes a field's pattern, yet Slurm reads --time=0 as "no limit" and the
    # host runner refuses the job when it is submitted: refused here, before anything is stored.
    syntax = scheduler.field_syntax.get("walltime")
    if syntax is None or not syntax.directive:
        return None
    option = scheduler.option_of(directive)
    sample = syntax.directive.replace("{value}", scheduler.format_walltime(60))
    if option is None or option != scheduler.option_of(sample):
        return None
    prefix = syntax.directive.partition("{value}")[0]
    value = directive.removeprefix(prefix) if directive.startswith(prefix) else ""
    if value and not any(digit in value for digit in "123456789"):
        return "the wall time must be more than zero"
    if scheduler.parse_walltime(value) is None:
        example = scheduler.format_walltime(3600)
        return f"{value!r} is not a wall time this cluster takes (example: {example})"
    return None


def _check_value(spec: EnvironmentField, value: str) -> None:
    # Said in plain words, the same in the browser, the API and `pw`: the field's label and a
    # valid example, never the regular expression behind the check.
    label = spec.label or spec.name
    example = spec.example or spec.default
    hint = f"; example: {example}" if example else ""
    if any(ch in value for ch in FORBIDDEN_CHARACTERS):
        raise ParameterError(spec.name, f"{label}: must be a single line{hint}")
    if spec.choices and value not in spec.choices:
        allowed = ", ".join(str(c) for c in spec.choices)
        raise ParameterError(spec.name, f"{label}: must be one of: {allowed}")
    if spec.pattern and not re.fullmatch(spec.pattern, value):
        raise ParameterError(spec.name, f"{label}: {value!r} is not a valid value{hint}")
    if spec.directive and not SAFE_VALUE.fullmatch(value):
        raise ParameterError(
            spec.name, f"{label}: {value!r} contains characters that are not allowed{hint}"
        )


def options_set_by_fields(
    fields: Iterable[EnvironmentField], scheduler: type[SchedulerAdapter]
) -> dict[str, str]:
    """The scheduler options an environment's own fields set (raw directives may not), with
    each field's label."""
    options: dict[str, str] = {}
    for spec in fields:
        if spec.kind == FieldKind.VALUE and spec.directive:
            option = scheduler.option_of(spec.directive.replace("{value}", "1"))
            if option:
                options[option] = spec.label or spec.name
    return options


def validate_params(
    environment: Environment,
    params: Mapping[str, object],
    *,
    scheduler: type[SchedulerAdapter],
) -> dict[str, str]:
    """Return the complete, validated parameters (defaults filled in) or raise ParameterError."""
    specs = {spec.name: spec for spec in environment.fields.all()}
    set_by_fields = options_set_by_fields(specs.values(), scheduler)
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
        if len(value) > MAX_VALUE_LENGTH:
            raise ParameterError(name, f"must be at most {MAX_VALUE_LENGTH} characters")
        if spec.kind == FieldKind.DIRECTIVES:
            _check_directives(spec, value, scheduler, set_by_fields)
        else:
            _check_value(spec, value)
            problem = (
                _walltime_problem(spec.directive.replace("{value}", value), scheduler)
                if spec.directive
                else None
            )
            if problem:
                raise ParameterError(name, f"{spec.label or name}: {problem}")
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
