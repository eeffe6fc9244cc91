"""``inferd serve``'s process: signals."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Runs cli._serve with a stand-in server whose start() receives SIGTERM (as a process might while
# its models load, or right after it logged "server started"): the server must still be stopped
# and the process exit 0, not die of the signal.
_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import inferd.server
    from inferd import cli
    from inferd.settings import ServerSettings

    class Server:
        stopped = False
        async def start(self):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)  # the signal is delivered meanwhile
        async def stop(self):
            Server.stopped = True

    async def create_server(settings, log_control=None, stopping=None):
        return Server()

    inferd.server.create_server = create_server
    asyncio.run(cli._serve(ServerSettings(), None))
    sys.exit(0 if Server.stopped else 3)
    """
)


def test_a_sigterm_during_start_stops_the_server_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
