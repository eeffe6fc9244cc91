"""What the core needs from an executor: the protocols its schedulers run model instances through.

They live beside the scheduler that calls them, so that the executors (which use the core's CUDA
streams and buffer pools) depend on the batching layer and never the other way round.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

import inferd._core as _core

# What a decoupled executor's execute_requests returns for a request it goes on answering.
PENDING = _core.PENDING
RESCHEDULED = _core.RESCHEDULED
DecoupledResponses = _core.DecoupledResponses


class Executor(Protocol):
    """One model instance. The core calls ``execute`` from one worker thread at a time.

    ``inputs`` come in the config's input order, batch along dim 0 when the model batches; BYTES
    inputs are object arrays of ``bytes``, BF16 inputs uint16 arrays of raw bits, and an optional
    input the batch's requests left out is None. The result is
    every output in the config's output order, as arrays of the declared types (BYTES: object
    arrays of ``bytes`` or ``str``; BF16: uint16). Raise an ``inferd.errors`` error to answer the
    batch with its code; anything else becomes INTERNAL. Release the GIL while computing.
    """

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]: ...

    def close(self) -> None:
        """Free the instance's resources. Called once, after the last ``execute``."""


class StagingExecutor(Executor, Protocol):
    """An executor whose batches are pipelined: the core's stager thread calls ``stage`` with a
    batch's inputs (as ``execute`` takes them) one batch ahead of ``execute``, in the order the
    batches are then executed, so the input copies of the next batch overlap this one's compute.
    An error raised by ``stage`` answers that batch, which is then not executed.

    Optional: the core looks the method up once per instance (``hasattr``), so an executor that
    has nothing to stage (a CPU instance) defines no ``stage`` and costs nothing for it.
    """

    def stage(self, inputs: list[np.ndarray | None]) -> None: ...


class RequestAnsweringExecutor(Executor, Protocol):
    """An executor whose model answers each request of a batch on its own (Triton's python
    backend: ``execute(requests)`` returns one response per request, any of which may be an
    error). The core calls ``execute_requests`` instead of ``execute`` with the batch's requests,
    each a list of its inputs (as ``execute`` takes them, with the request's own batch dim), and
    answers each request with its item of the result: its outputs (as ``execute`` returns them),
    or the exception that fails that request alone (an ``inferd.errors`` error answers with its
    code). Raising fails the whole batch; nothing is re-run in halves.

    Optional, looked up once per instance as ``stage`` is.
    """

    def execute_requests(
        self, requests: list[list[np.ndarray | None]]
    ) -> list[list[np.ndarray] | BaseException]: ...


class DecoupledExecutor(Executor, Protocol):
    """An executor whose model is decoupled (``model_transaction_policy { decoupled: true }``):
    any number of responses per request, then a final flag. ``decoupled`` is a true attribute,
    read once per instance; the core then calls ``execute_requests(requests, respond)`` (requests
    as for ``RequestAnsweringExecutor``), where ``respond(index, answer)`` sends request ``index``
    of the batch one more response that is not its last, as it goes: ``answer`` is its outputs
    (as ``execute`` returns them) or an exception for an error response, after which the request
    goes on. ``respond`` raises TypeError or ValueError for a malformed answer and IndexError for
    an index outside the batch; it returns whether the request was still open (False once it
    ended: the answer is dropped). The list returned gives each request's final answer: its
    outputs (a last response), an exception (a last error), None (the final flag alone), or
    ``PENDING``: the request goes on after ``execute_requests`` returns, and the instance takes its
    next batch meanwhile (Triton's python backend lets ``execute`` return before a model's own
    thread sends). ``RESCHEDULED`` (any executor answering each request): the model gave the
    request back for another step (an iterative model's), unanswered. A PENDING request's later
    responses and its final answer (``respond.finish(index, answer)``, None for the flag alone)
    come through ``respond``, from any thread; requests still open when
    ``respond`` is dropped fail INTERNAL. Raising fails the whole batch. ``respond`` takes the
    GIL's holder's answer and releases the GIL while it hands it to the core.

    The core's transport answers such a model on ModelStreamInfer only (each response as it
    comes; ModelInfer answers UNIMPLEMENTED); a request answered through the completion queue
    (the Python path) gets its final answer only.
    """

    decoupled: bool

    def execute_requests(
        self,
        requests: list[list[np.ndarray | None]],
        respond: DecoupledResponses,
    ) -> list[list[np.ndarray] | BaseException | object | None]: ...
