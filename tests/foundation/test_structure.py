"""The shape of the code: imports flow one way, and the layers that must not know each other
do not. Read from the source, so a new import that breaks a rule fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("activate", "workers_app", "sessions_app", "harness", "bench", "drills")
# Django imports an app's signal receivers when the app registry is ready, not at import time.
FUNCTION_IMPORTS_ALLOWED = {("sessions_app/apps.py", "ready")}
TRANSPORT = "workers_app.transport"


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def module_level_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports when it is imported (not inside functions)."""
    tree = ast.parse(path.read_text())
    targets: set[str] = set()
    for node in tree.body:
        nodes = [node] if isinstance(node, ast.Import | ast.ImportFrom) else []
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports nothing at run time
            continue
        for imp in nodes:
            for name in imported_names(imp):
                # "from a import b": b may be a module (a.b) or a name in module a.
                if name in known:
                    targets.add(name)
    return targets


def test_no_import_cycle_between_project_modules() -> None:
    known = modules()
    graph = {name: module_level_imports(path, known) - {name} for name, path in known.items()}
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = "open"
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_no_import_hides_inside_a_function_of_the_platform() -> None:
    # Scripts (harness, bench, drills) import Django models only after they set Django up.
    hidden = []
    for name, path in modules().items():
        if name.split(".")[0] not in ("activate", "workers_app", "sessions_app"):
            continue
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            where = (str(path.relative_to(REPO)), function.name)
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Import | ast.ImportFrom)
                    and where not in FUNCTION_IMPORTS_ALLOWED
                ):
                    hidden.append(f"{name}.{function.name}: {ast.unparse(node)}")
    assert hidden == []


def all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in imported_names(node)
    }


def test_workers_app_knows_nothing_of_sessions_app() -> None:
    offenders = {
        name
        for name, path in modules().items()
        if name.startswith("workers_app")
        and any(target.startswith("sessions_app") for target in all_imports(path))
    }
    assert offenders == set()


def test_the_lifecycle_knows_nothing_of_tasks() -> None:
    known = modules()
    assert "workers_app.tasks" not in all_imports(known["workers_app.lifecycle"])
    assert "workers_app.tasks" not in all_imports(known["workers_app.jobs"])


def transport_modules() -> dict[str, Path]:
    return {name: path for name, path in modules().items() if name.startswith(TRANSPORT)}


def test_the_transport_knows_nothing_of_django_or_the_platform() -> None:
    assert transport_modules(), "the transport package has moved: update TRANSPORT"
    for name, path in transport_modules().items():
        outside = {
            target
            for target in all_imports(path)
            if target.split(".")[0] in ("django", "sessions_app", "activate")
            or (target.startswith("workers_app") and not target.startswith(TRANSPORT))
        }
        assert outside == set(), f"{name} imports {sorted(outside)}"


def test_paramiko_is_imported_only_by_the_transport() -> None:
    importers = {
        name
        for name, path in modules().items()
        if any(target.split(".")[0] == "paramiko" for target in all_imports(path))
    }
    assert importers, "nothing imports paramiko: the check reads the wrong tree"
    assert {name for name in importers if not name.startswith(TRANSPORT)} == set()


@pytest.mark.parametrize("module", ["base", "slurm", "pbs", "host"])
def test_the_scheduler_adapters_import_no_django(module: str) -> None:
    path = REPO / "workers_app" / "schedulers" / f"{module}.py"
    assert not {name for name in all_imports(path) if name.split(".")[0] == "django"}
    assert not {name for name in all_imports(path) if name.startswith("workers_app.models")}


def test_what_runs_on_nodes_imports_nothing_of_the_server() -> None:
    for name, path in modules().items():
        if ".node." not in f"{name}.":
            continue
        server = {
            target
            for target in all_imports(path)
            if target.split(".")[0] in ("django", "workers_app", "sessions_app", "activate")
        }
        if name.endswith(".node"):  # the package itself only reads its scripts' source
            server -= {"workers_app.node"}
        assert server == set(), f"{name} imports {sorted(server)}"


def test_bench_and_drills_do_not_import_tests_or_each_other() -> None:
    for name, path in modules().items():
        top = name.split(".")[0]
        if top not in ("bench", "drills", "harness"):
            continue
        for target in all_imports(path):
            first = target.split(".")[0]
            assert first != "tests", f"{name} imports {target}"
            if top != "harness":
                assert first not in {"bench", "drills"} - {top}, f"{name} imports {target}"


SCHEDULERS = "workers_app.schedulers"
# A scheduler's commands and variables: only its adapter may name them in code.
SCHEDULER_WORDS = re.compile(
    r"SLURM_|PBS_|(?<![A-Za-z])(?:srun|sbatch|squeue|scontrol|qsub|qstat)(?![A-Za-z])"
)


def code_words(source: str) -> list[str]:
    """The strings and names a module's code uses; docstrings (and comments) are left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docstrings:
            if isinstance(node.value, str):
                words.append(node.value)
            elif isinstance(node.value, bytes):
                words.append(node.value.decode("latin-1"))
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            words.append(node.name)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            words.append(node.arg)
        elif isinstance(node, ast.alias):
            words += [node.name, node.asname or ""]
    return words


def test_the_scheduler_words_are_found_in_code_and_not_in_docstrings() -> None:
    source = (
        '"""Runs srun."""\n'
        "def submit(squeue_output):\n"
        '    """Like sbatch."""\n'
        "    # qsub would do too\n"
        '    return f"sbatch {squeue_output}" + os.environ["PBS_JOBID"]\n'
    )
    found = {m.group() for word in code_words(source) for m in SCHEDULER_WORDS.finditer(word)}
    assert found == {"squeue", "sbatch", "PBS_"}


def test_only_the_adapters_name_a_schedulers_commands_or_variables() -> None:
    named = {}
    for name, path in modules().items():
        if name.split(".")[0] not in ("workers_app", "sessions_app"):
            continue
        if name == SCHEDULERS or name.startswith(SCHEDULERS + "."):
            continue
        words = code_words(path.read_text())
        found = {m.group() for word in words for m in SCHEDULER_WORDS.finditer(word)}
        if found:
            named[name] = sorted(found)
    assert named == {}, "scheduler knowledge outside workers_app/schedulers/"
    # The check reads the adapters' way of speaking: it would find them there.
    slurm = code_words((REPO / "workers_app" / "schedulers" / "slurm.py").read_text())
    assert {m.group() for word in slurm for m in SCHEDULER_WORDS.finditer(word)} >= {
        "sbatch",
        "squeue",
        "srun",
        "SLURM_",
    }
