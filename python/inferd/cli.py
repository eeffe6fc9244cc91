"""``inferd serve`` and ``inferd make-examples``.

Flags and INFERD_* variables -> settings -> run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from inferd.observability.logging import LogControl, configure_logging
from inferd.observability.open_files import raise_open_file_limit
from inferd.settings import ServerSettings, setting_fields

log = structlog.get_logger(__name__)


def _bool(text: str) -> bool:
    """Triton's boolean flags: ``--grpc-use-ssl``, ``--grpc-use-ssl=true`` or ``=false``."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (true or false)")


# A repeatable flag's INFERD_* variable holds its values separated by this.
_REPEATED_SEPARATOR = ";"


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    for f in setting_fields():
        flag = "--" + f.name.replace("_", "-")
        env = "INFERD_" + f.name.upper()
        if f.type == "bool":
            parser.add_argument(
                flag,
                type=_bool,
                nargs="?",
                const=True,
                default=_bool(os.environ.get(env, str(f.default))),
                help=f"{f.metadata['help']} [env {env}; default {str(f.default).lower()}]",
            )
            continue
        if f.type == "tuple[str, ...]":
            from_env = os.environ.get(env, "")
            parser.add_argument(
                flag,
                action="append",
                default=[v for v in from_env.split(_REPEATED_SEPARATOR) if v],
                help=f"{f.metadata['help']} [env {env}]",
            )
            continue
        kind: Any = f.type if f.type in ("int", "float", "str") else "str"
        convert = {"int": int, "float": float, "str": str}.get(str(kind), str)
        default = os.environ.get(env, f.default)
        parser.add_argument(
            flag,
            type=Path if f.name == "model_repository" else convert,
            default=default,
            help=f"{f.metadata['help']} [env {env}; default {f.default}]",
        )


def _settings(args: argparse.Namespace) -> ServerSettings:
    values = {f.name: getattr(args, f.name) for f in setting_fields()}
    values["model_repository"] = Path(values["model_repository"])
    for f in setting_fields():  # environment values arrive as strings
        if f.type == "int":
            values[f.name] = int(values[f.name])
        elif f.type == "float":
            values[f.name] = float(values[f.name])
        elif f.type == "tuple[str, ...]":
            values[f.name] = tuple(values[f.name])
    return ServerSettings(**values)


# SIGTERM ends the process within --exit-timeout-secs plus this, whatever still runs.
EXIT_MARGIN_S = 5.0


class _Shutdown:
    """The process's answer to SIGTERM and SIGINT. The first starts the graceful stop (loads in
    progress are abandoned, calls in flight have --exit-timeout-secs) and ends the process at
    that plus ``EXIT_MARGIN_S`` if the stop has not ended it; a second one ends it at once. Each
    says so in the log.

    The handler itself only starts a thread: a signal can arrive while the main thread holds the
    log's lock, so nothing it interrupts is waited for in the handler."""

    def __init__(self, loop: asyncio.AbstractEventLoop, exit_timeout_s: float) -> None:
        self._loop = loop
        self._limit_s = exit_timeout_s + EXIT_MARGIN_S
        self.requested = asyncio.Event()  # the server stops when set (on the loop)
        self.abandon = threading.Event()  # loads in progress stop at their next step when set
        self._signals = 0

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._signalled)

    def _signalled(self, signum: int, _frame: object) -> None:
        self._signals += 1
        first = self._signals == 1
        target = self._stop_gracefully if first else self._exit_now
        threading.Thread(target=target, args=(signum,), name="inferd-shutdown", daemon=True).start()

    def _stop_gracefully(self, signum: int) -> None:
        log.info(
            "shutting down",
            signal=signal.Signals(signum).name,
            exit_timeout_secs=self._limit_s - EXIT_MARGIN_S,
            exits_within_secs=self._limit_s,
        )
        self.abandon.set()
        with contextlib.suppress(RuntimeError):  # the loop has closed: the process is ending
            self._loop.call_soon_threadsafe(self.requested.set)
        time.sleep(self._limit_s)
        log.error(
            "shutdown took longer than --exit-timeout-secs plus the margin: exiting now",
            exit_within_secs=self._limit_s,
        )
        _exit(1)

    def _exit_now(self, signum: int) -> None:
        log.warning(
            "second signal during shutdown: exiting now", signal=signal.Signals(signum).name
        )
        _exit(128 + signum)


def _exit(code: int) -> None:
    """Ends the process without waiting for anything (threads, the loop, atexit)."""
    for stream in (sys.stderr, sys.stdout):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


async def _serve(settings: ServerSettings, log_control: LogControl) -> None:
    from inferd.server import create_server  # deferred: make-examples needs no server

    # Handlers first: a SIGTERM while models load stops the loads at their next step and the
    # server as soon as it is built, not after the loads finish.
    shutdown = _Shutdown(asyncio.get_running_loop(), settings.exit_timeout_secs)
    shutdown.install()
    server = await create_server(settings, log_control=log_control, stopping=shutdown.abandon)
    try:
        if not shutdown.requested.is_set():
            await server.start()
            await shutdown.requested.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferd", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Serve a model repository over gRPC.")
    _add_setting_flags(serve)
    examples = commands.add_parser("make-examples", help="Write the example model repository.")
    examples.add_argument("dir", type=Path, help="Folder to write the repository into.")
    args = parser.parse_args(argv)

    if args.command == "make-examples":
        from inferd.examples import make_examples

        names = make_examples(args.dir)
        print(f"wrote {', '.join(names)} to {args.dir}")
        return 0

    settings = _settings(args)
    log_control = configure_logging(settings.log_format, settings.log_level, settings.log_verbose)
    raise_open_file_limit()
    asyncio.run(_serve(settings, log_control))
    return 0


if __name__ == "__main__":
    sys.exit(main())
