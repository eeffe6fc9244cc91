"""The Python packages' layering (issue 12, item 4): executors use the batching layer's CUDA
pieces and the protocols the core runs them through; batching never imports executors, so
neither package defers an import of the other, and any of them can be imported first."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import inferd
from inferd.executors import (
    OnnxRuntimeExecutor,
    OnnxRuntimeOptions,
    StagingOnnxRuntimeExecutor,
)
from inferd.executors.tensorrt import TensorRtExecutor
from inferd.repository import InstancePlacement

PACKAGE = Path(inferd.__file__).parent


@pytest.mark.parametrize(
    "first",
    [
        "inferd.core",
        "inferd.executors",
        "inferd.executors.staging",
        "inferd.executors.tensorrt",
        "inferd.models",
        "inferd.repository",
    ],
)
def test_each_package_imports_first_in_a_fresh_interpreter(first: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {first}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _imports_in_functions(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("inferd"):
                    found.append(f"{path.name}:{inner.lineno} {inner.module}")
    return found


def test_batching_and_executors_defer_no_import_of_each_other() -> None:
    deferred = [
        found
        for package in ("batching", "executors")
        for path in sorted((PACKAGE / package).glob("*.py"))
        for found in _imports_in_functions(path)
    ]
    assert deferred == []
    batching_imports = [
        node.module
        for path in (PACKAGE / "batching").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
    ]
    assert not [m for m in batching_imports if (m or "").startswith("inferd.executors")]


def test_only_pipelined_executors_define_stage() -> None:
    """The core calls ``stage`` where an executor has one (``StagingExecutor``): GPU instances
    of ONNX Runtime and TensorRT's; a CPU instance has none, and costs the core nothing."""
    assert not hasattr(OnnxRuntimeExecutor, "stage")
    assert callable(StagingOnnxRuntimeExecutor.stage)
    assert callable(TensorRtExecutor.stage)
    with pytest.raises(ValueError, match="not on a GPU"):
        StagingOnnxRuntimeExecutor(
            Path("unused.onnx"),
            ["X"],
            ["Y"],
            OnnxRuntimeOptions(1, 1),
            placement=InstancePlacement("cpu"),
        )


def _imported_modules(path: Path, *, runtime_only: bool) -> list[str]:
    """The inferd modules ``path`` imports; with ``runtime_only``, not those under ``if
    TYPE_CHECKING:``, which only the type checker reads."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(inner) for inner in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return [name for name in found if name == "inferd" or name.startswith("inferd.")]


def _sources() -> list[tuple[str, Path]]:
    """Each module of the package, by its dotted name."""
    return [
        (".".join(("inferd", *path.relative_to(PACKAGE).with_suffix("").parts)), path)
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def test_only_the_core_package_imports_the_native_module() -> None:
    """``inferd.core`` is the one door to ``inferd._core`` at run time; type annotations may name
    the native module's types elsewhere."""
    outside = [
        f"{name} imports {imported}"
        for name, path in _sources()
        if not name.startswith("inferd.core.") and name != "inferd.core"
        for imported in _imported_modules(path, runtime_only=True)
        if imported == "inferd._core" or imported.startswith("inferd._core.")
    ]
    assert outside == []


def _part(module: str) -> str:
    """The package's part a module belongs to: its first-level subpackage or module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_parts_of_the_package_import_one_another_without_a_circle() -> None:
    """Every import counts here, type-only and deferred ones too: a part that names another's
    types depends on it as much as one that calls it."""
    leaves = {"inferd", "inferd._core", "inferd._proto", "inferd.__main__"}
    known = {_part(name) for name, _ in _sources()}
    edges: dict[str, set[str]] = {}
    for name, path in _sources():
        for imported in _imported_modules(path, runtime_only=False):
            target = _part(imported)
            if target != _part(name) and target in known and target not in leaves:
                edges.setdefault(_part(name), set()).add(target)

    def circle_from(start: str) -> list[str] | None:
        path: list[str] = []

        def visit(node: str) -> list[str] | None:
            if node in path:
                return [*path[path.index(node) :], node]
            path.append(node)
            for target in sorted(edges.get(node, ())):
                found = visit(target)
                if found is not None:
                    return found
            path.pop()
            return None

        return visit(start)

    circles = {" -> ".join(c) for start in sorted(edges) if (c := circle_from(start)) is not None}
    assert circles == set()
