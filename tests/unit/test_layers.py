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
        "inferd.batching",
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
