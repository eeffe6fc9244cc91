"""The images' commands against a live server, outside Docker (this machine has no Docker engine):
the model repository filled by the manifests' init container command, the Dockerfiles' ENTRYPOINT
(deploy/entrypoint.sh, run with this environment's `inferd` on PATH) and CMD as they stand (only
the repository path and the ports changed, so that the test runs beside other servers), and their
HEALTHCHECK command, which must report healthy within the HEALTHCHECK's start period and unhealthy
once the server stops."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from inferd import cli
from tests.unit.test_deploy_manifests import (
    DEPLOY,
    DOCKERFILES,
    _exec_form,
    dockerfile_instructions,
    manifest,
)

ROOT = Path(__file__).resolve().parents[2]
# The `inferd` script the wheel installs beside this interpreter: the images' `inferd`.
INFERD = Path(sys.executable).parent / "inferd"
COMMAND_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INFERD), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
        env=env,
    )


def _readme_fleet_client_is_ready(target: str) -> None:
    """docs/deploy.md's fleet snippet (a client balancing over the headless Service's
    addresses), with its target pointed at the live server, builds a client that reaches it."""
    deploy_doc = (ROOT / "docs" / "deploy.md").read_text()
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", deploy_doc, flags=re.S)
        if "inferd-headless" in b
    ]
    code = re.sub(r'"dns:///inferd-headless[^"]*"', repr(target), block)
    assert code != block
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/deploy.md", "exec"), namespace)
    client = namespace["client"]
    try:
        assert client.is_server_ready()  # type: ignore[attr-defined]
    finally:
        client.close()  # type: ignore[attr-defined]


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return float(match.group(1))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_and_healthcheck_against_a_live_server(dockerfile: Path, tmp_path: Path) -> None:
    assert INFERD.exists(), f"no inferd script beside {sys.executable}"
    # Hermetic: the caller's INFERD_* and OTEL_* settings must not change the server.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "OTEL_"))}

    # The model repository, as the manifests' init container fills it.
    fleet = yaml.safe_load_all(manifest("fleet.yaml").read_text())
    (deployment,) = [d for d in fleet if d["kind"] == "Deployment"]
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    init_argv = [tmp_path / "models" if a == "/models" else a for a in init["command"]]
    made = _run([str(a) for a in init_argv], env)
    assert made.returncode == 0, made

    instructions = dockerfile_instructions(dockerfile)
    assert _exec_form(instructions["ENTRYPOINT"][-1]) == ["inferd-entrypoint"]
    cmd = _exec_form(instructions["CMD"][-1])
    (healthcheck,) = instructions["HEALTHCHECK"]
    options, _, command = healthcheck.partition("CMD ")
    health = _exec_form(command)
    start_period = _seconds(re.search(r"--start-period=(\S+)", options).group(1))  # type: ignore[union-attr]
    http_port, grpc_port, metrics_port = str(_free_port()), str(_free_port()), str(_free_port())
    replace = {
        "/models": str(tmp_path / "models"),
        cmd[cmd.index("--http-port") + 1]: http_port,
        cmd[cmd.index("--grpc-port") + 1]: grpc_port,
        cmd[cmd.index("--metrics-port") + 1]: metrics_port,
    }
    cmd = [replace.get(a, a) for a in cmd]
    # The entrypoint script, finding this environment's `inferd` first on PATH as in the image.
    env_with_inferd = {**env, "PATH": f"{INFERD.parent}{os.pathsep}{env.get('PATH', '')}"}
    health = [re.sub(r":\d+$", f":{grpc_port}", a) for a in health]

    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["sh", str(DEPLOY / "entrypoint.sh"), *cmd],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env_with_inferd,
        )
    try:
        deadline = time.monotonic() + start_period
        while (checked := _run(health, env)).returncode != 0:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"{checked}\n{log_path.read_text()}"
            time.sleep(1)
        assert checked.stdout.splitlines() == [f"127.0.0.1:{grpc_port} (server): SERVING"]
        _readme_fleet_client_is_ready(f"dns:///127.0.0.1:{grpc_port}")
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30 + cli.EXIT_MARGIN_S + 10)
    assert code == 0, log_path.read_text()
    # Stopped: the health check now says unhealthy.
    assert _run(health, env).returncode == 1


def test_sidecar_commands_against_a_live_server(tmp_path: Path) -> None:
    """sidecar.yaml's inferd arguments (socket only) and its exec probe, with the paths moved
    under tmp_path, the metrics port free and the socket's group this process's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "OTEL_"))}
    sidecar = yaml.safe_load_all(manifest("sidecar.yaml").read_text())
    (deployment,) = [d for d in sidecar if d["kind"] == "Deployment"]
    fetch, inferd = deployment["spec"]["template"]["spec"]["initContainers"]
    socket_path = tmp_path / "sock" / "inferd.sock"
    socket_path.parent.mkdir()

    def moved(arg: str) -> str:
        arg = arg.replace("/sock/inferd.sock", str(socket_path))
        arg = re.sub(r"^/models$|(?<==)/models$", str(tmp_path / "models"), arg)
        arg = re.sub(r"^(--grpc-unix-socket-group=)\d+$", rf"\g<1>{os.getgid()}", arg)
        return re.sub(r"^(--metrics-port=)\d+$", rf"\g<1>{_free_port()}", arg)

    made = _run([moved(a) for a in fetch["command"]], env)
    assert made.returncode == 0, made
    serve = [moved(a) for a in ["inferd", "serve", *inferd["args"]]]
    probe = [moved(a) for a in inferd["readinessProbe"]["exec"]["command"]]
    assert f"unix:{socket_path}" in probe

    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(INFERD), *serve[1:]], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
        )
    startup = inferd["startupProbe"]
    try:
        deadline = time.monotonic() + startup["periodSeconds"] * startup["failureThreshold"]
        while (checked := _run(probe, env)).returncode != 0:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"{checked}\n{log_path.read_text()}"
            time.sleep(1)
        status = socket_path.stat()
        assert (status.st_mode & 0o777, status.st_gid) == (0o660, os.getgid())
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30 + cli.EXIT_MARGIN_S + 10)
    assert code == 0, log_path.read_text()


def _http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_kserve_runtime_args_and_http_probes_against_a_live_server(tmp_path: Path) -> None:
    """kserve.yaml's runtime args (KServe's Triton runtime's, `tritonserver` first) through the
    images' entrypoint, with the two ports and the model store moved: the runtime's httpGet
    readiness and liveness probes, and the fleet's liveness path, answer 200 once the models have
    loaded, and the gRPC port the args name serves too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "OTEL_"))}
    env["PATH"] = f"{INFERD.parent}{os.pathsep}{env.get('PATH', '')}"
    made = _run(["inferd", "make-examples", str(tmp_path / "models")], env)
    assert made.returncode == 0, made
    runtime = next(
        d
        for d in yaml.safe_load_all(manifest("kserve.yaml").read_text())
        if d["kind"] == "ServingRuntime"
    )
    (container,) = runtime["spec"]["containers"]
    http_port, grpc_port = _free_port(), _free_port()
    moved = {
        "--model-store=/mnt/models": f"--model-store={tmp_path / 'models'}",
        "--http-port=8080": f"--http-port={http_port}",
        "--grpc-port=9000": f"--grpc-port={grpc_port}",
    }
    args = [moved.get(a, a) for a in container["args"]]
    assert args[0] == "tritonserver" and len(set(args) & set(moved.values())) == 3
    # The metrics port too: another server may hold inferd's default.
    args.append(f"--metrics-port={_free_port()}")
    probes = [container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")]
    fleet = next(
        d
        for d in yaml.safe_load_all(manifest("fleet.yaml").read_text())
        if d["kind"] == "Deployment"
    )
    (inferd,) = fleet["spec"]["template"]["spec"]["containers"]
    probes.append(inferd["livenessProbe"]["httpGet"]["path"])
    assert set(probes) == {"/v2/health/ready", "/v2/health/live"}

    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["sh", str(DEPLOY / "entrypoint.sh"), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while _http_ready(http_port) != 200:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        for path in probes:
            assert _http_status(http_port, path) == 200, path
        health = _run(["inferd", "health", "--address", f"127.0.0.1:{grpc_port}"], env)
        assert health.returncode == 0, health
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30 + cli.EXIT_MARGIN_S + 10)
    assert code == 0, log_path.read_text()


def _http_ready(port: int) -> int:
    """/v2/health/ready's status, or 0 while nothing listens on the port yet."""
    try:
        return _http_status(port, "/v2/health/ready")
    except (ConnectionError, urllib.error.URLError):
        return 0
