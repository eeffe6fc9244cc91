"""``inferd serve``, ``inferd health`` and ``inferd make-examples``.

Flags and INFERD_* variables -> settings -> run. A start-up mistake (a bad flag value, a missing
repository, a port in use) is one line on stderr and exit status 2, as argparse's own errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import importlib.util
import os
import signal
import sys
import threading
import time
import typing
from pathlib import Path
from typing import Any

import structlog

from inferd import __version__
from inferd.cache_config import CacheConfigError, cache_size
from inferd.errors import InferdError
from inferd.observability.logging import LogControl, configure_logging
from inferd.observability.open_files import raise_open_file_limit
from inferd.settings import SECTIONS, ServerSettings, section_fields, setting_fields
from inferd.triton_flags import BY_NAME as TRITON_FLAGS
from inferd.triton_flags import TritonFlagError, translate
from inferd.tune.command import add_tune_command, run_tune

log = structlog.get_logger(__name__)


def _bool(text: str) -> bool:
    """Triton's boolean flags: ``--grpc-use-ssl``, ``--grpc-use-ssl=true`` or ``=false``."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (true or false)")


def _port(text: str) -> int:
    """A listener's port: 0 picks a free one, -1 or ``off`` is no listener."""
    if text.strip().lower() == "off":
        return -1
    try:
        port = int(text)
    except ValueError:
        port = -2
    if not -1 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"not a port: {text!r} (0-65535; 0 picks a free one; -1 or off = none)"
        )
    return port


def _octal_mode(text: str) -> str:
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"not an octal file mode: {text!r} (e.g. 0660)")
    return text


def _unix_socket_path(text: str) -> str:
    """A Unix socket's path, given as PATH or as gRPC writes its address (``unix:PATH``,
    ``unix:///ABSOLUTE``)."""
    for scheme in ("unix://", "unix:"):
        if text.startswith(scheme):
            return text[len(scheme) :]
    return text


def _flag(name: str) -> str:
    """A setting's flag: ``grpc_port`` is ``--grpc-port``."""
    return "--" + name.replace("_", "-")


# Settings whose flags take something other than their field's type says.
_CONVERTERS: dict[str, Any] = {
    "grpc_port": _port,
    "http_port": _port,
    "metrics_port": _port,
    "grpc_unix_socket": _unix_socket_path,
    "http_unix_socket": _unix_socket_path,
    "grpc_unix_socket_mode": _octal_mode,
    "http_unix_socket_mode": _octal_mode,
    "model_repository": Path,
}


class StartupError(Exception):
    """A mistake in what the server was asked to do, found before or while it starts: reported
    as one line (``inferd serve: error: ...``), exit status 2, no traceback."""


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (its usage would be dozens) that points to
    ``--help``, which has the usage."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# A repeatable flag's INFERD_* variable holds its values separated by this.
_REPEATED_SEPARATOR = ";"


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """Every setting's flag, under its section's heading (the sections of docs/settings.md)."""
    for section in SECTIONS:
        group = parser.add_argument_group(section)
        for f in section_fields(section):
            _add_setting_flag(group, f)


def _add_setting_flag(parser: argparse._ArgumentGroup, f: dataclasses.Field[object]) -> None:
    """One setting's flag; its default is its INFERD_* variable's value, else the field's."""
    flag = _flag(f.name)
    env = "INFERD_" + f.name.upper()
    if f.type == "bool":
        parser.add_argument(
            flag,
            type=_bool,
            nargs="?",
            const=True,
            metavar="{true,false}",
            default=_bool(os.environ.get(env, str(f.default))),
            help=f"{f.metadata['help']} [env {env}; default {str(f.default).lower()}]",
        )
        return
    if f.type == "tuple[str, ...]":
        from_env = os.environ.get(env, "")
        parser.add_argument(
            flag,
            action="append",
            default=[v for v in from_env.split(_REPEATED_SEPARATOR) if v],
            help=f"{f.metadata['help']} [env {env}]",
        )
        return
    kind: Any = f.type if f.type in ("int", "float", "str") else "str"
    convert = {"int": int, "float": float, "str": str}.get(str(kind), str)
    # argparse converts a default that is a string (an INFERD_* value) as it converts a flag.
    default = os.environ.get(env, f.default)
    choices = f.metadata["choices"]
    parser.add_argument(
        flag,
        type=_CONVERTERS.get(f.name, convert),
        default=default,
        choices=choices or None,
        help=f"{f.metadata['help']} [env {env}; default {f.default}]",
    )


def _settings(args: argparse.Namespace) -> ServerSettings:
    values = {f.name: getattr(args, f.name) for f in setting_fields()}
    values["model_repository"] = Path(values["model_repository"])
    for f in setting_fields():
        if f.type == "tuple[str, ...]":
            values[f.name] = tuple(values[f.name])
        # argparse checks a flag's choices, not an INFERD_* default's.
        choices: tuple[str, ...] = f.metadata["choices"]
        if choices and values[f.name] not in choices:
            env = "INFERD_" + f.name.upper()
            raise StartupError(
                f"{env}: invalid choice: {values[f.name]!r} (choose from {', '.join(choices)})"
            )
    return ServerSettings(**values)


# Limits that must be positive: 0 would refuse every connection or request.
_POSITIVE = (
    "http_header_timeout_secs",
    "http_idle_timeout_secs",
    "http_max_connections",
    "http_max_header_bytes",
    "http_max_body_bytes",
    "http_max_decompressed_bytes",
    "http_max_json_depth",
    "http_max_chunks",
)


def _check_startup(settings: ServerSettings) -> None:
    """What can be checked before anything starts. Raises StartupError."""
    if not settings.model_repository.is_dir():
        raise StartupError(f"--model-repository {settings.model_repository}: no such directory")
    # --allow-grpc=false / --allow-http=false win over their protocol's listener flags, as
    # Triton's do.
    grpc = settings.allow_grpc and (settings.grpc_port >= 0 or bool(settings.grpc_unix_socket))
    http = settings.allow_http and (settings.http_port >= 0 or bool(settings.http_unix_socket))
    if not grpc and not http:
        raise StartupError(
            "there would be no listener: gRPC and HTTP are each turned off (--allow-grpc, "
            "--allow-http) or have neither a port (--grpc-port, --http-port) nor a Unix socket "
            "(--grpc-unix-socket, --http-unix-socket)"
        )
    for name in _POSITIVE:
        value = getattr(settings, name)
        if value <= 0:
            raise StartupError(f"{_flag(name)} must be positive, not {value}")
    try:
        cache_size(settings.cache_config)
    except CacheConfigError as e:
        raise StartupError(str(e)) from None
    if (threads := settings.http_thread_count) < 0:
        raise StartupError(f"--http-thread-count must be 0 (one per core) or more, not {threads}")
    try:
        runtime = importlib.util.find_spec("onnxruntime")
    except ValueError:  # imported before and removed
        runtime = None
    if runtime is None:
        raise StartupError(
            "ONNX Runtime is not installed: pip install onnxruntime (CPU), or see docs/deploy.md "
            "(Install) for the GPU build"
        )


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
    try:
        server = await create_server(settings, log_control=log_control, stopping=shutdown.abandon)
    except (OSError, ValueError, InferdError) as e:  # a port in use, an unreadable file, ...
        raise StartupError(str(e)) from None
    try:
        failed = server.failed_models()
        if failed and settings.exit_on_error and not shutdown.requested.is_set():
            # Each failure's reason is in the log already, from its load.
            raise StartupError(
                f"models failed to load at start: {', '.join(failed)} (see the log; "
                "--exit-on-error=false serves the others, not ready)"
            )
        if not shutdown.requested.is_set():
            await server.start()
            await shutdown.requested.wait()
    finally:
        await server.stop()


def _default_health_address() -> str:
    """Where the server started with the same INFERD_* variables listens: its Unix socket if it
    has one (no TLS to configure), else its TCP port on the loopback."""
    unix_socket = _unix_socket_path(os.environ.get("INFERD_GRPC_UNIX_SOCKET", ""))
    if unix_socket:
        return f"unix:{unix_socket}"
    return f"127.0.0.1:{os.environ.get('INFERD_GRPC_PORT', '8001')}"


def _add_health_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=_default_health_address(),
        help="HOST:PORT or unix:PATH [default: unix:$INFERD_GRPC_UNIX_SOCKET if set, else "
        "127.0.0.1:$INFERD_GRPC_PORT (8001)]",
    )
    parser.add_argument(
        "--service",
        default="",
        help="The health service to ask: '' = the server as a whole (default), or "
        "inference.GRPCInferenceService.",
    )
    parser.add_argument(
        "--timeout-secs", type=float, default=5.0, help="Deadline of the call (default 5)."
    )
    parser.add_argument(
        "--grpc-use-ssl",
        type=_bool,
        nargs="?",
        const=True,
        metavar="{true,false}",
        default=_bool(os.environ.get("INFERD_GRPC_USE_SSL", "false")),
        help="TLS to a TCP address, as the server's flag [env INFERD_GRPC_USE_SSL]. A Unix socket "
        "is plaintext.",
    )
    parser.add_argument(
        "--grpc-root-cert",
        default="",
        help="PEM file: the CA certificates the server's certificate is checked against "
        "(default: the system's).",
    )
    parser.add_argument(
        "--grpc-client-cert", default="", help="PEM file: a client certificate (mutual TLS)."
    )
    parser.add_argument(
        "--grpc-client-key", default="", help="PEM file: the key of --grpc-client-cert."
    )
    parser.add_argument(
        "--grpc-server-name",
        default="",
        help="The name the server's certificate must carry, when not the address's host.",
    )


def _health(args: argparse.Namespace) -> int:
    """One line: the address, the service and its status (or why there is none). 0 = SERVING."""
    import grpc  # deferred: make-examples needs no gRPC
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    service = args.service or "(server)"
    if args.address.startswith("unix:") or not args.grpc_use_ssl:
        channel = grpc.insecure_channel(args.address)
    else:

        def pem(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        try:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=pem(args.grpc_root_cert),
                private_key=pem(args.grpc_client_key),
                certificate_chain=pem(args.grpc_client_cert),
            )
        except OSError as e:
            raise StartupError(f"cannot read a TLS file: {e}") from None
        override = [("grpc.ssl_target_name_override", args.grpc_server_name)]
        channel = grpc.secure_channel(
            args.address, credentials, options=override if args.grpc_server_name else None
        )
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_secs
            )
        except grpc.RpcError as e:
            print(f"{args.address} {service}: {e.code().name}: {e.details()}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.address} {service}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


_DESCRIPTION = """\
inferd serves ONNX, TensorRT and Triton python-backend models over gRPC and HTTP/REST, with the
KServe v2 / Triton protocol: tritonclient and perf_analyzer work unchanged on either.
'inferd COMMAND --help' shows a command's flags; docs/ in the source tree explains them."""

_SERVE_DESCRIPTION = """\
Serve a model repository (the Triton layout) over gRPC and HTTP/REST. Every flag is also read
from the environment as INFERD_<NAME> (--grpc-port: INFERD_GRPC_PORT); the flag wins. The flags
are grouped as docs/settings.md describes them. Triton's flags (--model-store, --allow-metrics,
...) are taken too: docs/coming-from-triton.md says what inferd does with each."""


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``inferd`` parser and its commands' parsers, by name."""
    parser = _OneLineParser(
        prog="inferd",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="Serve a model repository over gRPC.",
        description=_SERVE_DESCRIPTION,
        usage="%(prog)s [--model-repository DIR] [--grpc-port PORT] [OPTION ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_setting_flags(serve)
    health = commands.add_parser(
        "health",
        help="Ask a server's gRPC health service (grpc.health.v1): exit 0 when SERVING, else 1.",
    )
    _add_health_flags(health)
    examples = commands.add_parser("make-examples", help="Write the example model repository.")
    examples.add_argument("dir", type=Path, help="Folder to write the repository into.")
    tune = add_tune_command(commands)
    return parser, {"serve": serve, "health": health, "make-examples": examples, "tune": tune}


def _unrecognized(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    """What argparse left over, each flag with the closest one the command (or Triton) has."""
    flags = [token.partition("=")[0] for token in unknown if token.startswith("-")]
    if not flags:
        return f"unrecognized arguments: {' '.join(unknown)}"
    known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    if parser.prog.endswith(" serve"):
        known += list(TRITON_FLAGS)
    said = []
    for flag in flags:
        close = difflib.get_close_matches(flag, known, n=1)
        said.append(f"unrecognized flag {flag}" + (f": did you mean {close[0]}?" if close else ""))
    return "; ".join(said)


def _arguments(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, str]]]:
    """The command line parsed, ``serve``'s Triton flags turned into inferd's first; and the
    Triton flags dropped, each with why. A mistake, a refused flag included, exits 2 with one
    line (argparse's way)."""
    parser, commands = _parser()
    ignored: list[tuple[str, str]] = []
    if argv[:1] == ["serve"]:
        try:
            translated = translate(argv[1:])
        except TritonFlagError as e:
            commands["serve"].error(str(e))
        argv, ignored = ["serve", *translated.args], translated.ignored
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse reports them as the top parser's (``inferd: error``); the mistake is in the
        # command's flags, and its --help lists them.
        commands[args.command].error(_unrecognized(unknown, commands[args.command]))
    return args, ignored


def main(argv: list[str] | None = None) -> int:
    args, ignored = _arguments(sys.argv[1:] if argv is None else list(argv))

    if args.command == "make-examples":
        from inferd.examples import make_examples

        names = make_examples(args.dir)
        print(f"wrote {', '.join(names)} to {args.dir}")
        return 0

    if args.command == "tune":
        return run_tune(args)

    try:
        if args.command == "health":
            return _health(args)
        settings = _settings(args)
        _check_startup(settings)
        log_control = configure_logging(
            settings.log_format, settings.log_level, settings.log_verbose
        )
        for flag, why in ignored:
            log.info("Triton flag ignored", flag=flag, why=why)
        raise_open_file_limit()
        asyncio.run(_serve(settings, log_control))
    except StartupError as e:
        print(f"inferd {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
