"""The bridge to the core: answers reach the event loop, the GIL is free while the core waits."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

import inferd._core as _core
from inferd.core import (
    BatcherOptions,
    CompletionDispatcher,
    CoreTiming,
    HostBufferPool,
    ModelScheduler,
    core_signature,
)
from inferd.core.policy import Padding, QueuePolicy
from inferd.core.scheduler import check_status_codes
from inferd.errors import InvalidArgument, Unavailable

INT32 = 8  # DataType code of INT32 (TYPE_INT32)
POOL = HostBufferPool(1 << 24)


def make_scheduler(
    dispatcher: CompletionDispatcher, executors: list[Any], **policy: Any
) -> ModelScheduler:
    """A scheduler for a model with one INT32 output."""
    signature = core_signature("m", "1", 0, [], [])
    return ModelScheduler(dispatcher, POOL, signature, BatcherOptions(**policy), executors, [INT32])


class Doubler:
    """Doubles its one INT32 input; sleeps first if asked (time.sleep releases the GIL)."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None) -> None:
        self.delay = delay
        self.gate = gate
        self.calls = 0
        self.closed = False

    def execute(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(10)
        time.sleep(self.delay)
        return [inputs[0] * 2]

    def close(self) -> None:
        self.closed = True


class Rejecting:
    def execute(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise InvalidArgument("not this input")

    def close(self) -> None:
        pass


def test_status_codes_must_match_the_core_both_ways() -> None:
    core = {name: int(value) for name, value in _core.StatusCode.__members__.items()}
    check_status_codes(core)  # what the import checked
    for broken in (
        {**core, "INTERNAL": 99},  # renumbered
        {k: v for k, v in core.items() if k != "NOT_FOUND"},  # gone from the core
        {**core, "DATA_LOSS": 15},  # new in the core only
    ):
        with pytest.raises(ImportError, match="differ"):
            check_status_codes(broken)


async def test_many_concurrent_requests_each_get_their_own_answer() -> None:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    executors = [Doubler(), Doubler()]
    scheduler = make_scheduler(dispatcher, list(executors), max_batch_size=8)
    values = [np.full((1, 3), i, dtype=np.int32) for i in range(200)]
    results = await asyncio.gather(*(scheduler.infer([(INT32, v.shape, v)], 1) for v in values))
    batches: dict[int, int] = {}
    for value, (outputs, timing) in zip(values, results, strict=True):
        datatype, shape, array = outputs[0]
        assert 0 < timing.enqueued <= timing.compute_start <= timing.compute_end
        batches[timing.batch_id] = timing.batch_requests
        assert (datatype, shape) == (INT32, (1, 3))
        np.testing.assert_array_equal(array, value * 2)
        assert not array.flags.writeable  # a view of the executor's output, not a copy
    stats = scheduler.statistics()
    assert stats.inference_count == 200
    assert stats.success.count == 200
    # Every answer names its batch; the batches' sizes add up to the requests.
    assert len(batches) == stats.execution_count and sum(batches.values()) == 200
    await scheduler.close()
    assert all(e.closed for e in executors)
    assert sum(e.calls for e in executors) == 200
    dispatcher.close()


async def test_statistics_and_timing_are_typed_values_of_what_ran() -> None:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    scheduler = make_scheduler(dispatcher, [Doubler()], max_batch_size=8)
    before_ms = time.time_ns() // 1_000_000
    value = np.ones((2, 3), dtype=np.int32)
    _, timing = await scheduler.infer([(INT32, value.shape, value)], 2)
    stats = scheduler.statistics()
    assert isinstance(stats, _core.StatisticsSnapshot)
    assert before_ms <= stats.last_inference_ms <= time.time_ns() // 1_000_000
    assert (stats.inference_count, stats.execution_count) == (2, 1)  # rows, batches
    assert (stats.success.count, stats.queue.count) == (1, 1)
    assert (stats.fail.count, stats.fail.ns) == (0, 0)
    phases = (stats.compute_input, stats.compute_infer, stats.compute_output)
    assert [d.count for d in phases] == [1, 1, 1]
    assert stats.success.ns >= stats.compute_infer.ns > 0
    assert stats.queue.ns >= 0
    assert list(stats.batches) == [2]  # keyed by rows
    batch = stats.batches[2]
    assert isinstance(batch, _core.BatchDurations)
    for ours, total in zip(
        (batch.compute_input, batch.compute_infer, batch.compute_output), phases, strict=True
    ):
        assert (ours.count, ours.ns) == (total.count, total.ns)
    for histogram in (stats.request_duration, stats.queue_duration):
        assert histogram.bounds_us[:2] == [100, 250]
        assert len(histogram.counts) == len(histogram.bounds_us) + 1
        assert sum(histogram.counts) == 1
    assert stats.request_duration.sum_ns > 0
    assert stats.queue_duration.sum_ns >= 0
    with pytest.raises(AttributeError):
        stats.inference_count = 0  # type: ignore[misc]
    # The completion's timing: read-only, on the core's clock, naming its batch.
    assert isinstance(timing, _core.RequestTiming)
    assert 0 < timing.enqueued <= timing.compute_start <= timing.input_done
    assert timing.input_done <= timing.infer_done <= timing.compute_end <= CoreTiming.now_ns()
    assert (timing.batch_requests, timing.batch_rows, timing.instance) == (1, 2, 0)
    with pytest.raises(AttributeError):
        timing.batch_rows = 1  # type: ignore[misc]
    assert abs(CoreTiming.wall_ns(CoreTiming.now_ns()) - time.time_ns()) < 1_000_000_000
    await scheduler.close()
    dispatcher.close()


def test_statistics_values_can_be_built_and_are_checked() -> None:
    duration = _core.Duration(3, 4000)
    assert (duration.count, duration.ns) == (3, 4000)
    assert repr(duration) == "Duration(count=3, ns=4000)"
    empty = _core.StatisticsSnapshot()
    assert (empty.success.count, empty.batches, empty.request_duration.sum_ns) == (0, {}, 0)
    assert empty.queue_duration.counts == [0] * (len(empty.queue_duration.bounds_us) + 1)
    with pytest.raises(ValueError, match="counts"):
        _core.LatencyHistogram([1, 2, 3])
    timing = CoreTiming(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert (timing.enqueued, timing.compute_end, timing.batch_id, timing.instance) == (1, 5, 6, 9)


async def test_executor_errors_keep_their_code() -> None:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    scheduler = make_scheduler(dispatcher, [Rejecting()], max_batch_size=0)
    value = np.zeros((2,), dtype=np.int32)
    with pytest.raises(InvalidArgument, match="not this input"):
        await scheduler.infer([(INT32, value.shape, value)], 1)
    assert scheduler.statistics().fail.count == 1
    await scheduler.close()
    with pytest.raises(Unavailable):
        await scheduler.infer([(INT32, value.shape, value)], 1)
    dispatcher.close()


async def until_called(executor: Doubler) -> None:
    """Until the executor's execute has been called (it counts calls as they begin)."""
    deadline = time.monotonic() + 10
    while executor.calls == 0:
        assert time.monotonic() < deadline, "execute was never called"
        await asyncio.sleep(0.001)  # the poll's period


async def test_the_gil_is_free_while_the_core_waits_and_joins() -> None:
    """Workers need the GIL to run a Python executor. If submit or shutdown held it while
    waiting, this would deadlock: a Python thread must run meanwhile and release the gate."""
    gate = threading.Event()
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    executor = Doubler(gate=gate)
    scheduler = make_scheduler(dispatcher, [executor], max_batch_size=8)
    value = np.ones((1, 1), dtype=np.int32)
    pending = [
        asyncio.ensure_future(scheduler.infer([(INT32, value.shape, value)], 1)) for _ in range(5)
    ]
    await until_called(executor)  # all five submitted, the worker waiting at the gate
    opener = threading.Timer(0.2, gate.set)  # Python code that must get the GIL to run
    opener.start()
    started = time.monotonic()
    await scheduler.close()  # drains: joins the worker, which waits for the gate
    assert time.monotonic() - started >= 0.15
    results = await asyncio.gather(*pending)
    assert len(results) == 5 and executor.calls == 5
    opener.join()
    dispatcher.close()


async def test_a_cancelled_caller_does_not_break_later_answers() -> None:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    executor = Doubler(delay=0.05)
    scheduler = make_scheduler(dispatcher, [executor], max_batch_size=8)
    value = np.ones((1, 1), dtype=np.int32)
    first = asyncio.ensure_future(scheduler.infer([(INT32, value.shape, value)], 1))
    await until_called(executor)  # in its 50 ms execute
    first.cancel()
    outputs, _ = await scheduler.infer([(INT32, value.shape, value)], 1)
    np.testing.assert_array_equal(outputs[0][2], value * 2)
    await scheduler.close()
    dispatcher.close()


async def test_malformed_input_is_refused_at_submit() -> None:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    scheduler = make_scheduler(dispatcher, [Doubler()], max_batch_size=8)
    with pytest.raises(InvalidArgument, match="bytes"):
        await scheduler.infer([(INT32, (1, 4), b"\x00" * 15)], 1)
    await scheduler.close()
    dispatcher.close()


class PipelinedDoubler(Doubler):
    """A pipelined executor: stage() (on the core's stager thread) and execute() each take 20 ms;
    records which thread staged and when, and fails a staged batch holding 13."""

    def __init__(self) -> None:
        super().__init__(delay=0.02)
        self.staged: list[float] = []
        self.executed: list[tuple[float, float]] = []
        self.stage_threads: set[int] = set()
        self.execute_threads: set[int] = set()

    def stage(self, inputs: list[np.ndarray]) -> None:
        self.stage_threads.add(threading.get_ident())
        if int(inputs[0].flat[0]) == 13:
            raise InvalidArgument("cannot stage 13")
        time.sleep(0.02)  # staging takes a while: it can overlap a computation (checked below)
        self.staged.append(time.monotonic())

    def execute(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.execute_threads.add(threading.get_ident())
        begin = time.monotonic()
        result = super().execute(inputs)
        self.executed.append((begin, time.monotonic()))
        return result


async def test_a_pipelined_executor_stages_the_next_batch_on_another_thread() -> None:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    executor = PipelinedDoubler()
    scheduler = make_scheduler(dispatcher, [executor], max_batch_size=8)  # no dynamic batching
    values = [np.full((1, 3), i, dtype=np.int32) for i in (1, 2, 13, 4, 5, 6)]
    results = await asyncio.gather(
        *(scheduler.infer([(INT32, v.shape, v)], 1) for v in values), return_exceptions=True
    )
    for value, result in zip(values, results, strict=True):
        if int(value.flat[0]) == 13:
            assert isinstance(result, InvalidArgument) and "cannot stage 13" in str(result)
        else:
            assert not isinstance(result, BaseException)
            np.testing.assert_array_equal(result[0][0][2], value * 2)
    assert executor.calls == 5  # the batch that failed to stage was not executed
    assert executor.stage_threads.isdisjoint(executor.execute_threads)
    # Some batch was staged while another one computed.
    assert any(b < s < e for s in executor.staged for b, e in executor.executed)
    await scheduler.close()
    dispatcher.close()


SETTINGS = (BatcherOptions, QueuePolicy, Padding)


def _fields(value: Any) -> list[str]:
    """A bound settings type's fields: its properties, as the binding defines them."""
    return [name for name, member in vars(type(value)).items() if isinstance(member, property)]


def _differs_from_default_everywhere(value: Any, path: str) -> None:
    default = type(value)()
    for name in _fields(value):
        mine = getattr(value, name)
        assert mine != getattr(default, name), (
            f"{path}.{name} is its default: the test would not see it"
        )
        if isinstance(mine, SETTINGS):
            _differs_from_default_everywhere(mine, f"{path}.{name}")
        if isinstance(mine, dict):
            for key, item in mine.items():
                _differs_from_default_everywhere(item, f"{path}.{name}[{key}]")


def _assert_core_has(options: Any, core: Any, path: str) -> None:
    """Every field of ``options`` (recursively) is in ``core`` under its name, with its value."""
    assert _fields(options), f"{path} has no fields to compare"
    for name in _fields(options):
        mine, theirs = getattr(options, name), getattr(core, name)
        where = f"{path}.{name}"
        if isinstance(mine, SETTINGS):
            _assert_core_has(mine, theirs, where)
        elif isinstance(mine, dict):
            assert set(mine) == set(theirs), where
            for key, item in mine.items():
                _assert_core_has(item, theirs[key], f"{where}[{key}]")
        else:
            assert mine == theirs, where


async def test_every_batching_setting_reaches_the_core() -> None:
    """Each BatcherOptions field, set away from its default, read back from the core's scheduler:
    a setting dropped or renamed on the way fails here."""
    queue = QueuePolicy(
        delay_on_timeout=True,
        default_timeout_us=1500,
        allow_timeout_override=True,
        max_queue_size=7,
    )
    policy = BatcherOptions(
        dynamic=True,
        max_batch_size=16,
        preferred_batch_sizes=(4, 8),
        max_queue_delay_us=250,
        priority_levels=3,
        default_priority_level=2,
        default_queue_policy=queue,
        level_queue_policies={
            1: QueuePolicy(
                delay_on_timeout=True,
                default_timeout_us=10,
                allow_timeout_override=True,
                max_queue_size=1,
            ),
            3: QueuePolicy(
                delay_on_timeout=True,
                default_timeout_us=1500,
                allow_timeout_override=True,
                max_queue_size=9,
            ),
        },
        preserve_ordering=True,
        padding=Padding(
            inputs=(True, False), value=-1.5, reference_input=0, outputs=(((1, 1),), ())
        ),
    )
    _differs_from_default_everywhere(policy, "policy")
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    signature = core_signature("m", "1", 16, [], [])
    scheduler = ModelScheduler(dispatcher, POOL, signature, policy, [Doubler()], [INT32])
    try:
        _assert_core_has(policy, scheduler.core.batcher_options, "policy")
        assert scheduler.batching == policy
    finally:
        await scheduler.close()
        dispatcher.close()


def test_batching_settings_are_values_built_once() -> None:
    """The core's options are read-only, built by keyword with the core's defaults, and equal
    when every field is (nested policies too), so that nothing copies them field by field."""
    options = BatcherOptions(dynamic=True, level_queue_policies={1: QueuePolicy(max_queue_size=2)})
    assert options == BatcherOptions(
        dynamic=True, level_queue_policies={1: QueuePolicy(max_queue_size=2)}
    )
    assert options != BatcherOptions(
        dynamic=True, level_queue_policies={1: QueuePolicy(max_queue_size=3)}
    )
    assert options != BatcherOptions() and BatcherOptions() == BatcherOptions()
    assert (BatcherOptions().max_batch_size, Padding().reference_input) == (0, -1)
    assert "level_queue_policies={1: QueuePolicy(" in repr(options)
    with pytest.raises(AttributeError):
        options.dynamic = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        BatcherOptions(True)  # type: ignore[misc]  # keyword only


class PerRequestDoubler:
    """Answers each request of a batch on its own, as a python-backend model does: doubles it,
    or fails it alone: an exception object as its answer when its first value is 13, an answer
    that is no array when it is 7."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def execute(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise AssertionError("execute() called on an executor that answers each request")

    def execute_requests(self, requests: list[list[np.ndarray]]) -> list[Any]:
        self.batches.append(len(requests))
        time.sleep(0.01)  # later requests queue meanwhile
        answers: list[Any] = []
        for inputs in requests:
            value = int(inputs[0].flat[0])
            if value == 13:
                answers.append(InvalidArgument("13 is refused"))
            elif value == 7:
                answers.append([object()])  # not an array: a malformed answer for this one only
            else:
                answers.append([inputs[0] * 2])
        return answers

    def close(self) -> None:
        pass


async def test_an_executor_answering_each_request_gets_requests_and_fails_one_alone() -> None:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    executor = PerRequestDoubler()
    scheduler = make_scheduler(dispatcher, [executor], max_batch_size=8, dynamic=True)
    # Rows of their own per request (1 or 2): each request keeps its batch dim.
    values = [np.full((1 + i % 2, 3), i, dtype=np.int32) for i in range(40)]
    results = await asyncio.gather(
        *(scheduler.infer([(INT32, v.shape, v)], v.shape[0]) for v in values),
        return_exceptions=True,
    )
    for i, (value, result) in enumerate(zip(values, results, strict=True)):
        if i == 13:
            assert isinstance(result, InvalidArgument) and "13 is refused" in str(result)
            continue
        if i == 7:
            assert isinstance(result, BaseException) and not isinstance(result, InvalidArgument)
            continue
        assert not isinstance(result, BaseException), result
        ((_, shape, array),) = result.outputs
        assert tuple(shape) == value.shape
        np.testing.assert_array_equal(array, value * 2)
    assert sum(executor.batches) == 40 and len(executor.batches) < 40  # batched, never re-run
    stats = scheduler.statistics()
    assert (stats.success.count, stats.fail.count) == (38, 2)
    await scheduler.close()
