"""Apps in YAML files, as sites keep their catalogue in git: read (every app of every file
checked before any is saved, in one transaction, each problem said with its file, line and
field) and written (the same keys in the same order each time, so an export read back and
exported again is the same text)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from sessions_app.catalog import rules, store
from sessions_app.catalog.spec import AppSpec, to_data


class CatalogFileError(ValueError):
    """A file that cannot be imported; the message names the file, the line and the field."""


@dataclass(frozen=True)
class ReadApp:
    spec: AppSpec
    source: str
    node: yaml.Node

    def where(self, path: rules.Path) -> str:
        return f"{self.source}:{line_of(self.node, path)}: {rules.spell(path)}"


def line_of(node: yaml.Node, path: rules.Path) -> int:
    """The line (from 1) of the deepest part of ``path`` the document has."""
    for part in path:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == part), None)
            if child is None:
                child = next((k for k, _ in node.value if k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            child = node.value[part] if part < len(node.value) else None
        if child is None:
            break
        node = child
    return node.start_mark.line + 1


def read_text(text: str, source: str) -> list[ReadApp]:
    """Every app of a file (one YAML document each); raises CatalogFileError."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise CatalogFileError(f"{source}{line}: not YAML: {exc}") from None
    found = []
    for node, data in zip(nodes, documents, strict=True):
        if node is None:
            continue
        try:
            spec = rules.read(data)
        except rules.AppProblems as exc:
            lines = [
                f"{source}:{line_of(node, p)}: {rules.spell(p) or 'app'}: {m}"
                for p, m in exc.problems
            ]
            raise CatalogFileError("\n".join(lines)) from None
        found.append(ReadApp(spec=spec, source=source, node=node))
    if not found:
        raise CatalogFileError(f"{source}: holds no app")
    return found


def import_files(paths: Iterable[Path]) -> list[tuple[str, bool]]:
    """Create or update the apps of these files, by name: all of them or, on any problem,
    none. Returns (name, created) of each."""
    texts = []
    for path in paths:
        try:
            texts.append((str(path), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogFileError(f"{path}: cannot be read: {exc}") from None
    return import_texts(texts)


def import_texts(texts: Iterable[tuple[str, str]]) -> list[tuple[str, bool]]:
    """``import_files`` for (source, text) pairs (an upload in the admin)."""
    read: list[ReadApp] = []
    for source, text in texts:
        read += read_text(text, source)
    seen: dict[str, ReadApp] = {}
    for app in read:
        if app.spec.name in seen:
            first = seen[app.spec.name].where(("name",))
            raise CatalogFileError(f"{app.where(('name',))}: {app.spec.name!r} is in {first} too")
        seen[app.spec.name] = app
    done = []
    with transaction.atomic():
        existing = set(store.App.objects.filter(name__in=seen).values_list("name", flat=True))
        for app in read:
            try:
                store.save(app.spec)
            except store.UnknownNames as exc:
                raise CatalogFileError(
                    "\n".join(f"{app.where(path)}: {message}" for path, message in exc.problems)
                ) from None
            done.append((app.spec.name, app.spec.name not in existing))
    return done


class _Dumper(yaml.SafeDumper):
    pass


class _Block(dict[str, Any]):
    """A mapping written in block style (an app's top level)."""


def _scalar(value: object) -> bool:
    return not isinstance(value, dict | list) or (
        isinstance(value, list) and all(not isinstance(v, dict | list) for v in value)
    )


def _represent_dict(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    flow = all(_scalar(v) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


def _represent_block(dumper: yaml.SafeDumper, data: _Block) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(_Block, _represent_block)
_Dumper.add_representer(list, _represent_list)


def dump(specs: Iterable[AppSpec]) -> str:
    """The apps as YAML, one document each."""
    return yaml.dump_all(
        [_Block(to_data(spec)) for spec in specs],
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=4096,
        explicit_start=True,
    )
