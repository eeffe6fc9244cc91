"""What crosses between the server and a python-backend model instance's worker: how the
worker is started (``WorkerSpec``: the instance and Triton's initialize arguments), a batch's
requests and their answers (``PythonRequest``, ``PythonResponse``), and the errors a worker's
start or end raises. ``inferd.python_backend.process`` carries them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy.typing as npt

from inferd import errors


class WorkerDied(errors.Internal):
    """The worker process ended while the server waited on it."""


class WorkerStartFailed(errors.ModelLoadError):
    """The worker could not be started, or the model's initialize failed."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is started with: the model instance and Triton's initialize arguments."""

    model_name: str
    model_version: int
    instance_name: str  # e.g. "add_sub_0": unique per instance, shown by `ps`
    model_file: Path  # <repository>/<model>/<version>/model.py
    model_config_json: str  # the model's config as Triton's JSON form (args["model_config"])
    model_repository: Path  # Triton passes the model's directory under this name
    instance_kind: str = "CPU"  # "CPU", "GPU" or "MODEL", as Triton's model_instance_kind
    device_id: int = 0
    # A virtualenv directory (parameters EXECUTION_ENV_PATH): the worker runs <env>/bin/python.
    execution_env: Path | None = None
    # A stateful model's control inputs (sequence_batching), after the config's inputs: (name,
    # datatype code) each; the core writes them into every request.
    controls: tuple[tuple[str, int], ...] = ()

    def initialize_args(self) -> dict[str, str]:
        """``initialize(args)``'s argument: Triton's keys, every value a string."""
        return {
            "model_config": self.model_config_json,
            "model_instance_kind": self.instance_kind,
            "model_instance_name": self.instance_name,
            "model_instance_device_id": str(self.device_id),
            "model_repository": str(self.model_repository),
            "model_version": str(self.model_version),
            "model_name": self.model_name,
        }

    @property
    def decoupled(self) -> bool:
        """Whether the config says ``model_transaction_policy { decoupled: true }``."""
        config = json.loads(self.model_config_json)
        return bool(config.get("model_transaction_policy", {}).get("decoupled", False))

    def describe(self) -> str:
        return (
            f"python model '{self.model_name}' version {self.model_version} "
            f"instance '{self.instance_name}'"
        )


@dataclass
class PythonRequest:
    """One request of a batch, as the worker's ``execute`` will see it."""

    request_id: str
    inputs: dict[str, npt.NDArray[Any]]  # BYTES inputs as object arrays of bytes
    requested_output_names: list[str] = field(default_factory=list)  # empty: every output
    parameters: str = "{}"  # the request's own parameters, a JSON object (request.parameters())
    correlation_id: int | str = 0
    flags: int = 0
    timeout_us: int = 0
    # Whether the request was cancelled while it runs (its client went away, or its deadline
    # passed): the model asks through request.is_cancelled().
    cancelled: Callable[[], bool] | None = None


@dataclass
class PythonResponse:
    """One request's answer: its outputs (owned copies), or the error that failed it."""

    outputs: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    error: str | None = None
    cancelled: bool = (
        False  # the error is the request's cancellation (or deadline), not the model's
    )
    worker_gone: bool = False  # the error is the worker's end, not the model's answer


# A decoupled request's streamed response, as the worker sent it: request index, response.
Respond = Callable[[int, PythonResponse], None]
