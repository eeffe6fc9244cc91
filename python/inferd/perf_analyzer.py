"""``inferd-perf-analyzer``: Triton's perf_analyzer, run with the CUDA runtime library it needs.

The tritonclient wheel ships perf_analyzer linked against ``libcudart.so.12``, which it loads even
where it runs without a GPU, and does not ship that library. Run bare, it stops with
``libcudart.so.12: cannot open shared object file``. The nvidia-cuda-runtime-cu12 wheel (in
inferd's ``dev`` extra) has the library: this puts its folder first on ``LD_LIBRARY_PATH`` and
replaces itself with perf_analyzer, with the arguments given, so signals and the exit status are
perf_analyzer's own. docs/benchmarks.md shows it in use.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

PERF_ANALYZER = "perf_analyzer"
CUDA_RUNTIME_LIBRARY = "libcudart.so.12"
CUDA_RUNTIME_WHEEL = "nvidia-cuda-runtime-cu12"


def perf_analyzer_binary() -> Path | None:
    """tritonclient's perf_analyzer: in this environment's scripts folder, where its wheel
    installs it, else on ``PATH``."""
    beside = Path(sysconfig.get_path("scripts")) / PERF_ANALYZER
    if beside.is_file():
        return beside
    found = shutil.which(PERF_ANALYZER)
    return Path(found) if found else None


def cuda_runtime_dir() -> Path | None:
    """The folder holding ``libcudart.so.12`` in the nvidia-cuda-runtime-cu12 wheel, or None
    when that wheel is not installed. Found without importing it (it has no code to run)."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except ModuleNotFoundError:  # no ``nvidia`` namespace at all
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(location) / "lib"
        if (lib / CUDA_RUNTIME_LIBRARY).is_file():
            return lib
    return None


def environment(base: Mapping[str, str], library_dir: Path) -> dict[str, str]:
    """``base`` with ``library_dir`` first on ``LD_LIBRARY_PATH``."""
    env = dict(base)
    rest = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = f"{library_dir}:{rest}" if rest else str(library_dir)
    return env


def main(argv: list[str] | None = None) -> int:
    """Replaces this process with perf_analyzer (``os.execve``); returns only when it cannot
    start it, with status 2 and one line on stderr saying what to install."""
    args = sys.argv[1:] if argv is None else argv
    binary = perf_analyzer_binary()
    if binary is None:
        print(
            "inferd-perf-analyzer: error: no perf_analyzer in this environment or on PATH "
            "(it comes with tritonclient's wheel: pip install 'tritonclient[grpc]==2.41.0', "
            "or inferd's dev extra)",
            file=sys.stderr,
        )
        return 2
    library_dir = cuda_runtime_dir()
    if library_dir is None:
        print(
            f"inferd-perf-analyzer: error: perf_analyzer needs {CUDA_RUNTIME_LIBRARY}, from the "
            f"{CUDA_RUNTIME_WHEEL} wheel, which is not installed (pip install "
            f"{CUDA_RUNTIME_WHEEL}, or inferd's dev extra)",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    os.execve(binary, [str(binary), *args], environment(os.environ, library_dir))


if __name__ == "__main__":
    sys.exit(main())
