"""The wheel as a user installs it (issue 14, item 1): built and installed by deploy/install.sh,
the script the images run, into a fresh virtual environment with no extras, it serves an ONNX
model on the CPU to tritonclient.

The wheel is built with this checkout's build of the core (the editable install's build folder,
under the lock `make build` users share): an isolated build would compile the core again, minutes
on a small machine. Dependencies come from the package index (pip's cache after the first run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferd.examples import make_examples

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "deploy" / "install.sh"
BUILD_LOCK = "/tmp/inferd-build.lock"
BUILD_TIMEOUT_S = 900.0
INSTALL_TIMEOUT_S = 600.0
START_TIMEOUT_S = 60.0


def _build_dir() -> Path:
    """The editable install's build folder (pyproject: build-dir = "build/{wheel_tag}")."""
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return ROOT / "build" / f"{python}-{python}-{platform}"


def _run(command: list[str], env: dict[str, str], timeout: float) -> float:
    started = time.monotonic()
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return time.monotonic() - started


@pytest.mark.timeout(BUILD_TIMEOUT_S + INSTALL_TIMEOUT_S + START_TIMEOUT_S + 60)
def test_wheel_without_extras_serves_a_model(tmp_path: Path) -> None:
    if shutil.which("flock") is None or shutil.which("pkg-config") is None:
        pytest.skip("flock or pkg-config missing: cannot build the wheel here")
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # make test-asan-python preloads AddressSanitizer into every process, pip and the
        # compiler included; the plain run (make test) builds and installs the wheel.
        pytest.skip("AddressSanitizer run: the wheel is built and installed by the plain run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "PYTHON"))}
    env["PYTHON"] = sys.executable
    env["PIP_WHEEL_ARGS"] = f"--no-build-isolation -C build-dir={_build_dir()}"
    wheels = tmp_path / "wheels"
    built_s = _run(["flock", BUILD_LOCK, str(INSTALL), "wheel", str(wheels)], env, BUILD_TIMEOUT_S)
    (wheel,) = wheels.glob("inferd-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], env, INSTALL_TIMEOUT_S)
    env["PYTHON"] = str(venv / "bin" / "python")
    installed_s = _run([str(INSTALL), "install", str(wheel)], env, INSTALL_TIMEOUT_S)
    print(f"wheel built in {built_s:.0f} s, installed with its dependencies in {installed_s:.0f} s")

    # The package served is the installed one, and no extra came along.
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import inferd; print(inferd.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)), where
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "onnxruntime" in names and not {"onnxruntime-gpu", "tensorrt", "pytest"} & names

    version = subprocess.run(
        [str(venv / "bin" / "inferd"), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("inferd "), version.stdout

    repository = tmp_path / "models"
    make_examples(repository)
    _serve_and_infer(venv, repository, tmp_path, env)


def _serve_and_infer(venv: Path, repository: Path, workdir: Path, env: dict[str, str]) -> None:
    log_path = workdir / "server.log"
    command = [
        str(venv / "bin" / "inferd"), "serve", "--model-repository", str(repository),
        "--host", "127.0.0.1", "--grpc-port", "0", "--metrics-port", "-1", "--log-format", "json",
        "--http-port", "0",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, cwd=workdir, env=env)
    try:
        started = _wait_started(process, log_path)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{started['port']}")
        try:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [
                grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            result = client.infer("simple", inputs, client_timeout=30)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        finally:
            client.close()
        assert started["models_failed"] == [], log_path.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    assert code == 0, log_path.read_text()


def _wait_started(process: subprocess.Popen[bytes], log_path: Path) -> dict[str, object]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "server started":
                started: dict[str, object] = json.loads(line)
                return started
        if process.poll() is not None:
            pytest.fail(
                f"the installed inferd exited ({process.returncode}):\n{log_path.read_text()}"
            )
        time.sleep(0.1)
    pytest.fail(
        f"the installed inferd did not start in {START_TIMEOUT_S:.0f} s:\n{log_path.read_text()}"
    )
