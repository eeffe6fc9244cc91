"""Socket-only serving (issue 14, item 3): with --grpc-port off the server listens on its Unix
socket alone, whose file has --grpc-unix-socket-mode (0660 by default) and
--grpc-unix-socket-group from the moment it exists, so that a client running as another user in
that group can connect and one outside it cannot."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import running_server

# A uid and gid that own nothing here: the client's identity in the other-user checks.
OTHER_UID = 65534
SOCKET_GID = 4242
OUTSIDE_GID = 4343
CLIENT_TIMEOUT_S = 60.0

# tritonclient through the socket: the "simple" example, a + b. With a uid and gid, the client
# takes them once its imports are done (the interpreter lives under /root, which other users
# cannot read): the connection is made as that user, with only that group.
CLIENT = """
import os
import sys
import numpy as np
import tritonclient.grpc as grpcclient

if len(sys.argv) > 2:
    os.setgroups([])
    os.setgid(int(sys.argv[3]))
    os.setuid(int(sys.argv[2]))
client = grpcclient.InferenceServerClient(sys.argv[1])
a = np.arange(16, dtype=np.int32).reshape(1, 16)
inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
          grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(a)
result = client.infer("simple", inputs, client_timeout=20)
assert (result.as_numpy("OUTPUT0") == 2 * a).all()
print("ok")
"""


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A folder every user may pass through (pytest's tmp_path is 0700): the socket's own mode and
    group are then what decides who connects."""
    path = Path(tempfile.mkdtemp(prefix="inferd-sock-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _client(
    url: str, *, uid: int | None = None, gid: int | None = None
) -> subprocess.CompletedProcess[str]:
    identity = [] if uid is None else [str(uid), str(gid)]
    return subprocess.run(
        [sys.executable, "-c", CLIENT, url, *identity],
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )


def test_socket_only_server_with_mode_0660(
    tmp_path: Path, repository: Path, server_models: list[str], socket_dir: Path
) -> None:
    path = socket_dir / "inferd.sock"
    group = str(SOCKET_GID if os.geteuid() == 0 else os.getegid())
    with running_server(
        repository,
        server_models,
        tmp_path,
        "--grpc-port",
        "off",
        "--http-port",
        "off",  # no TCP listener of either protocol: the socket is the only way in
        "--grpc-unix-socket",
        str(path),
        "--grpc-unix-socket-group",
        group,
    ) as server:
        started = next(r for r in server.records() if r.get("event") == "server started")
        assert started["listeners"] == [
            f"unix:{path}",
            f"http://127.0.0.1:{started['metrics_port']}/metrics",
        ]
        assert started["port"] is None
        info = os.stat(path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o660, oct(info.st_mode)
        assert info.st_gid == int(group)
        # No staging folder left beside the socket.
        assert sorted(p.name for p in socket_dir.iterdir()) == ["inferd.sock"]

        served = _client(f"unix://{path}")
        assert served.returncode == 0 and "ok" in served.stdout, served.stderr

        if os.geteuid() != 0:
            print("SKIPPED PART: not root, so no other uid to switch to; mode and group checked")
            return
        # Another user, in the socket's group: allowed by the group's rw bits.
        other = _client(f"unix://{path}", uid=OTHER_UID, gid=SOCKET_GID)
        assert other.returncode == 0 and "ok" in other.stdout, other.stderr
        # Another user outside the group: the file's mode refuses the connection.
        outside = _client(f"unix://{path}", uid=OTHER_UID, gid=OUTSIDE_GID)
        assert outside.returncode != 0
        assert "Permission denied" in outside.stderr or "UNAVAILABLE" in outside.stderr

    # The server removed its socket on the way out.
    assert not path.exists()


def test_socket_only_server_has_no_tcp_listener(
    tmp_path: Path, repository: Path, server_models: list[str], socket_dir: Path
) -> None:
    """Nothing listens on a TCP port of the server's process: -1 is no listener, not port
    65535 as it was."""
    path = socket_dir / "inferd.sock"
    with running_server(
        repository,
        server_models,
        tmp_path,
        "--grpc-port",
        "-1",
        "--grpc-unix-socket",
        str(path),
        "--metrics-port",
        "off",
        "--http-port",
        "off",
    ) as server:
        started = next(r for r in server.records() if r.get("event") == "server started")
        assert started["listeners"] == [f"unix:{path}"]
        inodes = {
            os.readlink(f"/proc/{server.process.pid}/fd/{fd}")
            for fd in os.listdir(f"/proc/{server.process.pid}/fd")
        }
        listening = _tcp_listening_inodes()
        assert not {i for i in inodes if i in listening}, "a TCP socket of the server listens"
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", 65535)) != 0


def _tcp_listening_inodes() -> set[str]:
    """``socket:[INODE]`` of every listening TCP socket (IPv4 and IPv6) on the machine."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    found.add(f"socket:[{fields[9]}]")
    return found
