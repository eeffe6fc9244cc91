"""Triton's command line, read by ``inferd serve``: a tritonserver command line (or a KServe
ServingRuntime written for Triton) starts inferd unchanged.

Every flag of ``tritonserver --help`` (2.51, as bundled in nvidia-pytriton 0.7.0) has one row in
``TRITON_FLAGS``: the same flag as inferd's, an alias of an inferd flag (its value converted where
the units differ), ignored with one log line where ignoring it changes nothing a client sees, or
refused naming why. docs/coming-from-triton.md is written from this table (``mapping_markdown``;
tests/unit/test_triton_flags.py checks that the page matches it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferd.errors import InferdError


class Treatment(enum.Enum):
    SAME = "same"  # inferd's flag has Triton's name
    ALIAS = "alias"  # another name for an inferd flag
    IGNORED = "ignored"  # accepted, does nothing, one log line says so
    REFUSED = "refused"  # the start fails naming the flag


# Triton's boolean values (its ParseBoolOption) and inferd's, each to its canonical word.
_BOOLEANS = {
    "true": "true",
    "1": "true",
    "on": "true",
    "yes": "true",
    "false": "false",
    "0": "false",
    "off": "false",
    "no": "false",
}


@dataclass(frozen=True)
class TritonFlag:
    """One tritonserver flag and what inferd does with it.

    ``target``: the inferd flag (SAME, ALIAS). ``why``: for IGNORED and REFUSED, why that is
    what inferd does; for a converting ALIAS, what the conversion is. ``harmless``: for a REFUSED
    flag, the values it is ignored at instead (Triton's defaults, which change nothing).
    ``convert``: the value as the inferd flag takes it; None from it = nothing to set.
    ``last``: the converted flag goes after every other flag, so that it wins (Triton's
    ``--allow-metrics=false`` whatever ``--metrics-port`` says)."""

    name: str
    treatment: Treatment
    target: str = ""
    why: str = ""
    harmless: tuple[str, ...] = ()
    convert: Callable[[str], str | None] | None = field(default=None, compare=False)
    boolean: bool = False
    takes_value: bool = True
    last: bool = False


class TritonFlagError(InferdError):
    """A Triton flag inferd refuses, or one given a value it cannot take."""


def _same(name: str, **kwargs: Any) -> TritonFlag:
    return TritonFlag(name, Treatment.SAME, target=name, **kwargs)


def _alias(name: str, target: str, **kwargs: Any) -> TritonFlag:
    return TritonFlag(name, Treatment.ALIAS, target=target, **kwargs)


def _ignored(name: str, why: str, **kwargs: Any) -> TritonFlag:
    return TritonFlag(name, Treatment.IGNORED, why=why, **kwargs)


def _refused(name: str, why: str, **kwargs: Any) -> TritonFlag:
    return TritonFlag(name, Treatment.REFUSED, why=why, **kwargs)


def _milliseconds_to_seconds(text: str) -> str:
    try:
        return repr(int(text) / 1000)
    except ValueError:
        raise TritonFlagError(f"not a whole number of milliseconds: {text!r}") from None


def _log_format(text: str) -> str:
    # Triton's formats are two layouts of its text lines; inferd writes JSON or console records.
    return "auto" if text.lower() in ("default", "iso8601") else text


def _metrics_off_unless_allowed(text: str) -> str | None:
    return None if _BOOLEANS.get(text.lower()) == "true" else "off"


_BACKENDS_BUILT_IN = "inferd's backends (onnxruntime, tensorrt, python) are built in"
_NO_SAGEMAKER = "inferd has no SageMaker listener (--allow-sagemaker=true is refused)"
_NO_VERTEX = "inferd has no Vertex AI listener (--allow-vertex-ai=true is refused)"
_OLD_TRACING = (
    "Triton's deprecated tracing flags act only with --trace-level, refused unless OFF; "
    "inferd traces with OpenTelemetry, set by --trace-config"
)
_NO_REUSEPORT = (
    "inferd does not share its ports (no SO_REUSEPORT): a second server on a taken port fails "
    "its start"
)
_COMPLETE_CONFIGS = (
    "inferd completes a config as Triton does by default; a complete config, which Triton "
    "requires with this flag, is used as written"
)
_GRPC_DEFAULT = "inferd keeps gRPC's default, which is Triton's default too"
_NO_HEADER_FORWARDING = "inferd does not forward headers as request parameters"

TRITON_FLAGS: tuple[TritonFlag, ...] = (
    # Server
    _same("--help"),
    _ignored("--id", "the server's name in its metadata is inferd"),
    _same("--exit-timeout-secs"),
    # Logging
    _same("--log-verbose"),
    _ignored("--log-info", "--log-level sets which records are written", boolean=True),
    _ignored("--log-warning", "--log-level sets which records are written", boolean=True),
    _ignored("--log-error", "--log-level sets which records are written", boolean=True),
    _same(
        "--log-format",
        convert=_log_format,
        why="Triton's default and ISO8601 (layouts of its text lines) become auto",
    ),
    _refused(
        "--log-file",
        "inferd logs to stderr: redirect it, or let the container runtime collect it",
    ),
    # Model repository
    _alias("--model-store", "--model-repository"),
    _same("--model-repository"),
    _same("--exit-on-error", boolean=True),
    _ignored("--disable-auto-complete-config", _COMPLETE_CONFIGS, takes_value=False),
    _same("--strict-readiness", boolean=True),
    _same(
        "--model-control-mode",
        convert=str.lower,
        why="the mode's name in any case, as Triton takes it",
    ),
    _same("--repository-poll-secs"),
    _same("--load-model", why="repeated, the models add up, as Triton"),
    _refused(
        "--model-config-name",
        "inferd reads each model's config.pbtxt; another config's name would be ignored and "
        "the model served with the wrong config",
    ),
    _ignored(
        "--model-load-thread-count", "inferd loads models one at a time; only start-up takes longer"
    ),
    _refused("--model-load-retry-count", "inferd tries each load once", harmless=("0",)),
    _refused(
        "--model-namespacing",
        "inferd serves one repository, whose model names are unique",
        harmless=("false",),
        boolean=True,
    ),
    _ignored(
        "--enable-peer-access",
        "inferd does not copy between GPUs itself; ONNX Runtime and TensorRT place each "
        "instance's tensors",
        boolean=True,
    ),
    # HTTP
    _same("--allow-http", boolean=True),
    _alias("--http-address", "--http-host"),
    _same("--http-port"),
    _refused("--reuse-http-port", _NO_REUSEPORT, harmless=("false",), boolean=True),
    _refused("--http-header-forward-pattern", _NO_HEADER_FORWARDING, harmless=("",)),
    _same("--http-thread-count"),
    _refused(
        "--http-restricted-api",
        "inferd's restricted API groups are set by --grpc-restricted-protocol; ignoring this "
        "flag could leave open on HTTP the calls it protects",
    ),
    # gRPC
    _same("--allow-grpc", boolean=True),
    _alias(
        "--grpc-address",
        "--host",
        why="--host is also where the HTTP port (unless --http-address) and metrics listen",
    ),
    _same("--grpc-port"),
    _refused("--reuse-grpc-port", _NO_REUSEPORT, harmless=("false",), boolean=True),
    _refused("--grpc-header-forward-pattern", _NO_HEADER_FORWARDING, harmless=("",)),
    _ignored(
        "--grpc-infer-allocation-pool-size",
        "the size of Triton's pool of reused request objects; inferd's core reuses its own",
    ),
    _same("--grpc-use-ssl", boolean=True),
    _same("--grpc-use-ssl-mutual", boolean=True),
    _same("--grpc-server-cert"),
    _same("--grpc-server-key"),
    _same("--grpc-root-cert"),
    _ignored(
        "--grpc-infer-response-compression-level",
        "responses are sent uncompressed, which every gRPC client reads",
    ),
    _alias(
        "--grpc-keepalive-time",
        "--grpc-keepalive-time-secs",
        convert=_milliseconds_to_seconds,
        why="milliseconds to seconds",
    ),
    _alias(
        "--grpc-keepalive-timeout",
        "--grpc-keepalive-timeout-secs",
        convert=_milliseconds_to_seconds,
        why="milliseconds to seconds",
    ),
    _refused(
        "--grpc-keepalive-permit-without-calls",
        _GRPC_DEFAULT,
        harmless=("false",),
        boolean=True,
    ),
    _refused("--grpc-http2-max-pings-without-data", _GRPC_DEFAULT, harmless=("2",)),
    _refused(
        "--grpc-http2-min-recv-ping-interval-without-data", _GRPC_DEFAULT, harmless=("300000",)
    ),
    _refused("--grpc-http2-max-ping-strikes", _GRPC_DEFAULT, harmless=("2",)),
    _refused(
        "--grpc-max-connection-age",
        "inferd closes idle connections (--grpc-max-connection-idle-secs), not old ones",
    ),
    _refused(
        "--grpc-max-connection-age-grace",
        "inferd closes idle connections (--grpc-max-connection-idle-secs), not old ones",
    ),
    _same("--grpc-restricted-protocol"),
    # SageMaker and Vertex AI
    _refused(
        "--allow-sagemaker",
        "inferd serves no SageMaker endpoints",
        harmless=("false",),
        boolean=True,
    ),
    _ignored("--sagemaker-port", _NO_SAGEMAKER),
    _ignored("--sagemaker-safe-port-range", _NO_SAGEMAKER),
    _ignored("--sagemaker-thread-count", _NO_SAGEMAKER),
    _refused(
        "--allow-vertex-ai",
        "inferd serves no Vertex AI endpoints",
        harmless=("false",),
        boolean=True,
    ),
    _ignored("--vertex-ai-port", _NO_VERTEX),
    _ignored("--vertex-ai-thread-count", _NO_VERTEX),
    _ignored("--vertex-ai-default-model", _NO_VERTEX),
    # Metrics
    _alias(
        "--allow-metrics",
        "--metrics-port",
        convert=_metrics_off_unless_allowed,
        why="false is --metrics-port off, whatever --metrics-port says; true changes nothing",
        boolean=True,
        last=True,
    ),
    _ignored(
        "--allow-gpu-metrics",
        "inferd exports GPU metrics wherever NVML (nvidia-ml-py) finds a GPU",
        boolean=True,
    ),
    _ignored("--allow-cpu-metrics", "inferd always exports the host's metrics", boolean=True),
    _refused(
        "--metrics-address",
        "metrics listen on --host; ignoring it could open them on more addresses than asked",
    ),
    _same("--metrics-port"),
    _ignored(
        "--metrics-interval-ms",
        "inferd reads its counters when /metrics is scraped, not on a timer",
    ),
    _ignored(
        "--metrics-config",
        "inferd exports a fixed set of metric families (Triton's default ones)",
    ),
    # Tracing
    _same(
        "--trace-config",
        why="inferd's OpenTelemetry syntax (endpoint=, sampler=, sampler_arg=); Triton's "
        "mode,setting=value form fails the start naming the setting",
    ),
    # Backends, repository agents, response cache
    _ignored("--backend-directory", _BACKENDS_BUILT_IN),
    _refused(
        "--backend-config",
        "inferd's backends take their settings from its own flags and each model's parameters",
    ),
    _ignored(
        "--repoagent-directory",
        "inferd has no repository agents; a config naming one fails its load, naming the field",
    ),
    _same(
        "--cache-config",
        why="the local cache (local,size=BYTES); Triton's redis cache fails the start",
    ),
    _ignored("--cache-directory", "inferd's local response cache is built in, not loaded"),
    # Rate limiter
    _refused("--rate-limit", "inferd has no rate limiter yet", harmless=("off",)),
    _ignored("--rate-limit-resource", "used only by --rate-limit, refused unless off"),
    # Memory and devices
    _same("--pinned-memory-pool-byte-size"),
    _ignored(
        "--cuda-memory-pool-byte-size",
        "ONNX Runtime and TensorRT allocate GPU memory with their own allocators",
    ),
    _ignored(
        "--cuda-virtual-address-size",
        "sizes Triton's growable implicit state on a GPU; inferd keeps implicit state in host "
        "memory, bounded by --max-sequence-state-bytes",
    ),
    _ignored(
        "--min-supported-compute-capability",
        "inferd uses the GPUs ONNX Runtime and TensorRT can run on",
    ),
    _ignored(
        "--buffer-manager-thread-count",
        "inferd's core copies tensors on the threads that serve the requests",
    ),
    _ignored("--host-policy", "inferd does not pin its threads or memory to NUMA nodes or cores"),
    _refused(
        "--model-load-gpu-limit",
        "inferd has no GPU memory limit on loads: ignoring it could let a load run the GPU out "
        "of memory",
    ),
    # Deprecated
    _ignored("--strict-model-config", _COMPLETE_CONFIGS, boolean=True),
    _alias(
        "--response-cache-byte-size",
        "--cache-config",
        why="N becomes local,size=N",
        convert=lambda value: f"local,size={value}",
    ),
    _ignored("--trace-file", _OLD_TRACING),
    _refused(
        "--trace-level",
        "Triton's deprecated tracing; inferd traces with OpenTelemetry, set by --trace-config",
        harmless=("off",),
    ),
    _ignored("--trace-rate", _OLD_TRACING),
    _ignored("--trace-count", _OLD_TRACING),
    _ignored("--trace-log-frequency", _OLD_TRACING),
)

BY_NAME = {flag.name: flag for flag in TRITON_FLAGS}
# Triton repeats these; inferd takes one repository, and its models as one list.
_REPOSITORY_FLAGS = ("--model-repository", "--model-store")
_LOAD_MODEL = "--load-model"


@dataclass
class Translated:
    """A command line with Triton's flags turned into inferd's: ``args`` for inferd's parser,
    and one ``ignored`` entry (the flag as given, why) per flag dropped."""

    args: list[str]
    ignored: list[tuple[str, str]]


def _canonical(flag: TritonFlag, value: str) -> str:
    """A value as ``harmless`` lists it: booleans as true or false, the rest lower case."""
    if flag.boolean:
        return _BOOLEANS.get(value.lower(), value.lower())
    return value.lower()


def _passes_unchanged(flag: TritonFlag | None) -> bool:
    """Whether inferd's own parser takes the flag as it is (with its value, if any)."""
    if flag is None:  # inferd's own flag, or a mistake its parser reports
        return True
    collected = flag.name in (*_REPOSITORY_FLAGS, _LOAD_MODEL)
    return flag.treatment is Treatment.SAME and flag.convert is None and not collected


def translate(args: list[str]) -> Translated:
    """``inferd serve``'s arguments with Triton's flags turned into inferd's. Flags the table
    does not name pass unchanged, for inferd's parser to take or refuse. Raises TritonFlagError
    for a refused flag, a second repository or a missing value."""
    out: list[str] = []
    at_end: list[str] = []  # flags that win over the rest (TritonFlag.last)
    ignored: list[tuple[str, str]] = []
    models: list[str] = []
    repositories: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            out.extend(args[i - 1 :])
            break
        name, has_value, value = token.partition("=")
        flag = BY_NAME.get(name)
        if flag is None or _passes_unchanged(flag):
            out.append(token)
            continue
        if flag.takes_value and not has_value:
            if flag.boolean:
                # Triton's booleans take a value; inferd's may stand alone (true).
                if i < len(args) and args[i].lower() in _BOOLEANS:
                    value, i = args[i], i + 1
                else:
                    value = "true"
            elif i < len(args):
                value, i = args[i], i + 1
            else:
                raise TritonFlagError(f"{name} needs a value")
        if name in _REPOSITORY_FLAGS:
            repositories.append(name)
            if len(repositories) > 1:
                raise TritonFlagError(
                    f"{' and '.join(repositories)}: inferd serves one model repository, not "
                    "Triton's several"
                )
        if name == _LOAD_MODEL:
            models.append(value)
        elif flag.treatment is Treatment.IGNORED:
            ignored.append(
                (token if has_value or not flag.takes_value else f"{name} {value}", flag.why)
            )
        elif flag.treatment is Treatment.REFUSED:
            if _canonical(flag, value) not in flag.harmless:
                raise TritonFlagError(_refusal(flag, value))
            ignored.append(
                (f"{name}={value}", f"Triton's default, which changes nothing: {flag.why}")
            )
        else:
            converted = value if flag.convert is None else flag.convert(value)
            if converted is not None:
                (at_end if flag.last else out).append(f"{flag.target}={converted}")
    if models:  # Triton's repeated --load-model, as inferd's comma-separated list
        out.append(f"{_LOAD_MODEL}={','.join(models)}")
    return Translated(out + at_end, ignored)


_EMPTY = "''"


def _refusal(flag: TritonFlag, value: str) -> str:
    if not flag.harmless:
        return f"Triton's {flag.name} is not supported: {flag.why}"
    return (
        f"Triton's {flag.name}={value} is not supported: {flag.why} (only "
        f"{flag.name}={flag.harmless[0] or _EMPTY} is accepted, and ignored)"
    )


MAPPING_HEADER = "| Triton flag | in inferd |"


def mapping_markdown() -> str:
    """The table of docs/coming-from-triton.md: one row per Triton flag, in --help's order."""
    rows = [MAPPING_HEADER, "| --- | --- |"]
    for flag in TRITON_FLAGS:
        rows.append(f"| `{flag.name}` | {_described(flag)} |")
    return "\n".join(rows) + "\n"


def _described(flag: TritonFlag) -> str:
    note = f": {flag.why}" if flag.why else ""
    if flag.treatment is Treatment.SAME:
        return f"the same flag{note}"
    if flag.treatment is Treatment.ALIAS:
        return f"`{flag.target}`{note}"
    if flag.treatment is Treatment.IGNORED:
        return f"ignored{note}"
    if flag.harmless:
        accepted = f"`{flag.name}={flag.harmless[0] or _EMPTY}`"
        return f"ignored as {accepted} (Triton's default); refused otherwise{note}"
    return f"refused{note}"


if __name__ == "__main__":  # the table of docs/coming-from-triton.md
    print(mapping_markdown(), end="")
