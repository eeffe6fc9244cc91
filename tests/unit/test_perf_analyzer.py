"""``inferd-perf-analyzer``: tritonclient's perf_analyzer runs through it, where run bare it cannot
load ``libcudart.so.12``; without the library's wheel it says what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inferd import perf_analyzer

# The console script pip writes beside this interpreter (pyproject.toml, [project.scripts]).
WRAPPER = Path(sys.executable).parent / "inferd-perf-analyzer"


def test_the_installed_wrapper_runs_perf_analyzer() -> None:
    assert WRAPPER.is_file(), f"no {WRAPPER}: reinstall inferd (make build)"
    done = subprocess.run(
        [str(WRAPPER), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    # perf_analyzer 2.41 writes its version to stderr.
    assert "Perf Analyzer Version" in done.stdout + done.stderr, done.stderr


def test_the_cuda_runtime_folder_goes_first_on_the_library_path(tmp_path: Path) -> None:
    env = perf_analyzer.environment({"LD_LIBRARY_PATH": "/opt/lib", "HOME": "/h"}, tmp_path)
    assert env == {"LD_LIBRARY_PATH": f"{tmp_path}:/opt/lib", "HOME": "/h"}
    assert perf_analyzer.environment({}, tmp_path)["LD_LIBRARY_PATH"] == str(tmp_path)


def test_the_dev_environment_has_the_cuda_runtime_library() -> None:
    found = perf_analyzer.cuda_runtime_dir()
    assert found is not None, "nvidia-cuda-runtime-cu12 (the dev extra) is not installed"
    assert (found / perf_analyzer.CUDA_RUNTIME_LIBRARY).is_file()


def test_without_the_cuda_runtime_wheel_it_names_the_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(perf_analyzer, "cuda_runtime_dir", lambda: None)
    assert perf_analyzer.main(["--version"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferd-perf-analyzer: error: ") and err.count("\n") == 1
    assert "pip install nvidia-cuda-runtime-cu12" in err


def test_without_perf_analyzer_it_names_the_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(perf_analyzer, "perf_analyzer_binary", lambda: None)
    assert perf_analyzer.main([]) == 2
    assert "tritonclient[grpc]==2.41.0" in capsys.readouterr().err
