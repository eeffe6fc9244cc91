"""``inferd health`` (issue 14, item 2), which Docker's HEALTHCHECK runs: one line, exit 0 when
the gRPC health service says SERVING, 1 otherwise, over TCP or the Unix socket."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import ServerProcess

HEALTH_TIMEOUT_S = 30.0


def _health(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "health", *args],
        capture_output=True,
        text=True,
        timeout=HEALTH_TIMEOUT_S,
        check=False,
    )


def test_serving_over_tcp(server: ServerProcess) -> None:
    result = _health("--address", server.url)
    assert result.returncode == 0, result
    assert result.stdout.splitlines() == [f"{server.url} (server): SERVING"]


def test_serving_over_the_unix_socket_from_the_environment(server: ServerProcess) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inferd", "health", "--service", "inference.GRPCInferenceService"],
        capture_output=True,
        text=True,
        timeout=HEALTH_TIMEOUT_S,
        check=False,
        env={"INFERD_GRPC_UNIX_SOCKET": str(server.unix_socket), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result
    assert result.stdout.splitlines() == [
        f"unix:{server.unix_socket} inference.GRPCInferenceService: SERVING"
    ]


def test_unknown_service_is_one_line_and_exit_1(server: ServerProcess) -> None:
    result = _health("--address", server.url, "--service", "no.such.Service")
    assert result.returncode == 1, result
    assert result.stdout.splitlines() == [
        f"{server.url} no.such.Service: NOT_FOUND: unknown service"
    ] or (len(result.stdout.splitlines()) == 1 and "NOT_FOUND" in result.stdout)


def test_no_server_is_exit_1(server: ServerProcess) -> None:
    # The server's own Unix socket path with a suffix: nothing listens there.
    result = _health("--address", f"unix:{server.unix_socket}.none", "--timeout-secs", "2")
    assert result.returncode == 1, result
    assert len(result.stdout.splitlines()) == 1 and "UNAVAILABLE" in result.stdout
