"""Transport-neutral inference requests and responses: what the data plane speaks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ParameterValue = bool | int | float | str


@dataclass(frozen=True)
class Tensor:
    """A named tensor. ``data`` is its raw little-endian contents, row-major; BYTES serialized.

    Inputs hold what the client sent (bytes, or an array made from typed contents); outputs hold
    the read-only arrays the core returned, viewed without a copy.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes | np.ndarray


@dataclass(frozen=True)
class InferRequest:
    model_name: str
    model_version: str  # "" = the server picks the version
    id: str
    inputs: list[Tensor]
    outputs: list[str]  # requested output names, in response order; empty = every output
    parameters: dict[str, ParameterValue] = field(default_factory=dict)


@dataclass(frozen=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
