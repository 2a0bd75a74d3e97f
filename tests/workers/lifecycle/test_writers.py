"""Who writes the lifecycle's columns, read from the source: a new writer elsewhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("activate", "workers_app", "sessions_app", "harness", "bench", "drills")
LIFECYCLE = REPO / "workers_app" / "actions" / "lifecycle.py"


def writes_of(column: str, tree: ast.AST) -> list[int]:
    """Lines that write ``column``: ``x.column = ...``, ``column=...`` in a call (but a call of
    ``lifecycle.something``, which is the writer), or ``{"column": ...}``."""
    through_lifecycle = {
        id(keyword)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "lifecycle"
        for keyword in call.keywords
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and part.attr == column:
                        lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == column:
            if id(node) not in through_lifecycle:
                lines.append(node.value.lineno)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and key.value == column:
                    lines.append(key.lineno)
    return lines


def platform_files() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "migrations" not in path.parts
    ]


def test_the_check_finds_each_way_of_writing_a_column() -> None:
    source = (
        "worker.next_attempt_at = now\n"
        "a.next_attempt_at, b = now, 1\n"
        "Worker.objects.update(next_attempt_at=now)\n"
        "Worker.objects.update(**{'next_attempt_at': now})\n"
        "lifecycle.note_waiting(worker, reason='', next_attempt_at=now)\n"
        "Worker.objects.filter(next_attempt_at__lte=now).order_by('next_attempt_at')\n"
    )
    assert writes_of("next_attempt_at", ast.parse(source)) == [1, 2, 3, 4]


def test_only_the_lifecycle_writes_when_a_pending_worker_is_next_sent() -> None:
    assert writes_of("next_attempt_at", ast.parse(LIFECYCLE.read_text())), "it moved: update"
    writers = {
        f"{path.relative_to(REPO)}:{line}"
        for path in platform_files()
        if path != LIFECYCLE
        for line in writes_of("next_attempt_at", ast.parse(path.read_text()))
    }
    assert writers == set()
