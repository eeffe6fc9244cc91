"""``inferd serve`` and ``inferd make-examples``.

Flags and INFERD_* variables -> settings -> run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from inferd.observability.logging import LogControl, configure_logging
from inferd.settings import ServerSettings, setting_fields


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    for f in setting_fields():
        flag = "--" + f.name.replace("_", "-")
        env = "INFERD_" + f.name.upper()
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
    return ServerSettings(**values)


async def _serve(settings: ServerSettings, log_control: LogControl) -> None:
    from inferd.server import create_server  # deferred: make-examples needs no server

    # Handlers first: a SIGTERM while models load (or just after "server started") must stop the
    # server cleanly once it is up, not kill the process.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = await create_server(settings, log_control=log_control)
    await server.start()
    try:
        await stop.wait()
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
    asyncio.run(_serve(settings, log_control))
    return 0


if __name__ == "__main__":
    sys.exit(main())
