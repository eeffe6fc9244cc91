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
