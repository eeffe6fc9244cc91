"""``inferd``'s command line: ``serve``'s process and signals, and what the parser tells a user."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from inferd import cli

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
        def failed_models(self):
            return []

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


def _error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``inferd ARGV`` writes to stderr when argparse refuses it (exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_an_unknown_serve_flag_is_reported_by_serve_pointing_to_its_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _error_line(["serve", "--grpc-prot", "9001"], capsys)
    assert line == (
        "inferd serve: error: unrecognized flag --grpc-prot: did you mean --grpc-port? "
        "(see inferd serve --help)"
    )
    line = _error_line(["serve", "9001"], capsys)  # no flag to match
    assert line == "inferd serve: error: unrecognized arguments: 9001 (see inferd serve --help)"


def test_a_bad_value_and_an_unknown_health_flag_point_to_their_command_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _error_line(["serve", "--log-level", "loud"], capsys)
    assert line.startswith("inferd serve: error: argument --log-level: invalid choice: 'loud'")
    assert line.endswith("(see inferd serve --help)")
    line = _error_line(["health", "--adress", "x"], capsys)
    assert line == (
        "inferd health: error: unrecognized flag --adress: did you mean --address? "
        "(see inferd health --help)"
    )


def test_inferd_help_says_what_inferd_serves_not_how_the_module_is_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "gRPC and HTTP/REST" in text
    assert "``" not in text  # a docstring's markup: what a developer reads, not a user
