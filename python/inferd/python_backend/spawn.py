"""Starting a python model's worker so that it never outlives its server, and logging what it
writes to stdout and stderr.

The kernel's parent-death signal (``PR_SET_PDEATHSIG``, which the worker asks for first thing,
checking that its parent is still the server) fires when the *thread* that forked the worker
ends, not the process: so ``launch`` forks from a thread of its own that lives exactly as long
as the worker. The worker leads a process group of its own; ``kill_group`` kills it whole, what
the model started included.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from typing import IO, Final

import structlog

from inferd.python_backend.model_config import worker_environment

log = structlog.get_logger(__name__)

# A line of the worker's stdout or stderr longer than this is logged cut, saying how much.
OUTPUT_LINE_MAX_BYTES: Final = 16 * 1024


def launch(command: list[str], pass_fds: tuple[int, ...], name: str) -> subprocess.Popen[bytes]:
    """Starts the worker from a thread of its own that waits (without reaping it) until it
    exits: the worker's parent-death signal fires when that thread ends, so it must live as long
    as the worker and no longer. Raises OSError when the process cannot be started."""
    started: queue.Queue[subprocess.Popen[bytes] | Exception] = queue.Queue(maxsize=1)

    def run() -> None:
        try:
            process = subprocess.Popen(
                command,
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,  # the worker points its stdout here too
                env=worker_environment(),
                process_group=0,  # its own group: a kill takes what the model started too
            )
        except Exception as error:  # the caller raises it; nothing may leave it waiting
            started.put(error)
            return
        started.put(process)
        # WNOWAIT: the handle reaps it; ECHILD: it reaped it first.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)

    threading.Thread(target=run, name=f"inferd-launch-{name}", daemon=True).start()
    outcome = started.get()
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def wait_exited(pid: int, timeout_s: float) -> None:
    """Waits until the child ``pid`` has exited, without reaping it (its pid, and so its process
    group's, stays reserved). Raises TimeoutError when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:
            return  # reaped already
        if time.monotonic() >= deadline:
            raise TimeoutError(f"pid {pid} did not exit within {timeout_s:g} s")
        time.sleep(0.01)


def kill_group(pid: int) -> None:
    """SIGKILL for the worker's process group (the worker and what its model started)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def forward_output(stream: IO[bytes], identity: dict[str, str | int]) -> None:
    """Logs the worker's stdout and stderr a line a record, each cut at OUTPUT_LINE_MAX_BYTES
    (the rest of the line is read and counted, never held), until every writer closed it."""
    with stream:
        while line := stream.readline(OUTPUT_LINE_MAX_BYTES):
            cut = 0
            if not line.endswith(b"\n"):
                while (rest := stream.readline(OUTPUT_LINE_MAX_BYTES)) and not rest.endswith(b"\n"):
                    cut += len(rest)
                cut += max(len(rest) - 1, 0)
            text = line.rstrip(b"\n").decode("utf-8", errors="replace")
            extra: dict[str, int] = {"cut_bytes": cut} if cut else {}
            log.info("python model output", line=text, **extra, **identity)
