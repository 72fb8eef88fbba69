"""
Imports run in one direction: each layer of the package imports only the layers below it.

The layers, bottom to top, are listed in :data:`ROOMS` (the same order as the
package docstrings of ``prefect_cudf_polars.blocks`` and ``.tasks``). A
package's ``__init__`` is the facade of its folder and sits at the top of it.
Every ``import`` statement counts, at module level, inside a function, and
under ``if TYPE_CHECKING:`` (a protocol in a lower layer types what an upper
one provides). The import graph must also be free of cycles, inside a layer too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {
    "prefect_cudf_polars": ROOT / "prefect_cudf_polars",
    "prefect_cudf_polars.blocks": ROOT / "blocks",
    "prefect_cudf_polars.tasks": ROOT / "tasks",
    "prefect_cudf_polars.flows": ROOT / "flows",
}

#: Bottom to top. A module belongs to the longest prefix that names it.
ROOMS = [
    "prefect_cudf_polars.blocks.errors",
    "prefect_cudf_polars.blocks.runs",
    "prefect_cudf_polars.blocks.active",
    "prefect_cudf_polars.blocks.memory_demand",
    "prefect_cudf_polars.blocks.engine_options",
    "prefect_cudf_polars.blocks.engine_block",
    "prefect_cudf_polars.blocks.admission",
    "prefect_cudf_polars.blocks.backends",
    "prefect_cudf_polars.blocks.persistence",
    "prefect_cudf_polars.blocks.deferred",
    "prefect_cudf_polars.blocks.result_owner",
    "prefect_cudf_polars.blocks.results",
    "prefect_cudf_polars.blocks.arguments",
    "prefect_cudf_polars.blocks.lineage",
    "prefect_cudf_polars.blocks.memory",
    "prefect_cudf_polars.blocks.result_book",
    "prefect_cudf_polars.blocks.engine",
    "prefect_cudf_polars.blocks.engine_call",
    "prefect_cudf_polars.blocks.send_queue",
    "prefect_cudf_polars.blocks.artifact_text",
    "prefect_cudf_polars.blocks.telemetry",
    "prefect_cudf_polars.blocks.nesting",
    "prefect_cudf_polars.blocks.exits",
    "prefect_cudf_polars.blocks.session_calls",
    "prefect_cudf_polars.blocks.session",
    "prefect_cudf_polars.blocks.task_runner",
    "prefect_cudf_polars.blocks",
    "prefect_cudf_polars.tasks",
    "prefect_cudf_polars.tasks.storage",
    "prefect_cudf_polars.flows",
    "prefect_cudf_polars.cli",
    "prefect_cudf_polars",
]


def package_modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package ``__init__``), from the package folders."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            if is_init:
                parts = parts[:-1]
            modules[".".join([package, *parts])] = (path, is_init)
    return modules


MODULES = package_modules()


def rank(module: str) -> int:
    """A module's room; a package ``__init__`` ranks with the top room under it."""
    below = [i for i, room in enumerate(ROOMS) if room == module or room.startswith(module + ".")]
    if MODULES[module][1] and below:
        return max(below)
    best = max((room for room in ROOMS if module == room or module.startswith(room + ".")), key=len)
    return ROOMS.index(best)


def imports_of(module: str) -> set[str]:
    """Our modules that ``module`` imports, anywhere in it (``TYPE_CHECKING`` blocks included)."""
    path, is_init = MODULES[module]
    found: set[str] = set()
    package = module if is_init else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in MODULES)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    target = f"{base}.{alias.name}"
                    if target in MODULES:
                        found.add(target)
                    elif base in MODULES:
                        found.add(base)
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(module)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def test_every_module_has_a_room():
    assert "prefect_cudf_polars.blocks.session" in MODULES
    for module in MODULES:
        assert rank(module) >= 0


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_only(module):
    upward = sorted(t for t in GRAPH[module] if rank(t) > rank(module))
    assert not upward, (
        f"{module} (room {ROOMS[rank(module)]}) imports rooms above it: "
        + ", ".join(f"{t} (room {ROOMS[rank(t)]})" for t in upward)
    )


def test_the_engine_side_never_imports_tasks_or_flows():
    for module, targets in GRAPH.items():
        if module.startswith("prefect_cudf_polars.blocks"):
            assert not {t for t in targets if t.startswith(("prefect_cudf_polars.tasks", "prefect_cudf_polars.flows"))}, module


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                walk(target)
        stack.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            walk(module)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The rule itself: a blocks module importing tasks is reported."""
    fake = tmp_path / "fake.py"
    fake.write_text("from prefect_cudf_polars.tasks import gpu_task\n")
    monkeypatch.setitem(MODULES, "prefect_cudf_polars.blocks.backends.fake", (fake, False))
    targets = imports_of("prefect_cudf_polars.blocks.backends.fake")
    assert targets == {"prefect_cudf_polars.tasks.gpu_task"}
    assert rank("prefect_cudf_polars.tasks.gpu_task") > rank("prefect_cudf_polars.blocks.backends.fake")


def test_the_checker_counts_an_import_only_for_types(tmp_path, monkeypatch):
    """An import under ``if TYPE_CHECKING:`` is an import: a circle through one is a circle."""
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from prefect_cudf_polars.blocks.session import EngineSession\n"
    )
    monkeypatch.setitem(MODULES, "prefect_cudf_polars.blocks.backends.fake", (fake, False))
    assert imports_of("prefect_cudf_polars.blocks.backends.fake") == {"prefect_cudf_polars.blocks.session"}
