"""The shape of the code: imports flow one way, and the layers that must not know each other
do not. Read from the source, so a new import that breaks a rule fails here."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import schedulers

REPO = Path(__file__).resolve().parents[2]
# The house's floors, lowest first: a module imports only from its own floor and those below.
# The ground floor (core: shared parts; node: what runs on clusters) imports no app, and the
# composition root (activate) is imported by nothing.
FLOORS = (
    ("core", "node"),
    ("schedulers",),
    ("identity",),
    ("workers_app",),
    ("agents",),
    ("files_app",),
    ("sessions_app",),
    ("notices_app",),
    ("activate",),
)
HOUSE = tuple(room for floor in FLOORS for room in floor)
# What ships besides the server: the command line, and the tools that drive a live platform.
PACKAGES = (*HOUSE, "cli", "harness", "bench", "drills")
APPS = ("identity", "workers_app", "agents", "files_app", "sessions_app", "notices_app")
# Django imports an app's signal receivers when the app registry is ready, not at import time.
FUNCTION_IMPORTS_ALLOWED = {
    ("workers_app/apps.py", "ready"),
    ("sessions_app/apps.py", "ready"),
    ("notices_app/apps.py", "ready"),
    ("identity/apps.py", "ready"),
}
TRANSPORT = "core.transport"


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (REPO / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if name.startswith("cli.src."):
                name = name.removeprefix("cli.src.")
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


def every_import(path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules ``path`` names anywhere: in functions and for typing too."""
    targets = set()
    for name in all_imports(path):
        while name and name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known:
            targets.add(name)
    return targets


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in sorted(graph.get(name, ())):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == name:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_project_modules() -> None:
    # Every import counts, typing-only and in-function ones too: a circle drawn for mypy is
    # still two modules that cannot be read apart.
    known = modules()
    graph = {name: every_import(path, known) - {name} for name, path in known.items()}
    assert import_cycles(graph) == []


def floor_of(name: str) -> int:
    room = name.split(".")[0]
    return next(level for level, rooms in enumerate(FLOORS) if room in rooms)


def test_no_module_imports_a_floor_above_its_own() -> None:
    known = modules(HOUSE)
    upward = sorted(
        f"{name} -> {target}"
        for name, path in known.items()
        for target in every_import(path, known)
        if floor_of(target) > floor_of(name)
    )
    assert upward == []


def test_the_floors_are_read_from_the_code() -> None:
    rooms = {path.parent.name for path in REPO.glob("*/__init__.py")}
    assert rooms - {"tests", "harness", "bench", "drills"} == set(HOUSE), "a room has no floor"
    assert floor_of("core.statemachine") < floor_of("workers_app.models")
    assert floor_of("notices_app.receivers") > floor_of("sessions_app.models")


def test_the_ground_floor_imports_no_app_and_nothing_imports_the_root() -> None:
    ground = [name for name in modules(HOUSE) if floor_of(name) == 0]
    assert "core.statemachine" in ground and "core.transport.connection" in ground
    for name, path in modules().items():
        tops = {target.split(".")[0] for target in all_imports(path)}
        if name.split(".")[0] != "activate":
            assert "activate" not in tops, f"{name} imports the composition root"
        if name in ground:
            assert not tops & set(APPS), f"{name} (ground floor) imports {sorted(tops & set(APPS))}"


def test_apps_do_not_import_each_others_views() -> None:
    borrowed = sorted(
        f"{name} -> {target}"
        for name, path in modules(HOUSE).items()
        for target in all_imports(path)
        if name.split(".")[0] in APPS
        and target.split(".")[0] in APPS
        and target.split(".")[0] != name.split(".")[0]
        and {"views", "pages", "urls"} & set(target.split(".")[1:])
    )
    assert borrowed == []


def house_lines() -> dict[str, int]:
    lines: dict[str, int] = {}
    for name, path in modules((*HOUSE, "cli")).items():
        room = name.split(".")[0]
        lines[room] = lines.get(room, 0) + len(path.read_text().splitlines())
    return lines


def test_the_worker_domain_is_under_a_third_of_the_house() -> None:
    # The house: every room that ships (the command line too), migrations left out.
    lines = house_lines()
    assert lines["workers_app"] * 3 < sum(lines.values()), lines


def test_no_import_hides_inside_a_function_of_the_platform() -> None:
    # Scripts (harness, bench, drills) import Django models only after they set Django up.
    hidden = []
    for name, path in modules().items():
        if name.split(".")[0] not in HOUSE:
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
    assert "workers_app.tasks" not in all_imports(known["workers_app.actions.lifecycle"])
    assert "workers_app.tasks" not in all_imports(known["workers_app.actions.jobs"])
    # One way: jobs (what schedulers answered) calls the lifecycle, never the reverse.
    assert "workers_app.actions.jobs" not in every_import(
        known["workers_app.actions.lifecycle"], known
    )
    assert "workers_app.actions.lifecycle" in every_import(known["workers_app.actions.jobs"], known)


def transport_modules() -> dict[str, Path]:
    return {name: path for name, path in modules().items() if name.startswith(TRANSPORT)}


def test_the_transport_knows_nothing_of_django_or_the_platform() -> None:
    assert transport_modules(), "the transport package has moved: update TRANSPORT"
    for name, path in transport_modules().items():
        outside = {
            target
            for target in all_imports(path)
            if target.split(".")[0] in ("django", *HOUSE) and not target.startswith(TRANSPORT)
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


def adapter_modules() -> dict[str, Path]:
    """The modules of the adapters the registry finds, by name."""
    return {
        adapter.__module__: Path(inspect.getfile(adapter))
        for adapter in schedulers.registry().values()
    }


@pytest.mark.parametrize("module", ["schedulers", "schedulers.base", *sorted(adapter_modules())])
def test_the_scheduler_adapters_import_no_django(module: str) -> None:
    path = modules()[module]
    assert not {name for name in all_imports(path) if name.split(".")[0] == "django"}
    assert not {name for name in all_imports(path) if name.split(".")[0] in APPS}


def test_what_runs_on_nodes_imports_nothing_of_the_server() -> None:
    on_nodes = [name for name in modules() if name.split(".")[0] == "node"]
    assert "node.activate_agent" in on_nodes and "node.starters.desktop" in on_nodes
    for name, path in modules().items():
        if name not in on_nodes:
            continue
        server = {
            target for target in all_imports(path) if target.split(".")[0] in ("django", *HOUSE)
        }
        if name == "node":  # the package itself only reads its scripts' source
            server -= {"node"}
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


# A scheduler's commands and variables: only its adapter may name them in code.
SCHEDULER_VARIABLES = ("SLURM_", "PBS_", "SGE_")
SCHEDULER_COMMANDS = (
    # Slurm
    *("srun", "sbatch", "salloc", "squeue", "scontrol", "scancel", "sacct", "sinfo"),
    # PBS and Grid Engine both (each its own way)
    *("qsub", "qstat", "qdel", "qalter", "qhold", "qrls"),
    # PBS
    *("qselect", "pbsnodes", "tracejob"),
    # Grid Engine
    *("qacct", "qconf", "qrsh", "qlogin", "qhost", "qmod"),
)
SCHEDULER_WORDS = re.compile(
    "|".join(SCHEDULER_VARIABLES) + rf"|(?<![A-Za-z])(?:{'|'.join(SCHEDULER_COMMANDS)})(?![A-Za-z])"
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


def scheduler_words_in(path: Path) -> set[str]:
    return {
        m.group() for word in code_words(path.read_text()) for m in SCHEDULER_WORDS.finditer(word)
    }


def test_only_the_adapters_name_a_schedulers_commands_or_variables() -> None:
    adapters = adapter_modules()
    named = {}
    for name, path in modules().items():
        if name.split(".")[0] not in HOUSE or name in adapters:
            continue
        found = scheduler_words_in(path)
        if found:
            named[name] = sorted(found)
    assert named == {}, "scheduler knowledge outside the adapters' modules"
    # The check reads the adapters' way of speaking: it would find them there.
    spoken = set().union(*(scheduler_words_in(path) for path in adapters.values()))
    assert spoken >= {*SCHEDULER_VARIABLES, "sbatch", "srun", "qsub", "qdel", "qacct", "pbsnodes"}
