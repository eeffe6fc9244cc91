"""Submitting requests to the core's schedulers and completing them on the asyncio loop.

The core answers on one ``CompletionQueue`` whose eventfd the event loop watches; one wake-up
drains every completion that arrived meanwhile, so a burst of answers costs one loop iteration and
one GIL acquisition, not one per request.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import structlog

import inferd._core as _core
from inferd.core.executor import Executor
from inferd.core.policy import BatcherOptions, SequenceOptions
from inferd.datatypes import Datatype
from inferd.errors import ErrorCode, InvalidArgument, error_for_code

if TYPE_CHECKING:
    from inferd._core import SharedMemoryRegistry

log = structlog.get_logger(__name__)

# (core datatype code, shape, buffer): a tensor as the core takes it.
CoreTensor = tuple[int, Sequence[int], Any]


# How the core ran one request, in the core's steady-clock nanoseconds (0 = not reached), and the
# batch it rode in: read-only attributes. ``CoreTiming.now_ns()`` reads the core's clock and
# ``CoreTiming.wall_ns(t)`` converts one of its times for export (OpenTelemetry).
CoreTiming = _core.RequestTiming


class CoreResult(NamedTuple):
    # Per model output (datatype code, shape, read-only array), or the serialized answer of a
    # request submitted as bytes.
    outputs: Any
    timing: CoreTiming


class TensorSignature(Protocol):
    """An input or output as the completed config declares it (dims exclude the batch dim)."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> Datatype: ...
    @property
    def dims(self) -> tuple[int, ...]: ...
    @property
    def reshape(self) -> tuple[int, ...] | None: ...
    @property
    def optional(self) -> bool: ...


WireRequest = _core.WireRequest
ModelSignature = _core.ModelSignature


def core_signature(
    name: str,
    version: str,
    max_batch_size: int,
    inputs: Sequence[TensorSignature],
    outputs: Sequence[TensorSignature],
    *,
    decoupled: bool = False,
    keeps_parameters: bool = False,
    bytes_are_text: bool = True,
    core_inputs: Sequence[TensorSignature] = (),
    sequence_batching: bool = False,
) -> ModelSignature:
    """What the core checks a model version's requests against and writes its answers from.
    ``decoupled``: the model's ``model_transaction_policy { decoupled: true }`` (any number of
    responses per request: the core's transport serves it on ModelStreamInfer only);
    ``keeps_parameters``: requests keep their own parameters (a python model's
    ``request.parameters()``); ``bytes_are_text``: BYTES inputs must be UTF-8 (ONNX strings; a
    python model takes any bytes); ``core_inputs``: a stateful model's control inputs and
    implicit states' inputs, after its inputs, written by the core into each request (the model
    then has sequence batching)."""
    return _core.ModelSignature(
        name,
        version,
        max_batch_size,
        # BYTES inputs are ONNX strings, UTF-8 text by the ONNX spec: checked per request, so
        # that a bad one fails alone instead of the batch it would have joined.
        [
            (
                t.name,
                t.datatype.config_type,
                list(t.dims),
                t.reshape,
                t.optional,
                t.datatype.is_bytes and bytes_are_text,
                False,
            )
            for t in inputs
        ]
        + [
            (t.name, t.datatype.config_type, list(t.dims), None, False, False, True)
            for t in core_inputs
        ],
        [(t.name, t.datatype.config_type, list(t.dims), t.reshape is not None) for t in outputs],
        decoupled=decoupled,
        keeps_parameters=keeps_parameters,
        sequence_batching=bool(core_inputs) or sequence_batching,
    )


def parse_infer_request(data: bytes) -> WireRequest:
    """A serialized ModelInferRequest, parsed by the core (views of ``data``, no copies)."""
    try:
        request: WireRequest = _core.parse_infer_request(data)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    return request


def _deadline_us(deadline_s: float | None) -> int:
    """The core's deadline argument: µs from now, 0 for none (and for one beyond 2^63 µs)."""
    if deadline_s is None or deadline_s * 1e6 >= 2**63:
        return 0
    return max(1, int(deadline_s * 1e6))


def check_status_codes(core_codes: Mapping[str, int] | None = None) -> None:
    """The core's status codes (``core_codes``: its StatusCode members, by default) must be
    inferd.errors.ErrorCode's, name for name and number for number; raises ImportError naming the
    difference."""
    members = _core.StatusCode.__members__ if core_codes is None else core_codes
    core = {name: int(value) for name, value in members.items() if name != "OK"}
    python = {code.name: int(code) for code in ErrorCode}
    if core != python:
        differ = sorted(set(core.items()) ^ set(python.items()))
        raise ImportError(f"the core's StatusCode and inferd.errors.ErrorCode differ: {differ}")


check_status_codes()


class CompletionDispatcher:
    """Resolves the futures of submitted requests from the core's completion queue.

    Lives on one event loop and is used from that loop's thread only.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue = _core.CompletionQueue()
        self._futures: dict[int, asyncio.Future[CoreResult]] = {}
        self._tokens = itertools.count(1)
        loop.add_reader(self._queue.fileno(), self._drain)

    @property
    def queue(self) -> _core.CompletionQueue:
        return self._queue

    def expect(self) -> tuple[int, asyncio.Future[CoreResult]]:
        """A fresh token and the future its completion will resolve."""
        token = next(self._tokens)
        future = self._loop.create_future()
        self._futures[token] = future
        return token, future

    def forget(self, token: int) -> None:
        """Drops a token whose request the core did not accept."""
        self._futures.pop(token, None)

    def close(self) -> None:
        self._loop.remove_reader(self._queue.fileno())
        self._drain()

    def _drain(self) -> None:
        for token, code, message, outputs, timing in self._queue.drain():
            future = self._futures.pop(token, None)
            if future is None or future.done():
                continue  # the caller went away (cancelled); its answer has nowhere to go
            if code == 0:
                future.set_result(CoreResult(outputs, timing))
            else:
                future.set_exception(error_for_code(code, message))


def cuda_device_count() -> int:
    """CUDA devices the core's run-time libcudart sees; 0 without CUDA."""
    return _core.cuda_device_count()


def cuda_runtime_description() -> str:
    """Which CUDA runtime the core found, or why none."""
    return _core.cuda_runtime_description()


class HostBufferPool:
    """The server's pool of (pinned when CUDA is there) buffers that batches are assembled in."""

    def __init__(self, capacity_bytes: int) -> None:
        self.core = _core.PinnedBufferPool(capacity_bytes)

    def stats(self) -> dict[str, int | bool]:
        return self.core.stats()


async def run_parsed_request(
    core: Any,
    dispatcher: CompletionDispatcher,
    signature: ModelSignature,
    request: WireRequest,
    *,
    deadline_s: float | None,
    stream: bool,
    shared_memory: SharedMemoryRegistry | None,
) -> CoreResult:
    """Hands a parsed ModelInferRequest to a core RequestScheduler (a model version's or an
    ensemble's), which checks it against ``signature``, and awaits its serialized answer; a
    cancelled caller takes its request out of the queue (or drops its answer)."""
    deadline_us = _deadline_us(deadline_s)
    token, future = dispatcher.expect()
    code, message = core.submit_request(
        token, signature, request, deadline_us, stream, shared_memory=shared_memory
    )
    if code != 0:
        dispatcher.forget(token)
        raise error_for_code(code, message)
    try:
        return await future
    except asyncio.CancelledError:
        core.cancel(token)
        raise


class ModelScheduler:
    """One model version's queue, batcher and executor instances in the core."""

    def __init__(
        self,
        dispatcher: CompletionDispatcher,
        pool: HostBufferPool,
        signature: ModelSignature,
        batching: BatcherOptions,
        executors: list[Executor],
        output_datatypes: list[int],
        sequence: SequenceOptions | None = None,
        response_cache: _core.ResponseCache | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._executors = executors
        self._signature = signature
        self._stateful = sequence is not None
        self._core = _core.Scheduler(
            signature.name,
            batching,
            # A native executor's core_session runs in the core, without the GIL.
            [getattr(e, "core_session", e) for e in executors],
            output_datatypes,
            dispatcher.queue,
            pool.core,
            sequence,
            response_cache,
        )

    async def infer(
        self,
        inputs: list[CoreTensor],
        batch_size: int,
        *,
        priority: int = 0,
        timeout_us: int = 0,
        deadline_s: float | None = None,
    ) -> CoreResult:
        """Computes one request: inputs in model order; returns every output in model order and
        how the core ran it.

        ``priority`` 0 is the model's default level; ``timeout_us`` asks for a shorter queue
        timeout (honoured when the policy allows overrides); ``deadline_s``, the seconds the
        caller will wait, makes a request still queued when it passes DEADLINE_EXCEEDED without
        being computed. If the caller is cancelled while the request waits, it leaves the queue.
        """
        deadline_us = _deadline_us(deadline_s)
        token, future = self._dispatcher.expect()
        code, message = self._core.submit(
            token, batch_size, inputs, priority, timeout_us, deadline_us
        )
        if code != 0:
            self._dispatcher.forget(token)
            raise error_for_code(code, message)
        try:
            return await future
        except asyncio.CancelledError:
            self._core.cancel(token)  # still queued: out it goes; running: its answer is dropped
            raise

    async def infer_request(
        self,
        request: WireRequest,
        *,
        deadline_s: float | None = None,
        stream: bool = False,
        shared_memory: SharedMemoryRegistry | None = None,
    ) -> CoreResult:
        """Computes a parsed ModelInferRequest: the core checks it against the model, runs it and
        writes its answer, returned as the serialized ModelInferResponse (ModelStreamInferResponse
        with ``stream``, which the core's own server uses; the tests check both writers from
        here). Deadline and cancellation as in ``infer``. ``shared_memory``: the regions its tensors
        may name (None: a tensor naming one is refused)."""
        return await run_parsed_request(
            self._core,
            self._dispatcher,
            self._signature,
            request,
            deadline_s=deadline_s,
            stream=stream,
            shared_memory=shared_memory,
        )

    @property
    def executors(self) -> list[Executor]:
        return list(self._executors)

    @property
    def batching(self) -> BatcherOptions:
        """How the core queues and batches this version's requests (a copy of its options)."""
        return self._core.batcher_options

    @property
    def core(self) -> Any:
        """The core's Scheduler, which the core's gRPC server submits requests to itself."""
        return self._core

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def pending_requests(self) -> int:
        """Requests waiting in the queue now (not yet in a batch)."""
        return self._core.pending_requests()

    def sequence_counts(self) -> tuple[int, int, int] | None:
        """A stateful model's sequences: (active, in the backlog, ended for being idle so far);
        None for a model without sequence batching."""
        return self._core.sequence_counts() if self._stateful else None

    def statistics(self) -> _core.StatisticsSnapshot:
        """A snapshot of the version's cumulative statistics: read-only attributes, durations as
        ``_core.Duration`` (count, ns), per batch size as ``_core.BatchDurations``, the latency
        histograms as ``_core.LatencyHistogram``."""
        return self._core.statistics()

    async def close(
        self, *, reject_queued: bool = False, abort_after_s: float | None = None
    ) -> None:
        """Stops intake, lets queued requests finish (or rejects them), joins the workers and
        closes the executors. The join runs off the event loop, which keeps completing requests.
        ``abort_after_s`` (the server's stop): once that passes, executors that can abort
        (python models, whose execute may never return) do, failing what they still hold."""
        loop = asyncio.get_running_loop()
        shutdown = loop.run_in_executor(None, self._core.shutdown, reject_queued)
        abortable = [e for e in self._executors if hasattr(e, "abort")]
        if abort_after_s is not None and abortable:
            done, _ = await asyncio.wait({shutdown}, timeout=abort_after_s)
            if not done:
                log.warning(
                    "batches still running at the stop's deadline: their workers are killed",
                    model=self._signature.name,
                    after_s=abort_after_s,
                )
                for executor in abortable:
                    executor.abort()
        await shutdown
        # Off the loop too: closing may wait (a python model's finalize, in its worker process).
        await loop.run_in_executor(None, self._close_executors)

    def _close_executors(self) -> None:
        for executor in self._executors:
            executor.close()

    def close_now(self) -> None:
        """Like close, blocking the calling thread: for a scheduler that never served (a load
        that failed half-way, on the loader's worker thread)."""
        self._core.shutdown(True)
        self._close_executors()
