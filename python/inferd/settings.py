"""Every server setting, declared once: the flag (``--grpc-port``), the environment variable
(``INFERD_GRPC_PORT``), the default and the help text all come from the fields below."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

# The sections settings are grouped in, in this order, by ``inferd serve --help`` and by
# docs/settings.md (tests/unit/test_readme_claims.py checks that both group them as here).
MODELS = "Models"
LISTENERS = "Listeners"
CONNECTIONS = "Connections and request limits"
SECURITY = "Security"
SHARED_MEMORY = "Shared memory"
EXECUTION = "Execution and shutdown"
OBSERVABILITY = "Observability"
SECTIONS = (MODELS, LISTENERS, CONNECTIONS, SECURITY, SHARED_MEMORY, EXECUTION, OBSERVABILITY)


def _help(section: str, text: str, choices: tuple[str, ...] = ()) -> dict[str, object]:
    """A field's section (one of ``SECTIONS``), its help text and, for an enumerated setting,
    its allowed values (``--help`` lists them; the flag refuses others)."""
    return {"section": section, "help": text, "choices": choices}


@dataclass(frozen=True)
class ServerSettings:
    model_repository: Path = field(
        default=Path("models"), metadata=_help(MODELS, "Folder of models in the Triton layout.")
    )
    exit_on_error: bool = field(
        default=True,
        metadata=_help(
            MODELS,
            "A model that fails to load at start stops the server (exit status 2), as Triton; "
            "false: the server runs on without it, not ready while --strict-readiness holds.",
        ),
    )
    host: str = field(
        default="0.0.0.0",
        metadata=_help(
            LISTENERS,
            "Address the gRPC port binds to, and the HTTP and metrics ports unless --http-host "
            "says otherwise.",
        ),
    )
    grpc_port: int = field(
        default=8001,
        metadata=_help(
            LISTENERS, "gRPC TCP port (0 picks a free one; -1 or off = no TCP listener)."
        ),
    )
    grpc_unix_socket: str = field(
        default="",
        metadata=_help(
            LISTENERS,
            "Also listen on this Unix socket (PATH or unix:PATH, for sidecars); empty = none.",
        ),
    )
    grpc_unix_socket_mode: str = field(
        default="0660",
        metadata=_help(
            LISTENERS,
            "Octal permissions of --grpc-unix-socket's file (connecting needs write permission).",
        ),
    )
    grpc_unix_socket_group: str = field(
        default="",
        metadata=_help(
            LISTENERS,
            "Group (name or gid) of --grpc-unix-socket's file, for clients running as another "
            "user; empty = the server's group.",
        ),
    )
    allow_grpc: bool = field(
        default=True,
        metadata=_help(
            LISTENERS,
            "Serve gRPC (Triton's --allow-grpc); false: no gRPC listener at all, TCP or Unix "
            "socket, whatever --grpc-port and --grpc-unix-socket say.",
        ),
    )
    http_port: int = field(
        default=8000,
        metadata=_help(
            LISTENERS,
            "HTTP/REST TCP port (0 picks a free one; -1 or off = no HTTP TCP listener).",
        ),
    )
    http_host: str = field(
        default="",
        metadata=_help(LISTENERS, "Address the HTTP port binds to; empty = the same as --host."),
    )
    http_unix_socket: str = field(
        default="",
        metadata=_help(
            LISTENERS,
            "Also serve HTTP on this Unix socket (PATH or unix:PATH, for sidecars); empty = none.",
        ),
    )
    http_unix_socket_mode: str = field(
        default="0660",
        metadata=_help(
            LISTENERS,
            "Octal permissions of --http-unix-socket's file (connecting needs write permission).",
        ),
    )
    http_unix_socket_group: str = field(
        default="",
        metadata=_help(
            LISTENERS,
            "Group (name or gid) of --http-unix-socket's file, for clients running as another "
            "user; empty = the server's group.",
        ),
    )
    allow_http: bool = field(
        default=True,
        metadata=_help(
            LISTENERS,
            "Serve HTTP/REST (Triton's --allow-http); false: no HTTP listener at all, TCP or "
            "Unix socket, whatever --http-port and --http-unix-socket say.",
        ),
    )
    grpc_max_message_bytes: int = field(
        default=2**31 - 1,
        metadata=_help(
            CONNECTIONS, "Largest request or response, as Triton (gRPC's default is 4 MiB)."
        ),
    )
    grpc_keepalive_time_secs: float = field(
        default=0.0,
        metadata=_help(
            CONNECTIONS,
            "Seconds of inactivity after which the server pings a connection; 0 = gRPC's "
            "default (2 hours).",
        ),
    )
    grpc_keepalive_timeout_secs: float = field(
        default=0.0,
        metadata=_help(
            CONNECTIONS,
            "Seconds to wait for a keepalive ping's answer before closing; 0 = gRPC's "
            "default (20).",
        ),
    )
    grpc_max_concurrent_streams: int = field(
        default=0,
        metadata=_help(
            CONNECTIONS, "Calls in flight per client connection; more wait. 0 = no limit."
        ),
    )
    stream_max_outstanding: int = field(
        default=1024,
        metadata=_help(
            CONNECTIONS,
            "Requests one ModelStreamInfer call may have read and not yet answered and sent; past "
            "it the server stops reading the stream (gRPC's flow control holds the client back).",
        ),
    )
    stream_max_pending_bytes: int = field(
        default=64 << 20,
        metadata=_help(
            CONNECTIONS,
            "Bytes of answers one ModelStreamInfer call may hold waiting to be sent (a client that "
            "does not read; a decoupled model that sends faster than the client reads); past it "
            "the answer's request fails RESOURCE_EXHAUSTED and is cancelled. The first waiting "
            "answer always fits. 0 = no limit per call (--max-inflight-bytes still bounds it).",
        ),
    )
    max_inflight_bytes: int = field(
        default=2**31,
        metadata=_help(
            CONNECTIONS,
            "Bytes of inference requests received and not yet answered, and of streamed answers "
            "waiting to be sent, all clients together; a request past it is answered "
            "RESOURCE_EXHAUSTED at once, and so is a streamed answer's request. 0 = no limit.",
        ),
    )
    grpc_max_connection_idle_secs: float = field(
        default=300.0,
        metadata=_help(
            CONNECTIONS,
            "Seconds a client connection may stay without a call before the server closes it, "
            "so idle clients cannot hold the file descriptors new ones need; 0 = never.",
        ),
    )
    http_thread_count: int = field(
        default=0,
        metadata=_help(
            CONNECTIONS,
            "Threads serving HTTP connections (Triton's --http-thread-count); 0 = one per core, "
            "at most 8.",
        ),
    )
    http_header_timeout_secs: float = field(
        default=10.0,
        metadata=_help(
            CONNECTIONS,
            "Seconds a request's headers may take to arrive; past it the connection is closed "
            "(a slow-loris client cannot hold it).",
        ),
    )
    http_idle_timeout_secs: float = field(
        default=60.0,
        metadata=_help(
            CONNECTIONS,
            "Seconds a keep-alive HTTP connection may stay without a request before the server "
            "closes it.",
        ),
    )
    http_max_connections: int = field(
        default=1024,
        metadata=_help(
            CONNECTIONS,
            "HTTP connections open at once, all clients together; one past it is answered 429 "
            "and closed before it is read.",
        ),
    )
    http_max_header_bytes: int = field(
        default=65536,
        metadata=_help(CONNECTIONS, "Bytes of one HTTP request's request line and headers."),
    )
    http_max_body_bytes: int = field(
        default=2**31 - 1,
        metadata=_help(
            CONNECTIONS,
            "Bytes of one HTTP request's body as received (before decompression); it also "
            "counts against --max-inflight-bytes.",
        ),
    )
    http_max_decompressed_bytes: int = field(
        default=2**31 - 1,
        metadata=_help(
            CONNECTIONS, "Bytes a gzip or deflate HTTP body may inflate to (a zip bomb's bound)."
        ),
    )
    http_max_json_depth: int = field(
        default=64,
        metadata=_help(CONNECTIONS, "Nesting depth of an HTTP request's JSON (objects, arrays)."),
    )
    http_max_chunks: int = field(
        default=65536,
        metadata=_help(CONNECTIONS, "Chunks of one chunked HTTP request body."),
    )
    grpc_use_ssl: bool = field(
        default=False,
        metadata=_help(
            SECURITY,
            "Serve TLS on the gRPC port, with --grpc-server-cert and --grpc-server-key (as "
            "Triton). The Unix socket stays plaintext (local; the file's permissions guard it).",
        ),
    )
    grpc_use_ssl_mutual: bool = field(
        default=False,
        metadata=_help(
            SECURITY,
            "Mutual TLS (implies --grpc-use-ssl): clients must present a certificate signed by a "
            "CA of --grpc-root-cert.",
        ),
    )
    grpc_server_cert: str = field(
        default="", metadata=_help(SECURITY, "PEM file: the gRPC port's TLS certificate (chain).")
    )
    grpc_server_key: str = field(
        default="", metadata=_help(SECURITY, "PEM file: the private key of --grpc-server-cert.")
    )
    grpc_root_cert: str = field(
        default="",
        metadata=_help(
            SECURITY, "PEM file: the CA certificates client certificates must be signed by."
        ),
    )
    grpc_restricted_protocol: tuple[str, ...] = field(
        default=(),
        metadata=_help(
            SECURITY,
            "GROUPS:KEY=VALUE (repeatable; INFERD_GRPC_RESTRICTED_PROTOCOL: ';' between them): "
            "calls of the comma-separated API groups (health, metadata, inference, shared-memory, "
            "model-config, model-repository, statistics, trace, logging) must carry the header "
            "triton-grpc-protocol-KEY: VALUE, as Triton. VALUE @PATH: the file's first line; "
            "VALUE env:NAME: the environment variable's value.",
        ),
    )
    grpc_control_on_tcp: bool = field(
        default=False,
        metadata=_help(
            SECURITY,
            "Answer the control calls (RepositoryModelLoad/Unload, LogSettings) on the gRPC port "
            "too; otherwise only on --grpc-unix-socket, or on the port where "
            "--grpc-restricted-protocol protects their group.",
        ),
    )
    shared_memory: str = field(
        default="all",
        metadata=_help(
            SHARED_MEMORY,
            "Which of Triton's shared-memory extensions clients may use: system (POSIX objects), "
            "cuda (CUDA IPC handles), all (as Triton) or none (their calls answer UNIMPLEMENTED).",
            choices=("none", "system", "cuda", "all"),
        ),
    )
    shared_memory_listeners: str = field(
        default="unix",
        metadata=_help(
            SHARED_MEMORY,
            "Where shared memory (its calls and requests naming a region) is served: unix = only "
            "on --grpc-unix-socket, since a region is the client's memory on this machine; all = "
            "on the gRPC port too.",
            choices=("unix", "all"),
        ),
    )
    shared_memory_max_regions: int = field(
        default=1024,
        metadata=_help(
            SHARED_MEMORY,
            "Shared-memory regions registered at once, both kinds together; a register past it "
            "is answered RESOURCE_EXHAUSTED.",
        ),
    )
    shared_memory_max_bytes: int = field(
        default=64 * 2**30,
        metadata=_help(
            SHARED_MEMORY,
            "Bytes of shared-memory regions registered at once, both kinds together; a register "
            "past it is answered RESOURCE_EXHAUSTED.",
        ),
    )
    model_control_mode: str = field(
        default="none",
        metadata=_help(
            MODELS,
            "none: load every model at start, refuse load/unload requests; explicit: load only "
            "--load-model at start, then as RepositoryModelLoad/Unload ask; poll: load every "
            "model, then follow the repository's changes every --repository-poll-secs.",
            choices=("none", "explicit", "poll"),
        ),
    )
    load_model: str = field(
        default="",
        metadata=_help(
            MODELS, "Comma-separated models to load at start in explicit mode ('*' = all)."
        ),
    )
    strict_readiness: bool = field(
        default=True,
        metadata=_help(
            MODELS,
            "ServerReady (and health '' and inference.GRPCInferenceService) only while every "
            "model that should serve does, as Triton; a model whose config sets parameter "
            "inferd.readiness to optional never holds it back. false: ready once the server "
            "accepts calls, whatever its models' states.",
        ),
    )
    ready_without_models: bool = field(
        default=False,
        metadata=_help(
            MODELS,
            "Ready even when no model serves (an empty repository, explicit mode before a load); "
            "otherwise such a server is not ready, so a fleet sends it no traffic.",
        ),
    )
    repository_poll_secs: float = field(
        default=15.0, metadata=_help(MODELS, "Poll mode: seconds between scans of the repository.")
    )
    max_config_override_bytes: int = field(
        default=1024 * 1024,
        metadata=_help(
            MODELS, "Largest config a RepositoryModelLoad request may give (bytes of JSON)."
        ),
    )
    max_instance_count: int = field(
        default=16,
        metadata=_help(
            MODELS, "Most executor instances a model version may have (all its groups)."
        ),
    )
    max_warmup_count: int = field(
        default=1000,
        metadata=_help(MODELS, "Most runs one model_warmup sample may ask for (count)."),
    )
    max_warmup_bytes: int = field(
        default=256 * 1024 * 1024,
        metadata=_help(
            MODELS, "Most bytes the warm-up inputs of a model version may take together."
        ),
    )
    warmup_timeout_secs: float = field(
        default=120.0,
        metadata=_help(
            MODELS,
            "Longest a model version's warm-up may run (every sample on every instance); "
            "past it the load fails.",
        ),
    )
    default_max_batch_size: int = field(
        default=4,
        metadata=_help(
            MODELS,
            "max_batch_size of a model without config inputs/outputs whose tensors all have "
            "a dynamic first dim (Triton's ONNX Runtime default).",
        ),
    )
    intra_op_thread_count: int = field(
        default=0,
        metadata=_help(
            EXECUTION,
            "ONNX Runtime threads per session unless the model's parameters say; "
            "0 = one per core, less one for the gRPC front end.",
        ),
    )
    inter_op_thread_count: int = field(
        default=1,
        metadata=_help(
            EXECUTION, "ONNX Runtime inter-op threads per session unless the model's parameters say"
        ),
    )
    pinned_memory_pool_byte_size: int = field(
        default=256 * 1024 * 1024,
        metadata=_help(
            EXECUTION,
            "Bytes of reusable host buffers (pinned when CUDA is present) that batches are "
            "assembled in; past it, batches use ordinary memory (Triton's flag and default).",
        ),
    )
    max_sequence_state_bytes: int = field(
        default=1 << 30,
        metadata=_help(
            EXECUTION,
            "Bytes that stateful models' implicit state (sequence_batching.state) may hold, "
            "every sequence of every model together; a new sequence past it, or a state "
            "growing past it, is refused RESOURCE_EXHAUSTED.",
        ),
    )
    cache_config: str = field(
        default="",
        metadata=_help(
            EXECUTION,
            "Triton's response cache: local,size=BYTES keeps successful answers of the models "
            "whose config says response_cache { enable: true }, least recently used out first; "
            "empty or size 0 = no cache.",
        ),
    )
    exit_timeout_secs: float = field(
        default=30.0,
        metadata=_help(
            EXECUTION,
            "On shutdown, how long in-flight requests may take before the stop; on an unload, "
            "how long a python model's running batch may take before its worker is killed.",
        ),
    )
    log_format: str = field(
        default="auto",
        metadata=_help(
            OBSERVABILITY,
            "auto (console on a terminal, else JSON), json or console.",
            choices=("auto", "json", "console"),
        ),
    )
    log_level: str = field(
        default="info",
        metadata=_help(
            OBSERVABILITY,
            "debug, info, warning or error.",
            choices=("debug", "info", "warning", "error"),
        ),
    )
    log_verbose: int = field(
        default=0,
        metadata=_help(
            OBSERVABILITY,
            "1 or more: a log line for every request (LogSettings log_verbose_level).",
        ),
    )
    metrics_port: int = field(
        default=8002,
        metadata=_help(
            OBSERVABILITY,
            "Prometheus /metrics port on --host (0 picks a free one, -1 or off = none).",
        ),
    )
    trace_config: str = field(
        default="",
        metadata=_help(
            OBSERVABILITY,
            "Tracing: comma-separated endpoint=HOST:PORT (OTLP/gRPC), sampler=NAME, "
            "sampler_arg=VALUE. Empty: the standard OTEL_* environment variables decide; "
            "tracing is off unless they name an exporter or endpoint.",
        ),
    )


def setting_fields() -> list[dataclasses.Field[object]]:
    return list(dataclasses.fields(ServerSettings))


def section_fields(section: str) -> list[dataclasses.Field[object]]:
    """The settings of one of ``SECTIONS``, in declaration order."""
    return [f for f in setting_fields() if f.metadata["section"] == section]
