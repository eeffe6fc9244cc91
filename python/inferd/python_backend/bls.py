"""Model-to-model calls from python models (Triton's Business Logic Scripting).

A worker's ``InferenceRequest.exec`` reaches the server as a ``ModelCall``, which the server's
``ModelCaller`` runs (``inferd.transport.bls``: as a ModelInferRequest through the data plane,
exactly as a client's request arrives - the named model and version, the core's checks of every
tensor, the model's scheduler and batcher - without gRPC). The answer's tensors go back to the
worker.

Cycles: each call carries the chain of python models whose calls led to it (the request
parameter ``CALL_CHAIN_PARAMETER``, a JSON list, which the called model's ``parameters()`` does
not show). A call to a model already in its chain (A -> B -> A) would wait behind a batch that
waits on it, so it is refused, naming the chain. A call without a timeout of its own gets
``DEFAULT_CALL_TIMEOUT_S``; either way it is cancelled once every request of the calling batch
was cancelled or passed its deadline.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy.typing as npt

ModelOutputs = dict[str, npt.NDArray[Any]]

# The request parameter carrying a BLS call's chain of calling models (a JSON list of names).
CALL_CHAIN_PARAMETER: Final = "inferd_bls_chain"
# A call whose model set no timeout (InferenceRequest(timeout=...), in microseconds) has this.
DEFAULT_CALL_TIMEOUT_S: Final = 60.0


@dataclass
class ModelCall:
    """One BLS request, as the calling model built it."""

    model: str
    version: int  # -1: the highest ready version
    inputs: dict[str, npt.NDArray[Any]]  # BYTES inputs as object arrays of bytes or str
    requested_output_names: list[str] = field(default_factory=list)  # empty: every output
    request_id: str = ""
    parameters: str = "{}"  # a JSON object of bool, int and str values
    timeout_us: int = 0  # 0: DEFAULT_CALL_TIMEOUT_S
    chain: tuple[str, ...] = ()  # the calling models, first caller first, the caller last


def call_chain(chains: Sequence[Sequence[str]], caller: str) -> tuple[str, ...]:
    """The chain a call made by model ``caller`` from a batch whose requests had ``chains``
    carries: every model that led to a request of the batch (any of them may wait on this
    batch), then the caller."""
    seen = [model for chain in chains for model in chain]
    return (*dict.fromkeys(seen), caller)


def split_chain(parameters: str) -> tuple[tuple[str, ...], str]:
    """A request's call chain and its parameters without it (the model does not see it). A
    chain that is not a JSON list of names (a client's own parameter) counts as none."""
    if CALL_CHAIN_PARAMETER not in parameters:  # a client's request: no JSON to read
        return (), parameters
    try:
        decoded = json.loads(parameters)
    except json.JSONDecodeError:
        return (), parameters
    if not isinstance(decoded, dict) or CALL_CHAIN_PARAMETER not in decoded:
        return (), parameters
    raw = decoded.pop(CALL_CHAIN_PARAMETER)
    try:
        names = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        names = []
    return tuple(names), json.dumps(decoded)


class ModelCaller(Protocol):
    """Runs BLS calls; thread-safe, never blocks the caller for the computation."""

    def submit(self, call: ModelCall) -> concurrent.futures.Future[ModelOutputs]: ...
