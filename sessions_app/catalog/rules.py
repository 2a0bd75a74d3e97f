"""What makes an app well formed, and a launch's values acceptable: one set of checks for the
admin, the importer and the API alike. A problem names its field as a path
(``fields[0].pattern``) so the admin can put it by its input and the importer by its line."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

from sessions_app import kinds
from sessions_app.catalog.models import LoginKind, Reach
from sessions_app.catalog.spec import NODE_PLACEHOLDERS, SECRET, AppSpec, FieldSpec
from sessions_app.catalog.values import MAX_VALUE_LENGTH

Path = tuple[str | int, ...]

NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}")
COOKIE_NAME = HEADER_NAME
# Under the session's base URL: no scheme, host, leading slash or whitespace.
RELATIVE_PATH = re.compile(r"(?![/\\])[^\s\x00-\x1f\x7f#]{0,512}")
MAX_TIMEOUT = 3600
TOP_KEYS = (
    "name label description icon command env reach keeps_prefix ready login landing_path "
    "fields clusters environments groups enabled"
).split()
FIELD_KEYS = ("name", "label", "default", "pattern", "required", "choices")
LOGIN_KEYS = {
    LoginKind.NONE: {"kind"},
    LoginKind.HEADER: {"kind", "name", "value"},
    LoginKind.COOKIE: {"kind", "name", "value"},
    LoginKind.FORM: {"kind", "path", "fields"},
}


def spell(path: Path) -> str:
    """("fields", 0, "pattern") -> fields[0].pattern"""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


class AppProblems(ValueError):
    """Everything wrong with an app, each by the path of its field."""

    def __init__(self, problems: list[tuple[Path, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{spell(path)}: {message}" for path, message in problems))


class _Reader:
    def __init__(self) -> None:
        self.problems: list[tuple[Path, str]] = []

    def problem(self, path: Path, message: str) -> None:
        self.problems.append((path, message))

    def text(self, data: Mapping[str, Any], key: str, path: Path, *, required: bool = False) -> str:
        value = data.get(key, "")
        if value is None:
            value = ""
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.problem((*path, key), "must be text")
            return ""
        value = str(value)
        if required and not value.strip():
            self.problem((*path, key), "is required")
        return value

    def flag(self, data: Mapping[str, Any], key: str, path: Path, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.problem((*path, key), "must be true or false")
            return default
        return value

    def texts(self, data: Mapping[str, Any], key: str, path: Path) -> tuple[str, ...]:
        value = data.get(key) or []
        if not isinstance(value, list):
            self.problem((*path, key), "must be a list")
            return ()
        out = []
        for index, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                self.problem((*path, key, index), "must be text")
            else:
                out.append(str(item))
        return tuple(out)

    def mapping(self, data: Mapping[str, Any], key: str, path: Path) -> dict[str, Any]:
        value = data.get(key) or {}
        if not isinstance(value, dict):
            self.problem((*path, key), "must be a mapping")
            return {}
        return value

    def unknown_keys(self, data: Mapping[str, Any], known: Iterable[str], path: Path) -> None:
        for key in data:
            if key not in known:
                self.problem((*path, str(key)), "is not a key an app takes")


def read(data: object) -> AppSpec:
    """An app from the YAML file's shape; raises AppProblems naming every bad field."""
    reader = _Reader()
    if not isinstance(data, dict):
        raise AppProblems([((), "an app is a mapping of keys (name, label, command, ...)")])
    reader.unknown_keys(data, TOP_KEYS, ())
    ready = reader.mapping(data, "ready", ())
    reader.unknown_keys(ready, ("path", "statuses", "timeout"), ("ready",))
    statuses_raw = ready.get("statuses", [200])
    statuses: list[int] = []
    if not isinstance(statuses_raw, list):
        reader.problem(("ready", "statuses"), "must be a list of HTTP statuses")
    else:
        for index, status in enumerate(statuses_raw):
            if isinstance(status, bool) or not isinstance(status, int):
                reader.problem(("ready", "statuses", index), "must be an HTTP status (200)")
            else:
                statuses.append(status)
    timeout = ready.get("timeout", 90)
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        reader.problem(("ready", "timeout"), "must be a whole number of seconds")
        timeout = 90
    env_raw = reader.mapping(data, "env", ())
    env = {}
    for key, value in env_raw.items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            reader.problem(("env", str(key)), "must be text")
        else:
            env[str(key)] = str(value)
    command = reader.texts(data, "command", ())
    login = reader.mapping(data, "login", ()) or {"kind": "none"}
    fields_raw = data.get("fields") or []
    fields = []
    if not isinstance(fields_raw, list):
        reader.problem(("fields",), "must be a list")
        fields_raw = []
    for index, raw in enumerate(fields_raw):
        path: Path = ("fields", index)
        if not isinstance(raw, dict):
            reader.problem(path, "must be a mapping (name, label, default, ...)")
            continue
        reader.unknown_keys(raw, FIELD_KEYS, path)
        fields.append(
            FieldSpec(
                name=reader.text(raw, "name", path, required=True),
                label=reader.text(raw, "label", path),
                default=reader.text(raw, "default", path),
                pattern=reader.text(raw, "pattern", path),
                required=reader.flag(raw, "required", path, False),
                choices=reader.texts(raw, "choices", path),
            )
        )
    spec = AppSpec(
        name=reader.text(data, "name", (), required=True),
        label=reader.text(data, "label", (), required=True),
        description=reader.text(data, "description", ()),
        icon=reader.text(data, "icon", ()),
        command=command,
        env=env,
        reach=reader.text(data, "reach", ()) or Reach.UNIX.value,
        keeps_prefix=reader.flag(data, "keeps_prefix", (), False),
        ready_path=reader.text(ready, "path", ("ready",)),
        ready_statuses=tuple(statuses),
        start_timeout=timeout,
        login=login,
        landing_path=reader.text(data, "landing_path", ()),
        fields=tuple(fields),
        clusters=reader.texts(data, "clusters", ()),
        environments=reader.texts(data, "environments", ()),
        groups=reader.texts(data, "groups", ()),
        enabled=reader.flag(data, "enabled", (), True),
    )
    if reader.problems:
        raise AppProblems(reader.problems)
    check(spec)
    return spec


def placeholders(template: str) -> list[str] | None:
    """The names a template's ``{...}`` name (``{{`` and ``}}`` are braces); None if it is not
    a template (an unclosed brace, a format spec, a conversion, an index)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return None
    names = []
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if spec or conversion or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            return None
        names.append(name)
    return names


def check(spec: AppSpec) -> None:
    """Raise AppProblems naming every field of ``spec`` that is wrong."""
    problems: list[tuple[Path, str]] = []

    def problem(path: Path, message: str) -> None:
        problems.append((path, message))

    if not NAME.fullmatch(spec.name):
        problem(
            ("name",), "must be 1 to 32 lower-case letters, digits or underscores, from a letter"
        )
    elif spec.name in kinds.builtin_names():
        problem(("name",), f"{spec.name!r} is a built-in session type")
    if not spec.label.strip():
        problem(("label",), "is required")
    if spec.reach not in Reach.values:
        problem(("reach",), f"must be one of: {', '.join(Reach.values)}")
    field_names: set[str] = set()
    for index, item in enumerate(spec.fields):
        problems += _field_problems(item, ("fields", index), field_names)
        field_names.add(item.name)
    known = {*NODE_PLACEHOLDERS, *field_names}

    def templates(path: Path, template: str, allowed: set[str], where: str) -> list[str]:
        names = placeholders(template)
        if names is None:
            problem(path, "is not a template: write {name} for a value, {{ and }} for braces")
            return []
        for name in names:
            if name == SECRET and SECRET not in allowed:
                problem(path, f"{{secret}} may not be in {where} (other users may read it)")
            elif name not in allowed:
                problem(
                    path, f"{{{name}}} is not a placeholder (known: {', '.join(sorted(allowed))})"
                )
        return names

    if not spec.command:
        problem(("command",), "must name the program to run")
    used: set[str] = set()
    for index, token in enumerate(spec.command):
        used.update(templates(("command", index), token, known, "the command line"))
        if index == 0 and not token.strip():
            problem(("command", 0), "must name the program to run")
    for name, value in spec.env.items():
        if not ENV_NAME.fullmatch(name):
            problem(("env", name), "is not an environment variable's name")
        used.update(templates(("env", name), value, {*known, SECRET}, "the environment"))
    where = {"unix": "socket", "tcp": "port"}.get(spec.reach)
    if where and where not in used:
        problem(("command",), f"must tell the program its {{{where}}} (reach: {spec.reach})")
    other = {"unix": "port", "tcp": "socket"}.get(spec.reach)
    if other and other in used:
        problem(("command",), f"{{{other}}} is for reach {'tcp' if other == 'port' else 'unix'}")
    problems += _login_problems(spec.login)
    if not RELATIVE_PATH.fullmatch(spec.ready_path) or "://" in spec.ready_path:
        problem(("ready", "path"), "must be a path under the app's base URL, without a leading /")
    if not spec.ready_statuses:
        problem(("ready", "statuses"), "must list at least one HTTP status")
    for index, status in enumerate(spec.ready_statuses):
        if not 100 <= status <= 599:
            problem(("ready", "statuses", index), "must be an HTTP status (100 to 599)")
    if not 1 <= spec.start_timeout <= MAX_TIMEOUT:
        problem(("ready", "timeout"), f"must be 1 to {MAX_TIMEOUT} seconds")
    if not RELATIVE_PATH.fullmatch(spec.landing_path) or "://" in spec.landing_path:
        problem(("landing_path",), "must be a path under the app's base URL, without a leading /")
    for index, environment in enumerate(spec.environments):
        cluster, _, name = environment.partition("/")
        if not cluster or not name:
            problem(("environments", index), "must be cluster/environment")
    if problems:
        raise AppProblems(problems)


def _field_problems(item: FieldSpec, path: Path, taken: set[str]) -> list[tuple[Path, str]]:
    problems: list[tuple[Path, str]] = []
    if not FIELD_NAME.fullmatch(item.name):
        problems.append(((*path, "name"), "must be lower-case letters, digits or underscores"))
    elif item.name in (*NODE_PLACEHOLDERS, SECRET):
        problems.append(((*path, "name"), f"{item.name!r} is a placeholder the node fills in"))
    elif item.name in taken:
        problems.append(((*path, "name"), f"{item.name!r} is named twice"))
    compiled = None
    if item.pattern:
        try:
            compiled = re.compile(item.pattern)
        except re.error as exc:
            problems.append(((*path, "pattern"), f"is not a regular expression: {exc}"))
    for index, choice in enumerate(item.choices):
        if compiled and not compiled.fullmatch(choice):
            problems.append(((*path, "choices", index), "does not match the pattern"))
    if item.default:
        if compiled and not compiled.fullmatch(item.default):
            problems.append(((*path, "default"), "does not match the pattern"))
        if item.choices and item.default not in item.choices:
            problems.append(((*path, "default"), "is not one of the choices"))
        if len(item.default) > MAX_VALUE_LENGTH or "\x00" in item.default:
            problems.append(((*path, "default"), f"must be at most {MAX_VALUE_LENGTH} characters"))
    return problems


def _login_problems(login: Mapping[str, Any]) -> list[tuple[Path, str]]:
    problems: list[tuple[Path, str]] = []
    kind = login.get("kind", "")
    if kind not in LoginKind.values:
        return [(("login", "kind"), f"must be one of: {', '.join(LoginKind.values)}")]
    for key in login:
        if key not in LOGIN_KEYS[LoginKind(kind)]:
            problems.append((("login", str(key)), f"is not a key of a {kind} login"))

    def secret_only(path: Path, value: object) -> None:
        if not isinstance(value, str):
            problems.append((path, "must be text"))
            return
        names = placeholders(value)
        if names is None or any(name != SECRET for name in names):
            problems.append((path, "may use {secret} and no other placeholder"))

    if kind in (LoginKind.HEADER, LoginKind.COOKIE):
        name = login.get("name")
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            problems.append((("login", "name"), f"must be a {kind}'s name"))
        secret_only(("login", "value"), login.get("value"))
    if kind == LoginKind.FORM:
        path = login.get("path")
        if not isinstance(path, str) or not RELATIVE_PATH.fullmatch(path) or "://" in path:
            problems.append((("login", "path"), "must be a path under the app's base URL"))
        fields = login.get("fields")
        if not isinstance(fields, dict) or not fields:
            problems.append((("login", "fields"), "must map the form's fields to values"))
        else:
            for key, value in fields.items():
                secret_only(("login", "fields", str(key)), value)
    return problems
