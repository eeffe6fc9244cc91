"""Every server setting, declared once: flag name, environment variable (INFERD_<NAME>), default
and help all come from the fields below."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path


def _setting(default: object, help: str) -> object:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServerSettings:
    model_repository: Path = _setting(Path("models"), "Folder of models in the Triton layout.")  # type: ignore[assignment]
    host: str = _setting("0.0.0.0", "Address the gRPC server binds to.")  # type: ignore[assignment]
    grpc_port: int = _setting(8001, "gRPC port (0 picks a free one).")  # type: ignore[assignment]
    grpc_unix_socket: str = _setting(
        "", "Also listen on this Unix socket path (for sidecars); empty = no socket."
    )  # type: ignore[assignment]
    grpc_max_message_bytes: int = _setting(
        2**31 - 1, "Largest request or response message, as Triton (gRPC's default is 4 MiB)."
    )  # type: ignore[assignment]
    default_max_batch_size: int = _setting(
        4, "max_batch_size given to a model without one whose tensors all have a dynamic first dim."
    )  # type: ignore[assignment]
    intra_op_thread_count: int = _setting(
        0, "ONNX Runtime threads per session unless the model's parameters say; 0 = one per core."
    )  # type: ignore[assignment]
    inter_op_thread_count: int = _setting(
        1, "ONNX Runtime inter-op threads per session unless the model's parameters say."
    )  # type: ignore[assignment]
    exit_timeout_secs: float = _setting(
        30.0, "On shutdown, how long in-flight requests may take before the server stops anyway."
    )  # type: ignore[assignment]
    log_format: str = _setting("auto", "auto (console on a terminal, else JSON), json or console.")  # type: ignore[assignment]
    log_level: str = _setting("info", "debug, info, warning or error.")  # type: ignore[assignment]

    def replace(self, **changes: object) -> ServerSettings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def setting_fields() -> list[dataclasses.Field[object]]:
    return list(dataclasses.fields(ServerSettings))
