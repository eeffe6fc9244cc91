"""Triton ensembles served end to end (issue 16, items 1-3), through a real server and
tritonclient: answers equal to the composing ONNX models run one by one in-process, ensemble
traffic batching with direct traffic, a failing step failing only its own requests, the load-time
refusals, composing models loaded, unloaded and reloaded under traffic, and the ensemble observed
like a model (config, metadata, statistics, streaming). The models are in ensemble_models.py."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server, wait_until
from tests.integration.ensemble_models import (
    DIAMOND,
    GATHER_CONFIG,
    MAX_BATCH_SIZE,
    WIDTH,
    InProcess,
    chain_config,
    ensemble_config,
    write_base,
    write_elementwise_model,
    write_ensemble,
    write_left,
    write_pre,
    write_serving_repository,
)
from tests.integration.gather_model import TABLE, write_gather_model

BAD_INDEX = 987654321  # outside TABLE: ONNX Runtime fails gather's Gather for it

# An ensemble the server cannot plan (its step 1 asks for a version left does not have), in the
# repository the "serving" server loads at start.
BROKEN = chain_config("broken").replace(
    'model_name: "left"\n    model_version: -1', 'model_name: "left"\n    model_version: 7'
)


def caused_here(record: dict[str, object]) -> bool:
    """The error records the tests cause on purpose: the lookups whose gather step fails
    (inferd's record for the ensemble request and ONNX Runtime's own) and the ensemble that fails
    to load at start."""
    return record.get("model") in ("lookup", "broken") or record.get("logger") == "onnxruntime"


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server loading every model at start (model control "none")."""
    root = tmp_path_factory.mktemp("ensembles")
    repository = root / "models"
    names = write_serving_repository(repository)
    write_ensemble(repository / "broken", BROKEN)
    with running_server(
        repository, [*names, "broken"], root, "--exit-on-error=false", expected_errors=caused_here
    ) as server:
        yield server


@pytest.fixture
def triton(serving: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(serving.url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def in_process(serving: ServerProcess) -> InProcess:
    return InProcess(serving.repository)


def fp32(name: str, values: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return tensor


def int64(name: str, values: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(values.shape), "INT64")
    tensor.set_data_from_numpy(values)
    return tensor


def rows(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.uniform(-10, 10, size=(count, WIDTH)).astype(np.float32)


def stats(client: grpcclient.InferenceServerClient, model: str) -> Any:
    return client.get_inference_statistics(model).model_stats[0]


def expect_nothing_more_computed(
    client: grpcclient.InferenceServerClient, before_slow: Any, before_chain: Any
) -> None:
    """After the two full batches of the tests below and slow_chain's request that failed with
    its step queued: that step was never computed. Once the ensemble request has failed (its
    failure counted), a request to slow would be computed after its step, or with it, had the
    step stayed queued; so once that request is counted, slow's counts are exact."""
    wait_until(
        lambda: (
            stats(client, "slow_chain").inference_stats.fail.count
            == before_chain.inference_stats.fail.count + 1
        ),
        "slow_chain's failure counted",
    )
    client.infer("slow", [fp32("INPUT0", np.zeros((1, WIDTH), np.float32))])
    expected = 2 * MAX_BATCH_SIZE + 1  # rows, as Triton counts them: two full batches, the last
    wait_until(
        lambda: stats(client, "slow").inference_count - before_slow.inference_count >= expected,
        "the last request to slow counted",
    )
    after_slow = stats(client, "slow")
    assert after_slow.inference_count - before_slow.inference_count == expected
    assert after_slow.execution_count - before_slow.execution_count == 3
    after_chain = stats(client, "slow_chain")
    assert after_chain.inference_stats.fail.count == before_chain.inference_stats.fail.count + 1


def test_diamond_and_chain_answer_as_their_models_run_one_by_one(
    triton: grpcclient.InferenceServerClient, in_process: InProcess, rng: np.random.Generator
) -> None:
    for batch in (1, 2, 3, 4, 4, 3, 2, 1):
        values = rows(rng, batch)
        diamond = triton.infer("diamond", [fp32("IN", values)])
        expected = in_process.diamond(values)
        np.testing.assert_array_equal(diamond.as_numpy("OUT"), expected["OUT"])
        np.testing.assert_array_equal(diamond.as_numpy("SQUARE"), expected["SQUARE"])
        chain = triton.infer("chain", [fp32("IN", values)])
        np.testing.assert_array_equal(chain.as_numpy("OUT"), in_process.chain(values))
        assert diamond.get_response().model_name == "diamond"
        assert chain.get_response().model_name == "chain"


DIRECT_ROWS = 5  # two direct requests never share one of busy's batches (max_batch_size 8)
ENSEMBLE_ROWS = 2
CLIENTS_PER_KIND = 16
REQUESTS_PER_CLIENT = 3


def batch_counts(model_stats: Any) -> dict[int, int]:
    return {b.batch_size: b.compute_infer.count for b in model_stats.batch_stats}


def test_ensemble_steps_batch_with_direct_requests_to_their_model(
    serving: ServerProcess, triton: grpcclient.InferenceServerClient
) -> None:
    # 16 clients send 5-row requests straight to busy, 16 send 2-row requests to busy_chain
    # (pre, then busy). busy batches up to 8 rows, so its batches can hold 5 (one direct
    # request), 2, 4, 6 or 8 (ensemble steps alone) or 7: a direct request and an ensemble step
    # together, the only way to make 7 of 5s and 2s. A batch of 7 is the proof of mixing.
    before = stats(triton, "busy")
    failures: list[str] = []
    start = threading.Barrier(2 * CLIENTS_PER_KIND)

    def client(number: int, ensemble: bool) -> None:
        rng = np.random.default_rng(number)
        with grpcclient.InferenceServerClient(serving.url) as own:
            start.wait()
            for _ in range(REQUESTS_PER_CLIENT):
                values = rows(rng, ENSEMBLE_ROWS if ensemble else DIRECT_ROWS)
                try:
                    if ensemble:
                        answer = own.infer("busy_chain", [fp32("IN", values)]).as_numpy("OUT")
                        expected = values + np.float32(1)
                    else:
                        answer = own.infer("busy", [fp32("INPUT0", values)]).as_numpy("OUTPUT0")
                        expected = values
                except InferenceServerException as e:
                    failures.append(str(e))
                    continue
                if not np.array_equal(answer, expected):
                    failures.append(f"client {number}: {answer} != {expected}")

    threads = [
        threading.Thread(target=client, args=(n, n % 2 == 0)) for n in range(2 * CLIENTS_PER_KIND)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    after = stats(triton, "busy")
    sent_rows = CLIENTS_PER_KIND * REQUESTS_PER_CLIENT * (DIRECT_ROWS + ENSEMBLE_ROWS)
    assert after.inference_count - before.inference_count == sent_rows
    counts_before = batch_counts(before)
    formed = {
        size: count - counts_before.get(size, 0)
        for size, count in batch_counts(after).items()
        if count > counts_before.get(size, 0)
    }
    assert formed.get(DIRECT_ROWS + ENSEMBLE_ROWS, 0) > 0, f"no mixed batch: {formed}"
    assert sum(size * count for size, count in formed.items()) == sent_rows, formed


def test_a_failing_step_fails_only_its_own_requests(
    triton: grpcclient.InferenceServerClient, serving: ServerProcess, in_process: InProcess
) -> None:
    # lookup: step 1 (gather) reads INDEX, step 0 (double1) doubles what it found. An index
    # outside the table fails gather for that request, batched or not.
    good_clients, requests, bad_requests = 6, 6, 4
    before = stats(triton, "lookup")
    answers: dict[str, float] = {}
    failures: dict[str, tuple[str, str]] = {}
    lock = threading.Lock()
    start = threading.Barrier(good_clients + 1)

    def client(name: str, indexes: list[int]) -> None:
        with grpcclient.InferenceServerClient(serving.url) as own:
            start.wait()
            for n, index in enumerate(indexes):
                request_id = f"{name}-{n}"
                try:
                    result = own.infer(
                        "lookup",
                        [int64("INDEX", np.array([[index]], np.int64))],
                        request_id=request_id,
                    )
                except InferenceServerException as e:
                    with lock:
                        failures[request_id] = (str(e.status()), str(e.message()))
                    continue
                output = result.as_numpy("OUT")
                assert output is not None
                with lock:
                    answers[request_id] = float(output[0, 0])

    threads = [
        threading.Thread(target=client, args=(f"good{c}", [(c + n) % 4 for n in range(requests)]))
        for c in range(good_clients)
    ]
    threads.append(threading.Thread(target=client, args=("bad", [BAD_INDEX] * bad_requests)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    good = {
        f"good{c}-{n}": float(in_process.lookup(np.array([[(c + n) % 4]], np.int64))[0, 0])
        for c in range(good_clients)
        for n in range(requests)
    }
    assert set(good.values()) == {2 * t for t in TABLE}
    assert {rid: failures[rid] for rid in good if rid in failures} == {}
    assert {rid: answers.get(rid) for rid in good} == good
    assert set(failures) == {f"bad-{n}" for n in range(bad_requests)}
    for request_id, (status, message) in failures.items():
        assert status == "StatusCode.INTERNAL", (request_id, message)  # gather's own code
        assert message.startswith("ensemble 'lookup' step 1 (model 'gather'): "), message
        assert str(BAD_INDEX) in message, message  # the step's own message follows
    after = stats(triton, "lookup")
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == bad_requests
    assert after.inference_stats.success.count - before.inference_stats.success.count == len(good)


def test_an_ensemble_that_cannot_be_planned_is_unavailable_with_the_reason(
    triton: grpcclient.InferenceServerClient,
) -> None:
    index = {(m.name, m.version): m for m in triton.get_model_repository_index().models}
    broken = [m for (name, _), m in index.items() if name == "broken"]
    assert broken, index
    for model in broken:
        assert model.state == "UNAVAILABLE"
        assert "step[1] (model 'left'): model_version 7 is not served" in model.reason, model
    assert not triton.is_model_ready("broken")
    assert triton.is_model_ready("chain")  # the others serve


def test_requested_outputs_and_the_request_id_carry_through(
    triton: grpcclient.InferenceServerClient, in_process: InProcess, rng: np.random.Generator
) -> None:
    values = rows(rng, 3)
    expected = in_process.diamond(values)
    for wanted in ("SQUARE", "OUT"):
        result = triton.infer(
            "diamond",
            [fp32("IN", values)],
            outputs=[grpcclient.InferRequestedOutput(wanted)],
            request_id=f"ask-{wanted}",
        )
        response = result.get_response()
        assert [o.name for o in response.outputs] == [wanted]
        assert response.id == f"ask-{wanted}"
        np.testing.assert_array_equal(result.as_numpy(wanted), expected[wanted])


def test_a_deadline_passing_while_a_step_is_queued_answers_deadline_exceeded(
    triton: grpcclient.InferenceServerClient, serving: ServerProcess
) -> None:
    # slow computes ~100 ms a row on one instance; two direct requests of a full batch each
    # cannot share one, so one computes (~800 ms) while the other waits queued, whichever a loaded
    # machine delivered first; slow_chain's second step queues behind them with a 50 ms deadline.
    done: queue.Queue[str] = queue.Queue()
    before_slow = stats(triton, "slow")
    before_chain = stats(triton, "slow_chain")
    for tag, rows_ in (("busy", MAX_BATCH_SIZE), ("queued", MAX_BATCH_SIZE)):
        triton.async_infer(
            "slow",
            [fp32("INPUT0", np.zeros((rows_, WIDTH), np.float32))],
            lambda result, error, tag=tag: done.put(tag),
        )
    serving.wait_for_pending("slow", 1)
    with pytest.raises(InferenceServerException) as late:
        triton.infer(
            "slow_chain", [fp32("IN", np.ones((1, WIDTH), np.float32))], client_timeout=0.05
        )
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert {done.get(timeout=30), done.get(timeout=30)} == {"busy", "queued"}
    # Only the core's deadline on the queued step takes it out.
    expect_nothing_more_computed(triton, before_slow, before_chain)


def test_a_cancelled_call_takes_its_queued_step_out(
    triton: grpcclient.InferenceServerClient, serving: ServerProcess
) -> None:
    # As above: two full batches, one computing while the other waits queued, whichever came
    # first; slow_chain's second step queues behind them (2 pending) and the client cancels it.
    answers: queue.Queue[tuple[str, Any]] = queue.Queue()
    before_slow = stats(triton, "slow")
    before_chain = stats(triton, "slow_chain")
    for tag in ("busy", "queued"):
        triton.async_infer(
            "slow",
            [fp32("INPUT0", np.zeros((MAX_BATCH_SIZE, WIDTH), np.float32))],
            lambda result, error, tag=tag: answers.put((tag, error)),
        )
    serving.wait_for_pending("slow", 1)
    call = triton.async_infer(
        "slow_chain",
        [fp32("IN", np.ones((1, WIDTH), np.float32))],
        lambda result, error: answers.put(("cancelled", error)),
    )
    serving.wait_for_pending("slow", 2)  # pre has answered and the second step is queued
    call.cancel()
    results = dict(answers.get(timeout=30) for _ in range(3))
    assert results["busy"] is None and results["queued"] is None, results
    assert results["cancelled"] is not None
    assert results["cancelled"].status() == "StatusCode.CANCELLED"
    expect_nothing_more_computed(triton, before_slow, before_chain)


def test_the_priority_reaches_the_queued_step(
    triton: grpcclient.InferenceServerClient, serving: ServerProcess
) -> None:
    # ordered runs one request at a time, by priority (2 by default), about 0.8 s each. While one
    # of three direct requests at priority 2 computes and the other two queue, ordered_chain's
    # step is seen queued at priority 1: it must run next, which it can only if the ensemble
    # request's priority reached it; at priority 2 it would run last. Which direct request the
    # server took first is the transport's to decide.
    finished: queue.Queue[tuple[str, Any]] = queue.Queue()
    row = np.ones((1, WIDTH), np.float32)

    def send(model: str, tensor: str, tag: str, priority: int = 0) -> None:
        triton.async_infer(
            model,
            [fp32(tensor, row)],
            lambda result, error: finished.put((tag, error)),
            priority=priority,
        )

    send("ordered", "INPUT0", "busy")
    send("ordered", "INPUT0", "low1", priority=2)
    send("ordered", "INPUT0", "low2", priority=2)
    serving.wait_for_pending("ordered", 2)
    send("ordered_chain", "IN", "high", priority=1)
    serving.wait_for_pending("ordered", 3)  # pre has answered and the second step is queued
    done = [finished.get(timeout=30) for _ in range(4)]
    assert [error for _, error in done] == [None] * 4
    order = [tag for tag, _ in done]
    assert order[1] == "high", order


def test_config_and_metadata_describe_the_ensemble(
    triton: grpcclient.InferenceServerClient,
) -> None:
    config = triton.get_model_config("diamond").config
    assert config.platform == "ensemble"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["IN"]
    assert [o.name for o in config.output] == ["OUT", "SQUARE"]
    steps = config.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["combine", "pre", "left", "right"]
    assert dict(steps[0].input_map) == {"A": "doubled", "B": "SQUARE"}
    assert dict(steps[0].output_map) == {"SUM": "OUT"}
    metadata = triton.get_model_metadata("diamond")
    assert metadata.platform == "ensemble"
    assert metadata.versions == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("IN", "FP32", [-1, WIDTH])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("OUT", "FP32", [-1, WIDTH]),
        ("SQUARE", "FP32", [-1, WIDTH]),
    ]
    composing = triton.get_model_metadata("combine")
    assert composing.platform == "onnxruntime_onnx"
    assert [t.name for t in composing.inputs] == ["A", "B"]


def test_statistics_count_the_ensemble_and_its_steps_in_the_composing_models(
    triton: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    before = {m: stats(triton, m) for m in ("diamond", "combine", "left")}
    batches = [1, 2, 3, 4, 2]
    for batch in batches:
        triton.infer("diamond", [fp32("IN", rows(rng, batch))])
    direct = [1, 3]
    for batch in direct:
        triton.infer("left", [fp32("X", rows(rng, batch))])
    after = {m: stats(triton, m) for m in ("diamond", "combine", "left")}

    def delta(model: str, field: str) -> int:
        return int(getattr(after[model], field) - getattr(before[model], field))

    def requests(model: str, outcome: str) -> int:
        now = getattr(after[model].inference_stats, outcome)
        then = getattr(before[model].inference_stats, outcome)
        return int(now.count - then.count)

    # The ensemble's own counts: its rows, one execution per request, each a success.
    assert delta("diamond", "inference_count") == sum(batches)
    assert delta("diamond", "execution_count") == len(batches)
    assert requests("diamond", "success") == len(batches)
    assert requests("diamond", "fail") == 0
    success = after["diamond"].inference_stats.success
    assert success.ns > before["diamond"].inference_stats.success.ns
    assert after["diamond"].last_inference > 0
    # combine is reached only through the ensemble; left also directly.
    assert delta("combine", "inference_count") == sum(batches)
    assert requests("combine", "success") == len(batches)
    assert 1 <= delta("combine", "execution_count") <= len(batches)
    assert delta("left", "inference_count") == sum(batches) + sum(direct)
    assert requests("left", "success") == len(batches) + len(direct)


def test_a_stream_reaches_the_ensemble(
    triton: grpcclient.InferenceServerClient, in_process: InProcess, rng: np.random.Generator
) -> None:
    done: list[tuple[Any, Any]] = []
    finished = threading.Event()
    count = 6

    def callback(result: Any, error: Any) -> None:
        done.append((result, error))
        if len(done) == count:
            finished.set()

    sent = {f"s{n}": rows(rng, 1 + n % 4) for n in range(count)}
    triton.start_stream(callback)
    try:
        for request_id, values in sent.items():
            triton.async_stream_infer("diamond", [fp32("IN", values)], request_id=request_id)
        assert finished.wait(30)
    finally:
        triton.stop_stream()
    assert [error for _, error in done] == [None] * count
    for result, _ in done:
        request_id = result.get_response().id
        expected = in_process.diamond(sent[request_id])
        np.testing.assert_array_equal(result.as_numpy("OUT"), expected["OUT"])
        np.testing.assert_array_equal(result.as_numpy("SQUARE"), expected["SQUARE"])
    assert sorted(result.get_response().id for result, _ in done) == sorted(sent)


# --- explicit model control -------------------------------------------------------------------


def edited(text: str, old: str, new: str, name: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1).replace('name: "diamond"', f'name: "{name}"', 1)


def step_model(model: str, version: str) -> tuple[str, str]:
    """The text naming a step's model and its version in DIAMOND, and the same with ``version``."""
    return (
        f'model_name: "{model}"\n    model_version: -1',
        f'model_name: "{model}"\n    model_version: {version}',
    )


# Each load-time error of item 2: (ensemble name, config text, what the refusal must say).
REFUSALS = [
    pytest.param(
        "bad_cycle",
        edited(DIAMOND, 'value: "IN"', 'value: "doubled"', "bad_cycle"),
        [
            "cycle",
            "step[1] (model 'pre' version 1) reads tensor 'doubled' from step[2] (model 'left'",
            "step[2] (model 'left' version 1) reads tensor 'shifted' from step[1] (model 'pre'",
        ],
        id="cycle",
    ),
    pytest.param(
        "bad_model",
        edited(DIAMOND, 'model_name: "left"', 'model_name: "lefty"', "bad_model"),
        ["step[2] (model 'lefty')", "'lefty'"],
        id="unknown-model",
    ),
    pytest.param(
        "bad_version",
        edited(DIAMOND, *step_model("right", "7"), "bad_version"),
        ["step[3] (model 'right')", "model_version 7 is not served"],
        id="unknown-version",
    ),
    pytest.param(
        "bad_unfed",
        edited(DIAMOND, 'key: "B" value: "SQUARE"', 'key: "B" value: "nowhere"', "bad_unfed"),
        ["step[0] (model 'combine' version 1)", "input 'B' reads tensor 'nowhere'", "nothing"],
        id="input-fed-by-nothing",
    ),
    pytest.param(
        "bad_output",
        edited(
            DIAMOND,
            '{ name: "SQUARE"',
            '{ name: "EXTRA" data_type: TYPE_FP32 dims: [ 4 ] },\n  { name: "SQUARE"',
            "bad_output",
        ),
        ["output 'EXTRA' is produced by no step"],
        id="output-produced-by-no-step",
    ),
    pytest.param(
        "bad_datatype",
        ensemble_config(
            "bad_datatype",
            {"IN": "TYPE_FP32 [ 4 ]"},
            {"OUT": "TYPE_FP32 [ 1 ]"},
            [
                '{ model_name: "pre" model_version: -1 input_map { key: "RAW" value: "IN" } '
                'output_map { key: "PRE" value: "shifted" } }',
                '{ model_name: "gather" model_version: -1 '
                'input_map { key: "INPUT0" value: "shifted" } '
                'output_map { key: "OUTPUT0" value: "OUT" } }',
            ],
        ),
        [
            "step[1] (model 'gather' version 1)",
            "tensor 'shifted' is TYPE_FP32 as step[0] (model 'pre' version 1) output 'PRE' but "
            "TYPE_INT64 as step[1] (model 'gather' version 1) input 'INPUT0'",
        ],
        id="datatype-mismatch",
    ),
    pytest.param(
        "bad_shape",
        ensemble_config(
            "bad_shape",
            {"IN": "TYPE_FP32 [ 4 ]"},
            {"OUT": "TYPE_FP32 [ 1 ]"},
            [
                '{ model_name: "pre" model_version: -1 input_map { key: "RAW" value: "IN" } '
                'output_map { key: "PRE" value: "shifted" } }',
                '{ model_name: "double1" model_version: -1 '
                'input_map { key: "X" value: "shifted" } '
                'output_map { key: "Y" value: "OUT" } }',
            ],
        ),
        [
            "step[1] (model 'double1' version 1)",
            "tensor 'shifted' has shape [-1, 4] as step[0] (model 'pre' version 1) output 'PRE' "
            "but [-1, 1] as step[1] (model 'double1' version 1) input 'X'",
        ],
        id="shape-mismatch",
    ),
    pytest.param(
        "bad_twice",
        edited(DIAMOND, 'key: "Y" value: "SQUARE"', 'key: "Y" value: "doubled"', "bad_twice"),
        [
            "step[3] (model 'right' version 1): output 'Y' writes tensor 'doubled', which is "
            "written by step[2] (model 'left' version 1)",
        ],
        id="tensor-produced-twice",
    ),
]


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server loading models only when asked (model control "explicit"), nothing at start.
    Besides the base models and ensembles: gather and double1 (for the refusals), and two
    two-step chains with composing models of their own, ``solo`` (solo_pre -> solo_left) and
    ``pair`` (pair_pre -> pair_left), and every ensemble of REFUSALS."""
    root = tmp_path_factory.mktemp("explicit")
    repository = root / "models"
    names = write_base(repository)
    write_gather_model(repository / "gather", GATHER_CONFIG)
    write_elementwise_model(repository / "double1", "double", ("X",), "Y", width=1)
    names += ["gather", "double1"]
    for chain in ("solo", "pair"):
        write_pre(repository / f"{chain}_pre")
        write_left(repository / f"{chain}_left")
        write_ensemble(
            repository / chain,
            chain_config(chain, pre=f"{chain}_pre", left=f"{chain}_left", right=""),
        )
        names += [f"{chain}_pre", f"{chain}_left", chain]
    for refusal in REFUSALS:
        name, config, _ = refusal.values
        write_ensemble(repository / str(name), str(config))
        names.append(str(name))
    with running_server(repository, names, root, "--model-control-mode", "explicit") as server:
        yield server


@pytest.fixture
def control(explicit: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(explicit.url)
    try:
        yield client
    finally:
        client.close()


def index_entries(client: grpcclient.InferenceServerClient, model: str) -> list[Any]:
    return [m for m in client.get_model_repository_index().models if m.name == model]


@pytest.mark.parametrize(("name", "config", "expected"), REFUSALS)
def test_a_load_time_error_is_refused_naming_the_step_and_tensor(
    control: grpcclient.InferenceServerClient,
    explicit: ServerProcess,
    name: str,
    config: str,
    expected: list[str],
) -> None:
    assert (explicit.repository / name / "config.pbtxt").read_text() == config
    with pytest.raises(InferenceServerException) as refused:
        control.load_model(name)
    message = refused.value.message()
    assert f"ensemble '{name}'" in message, message
    for fragment in expected:
        assert fragment in message, message
    assert refused.value.status() in ("StatusCode.INVALID_ARGUMENT", "StatusCode.INTERNAL")
    assert not control.is_model_ready(name)
    (entry,) = index_entries(control, name)
    assert entry.state == "UNAVAILABLE"
    assert expected[-1] in entry.reason, entry.reason
    # The server keeps serving: an ensemble answers after the refusal.
    if not control.is_model_ready("chain"):
        control.load_model("chain")
    values = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    answer = control.infer("chain", [fp32("IN", values)]).as_numpy("OUT")
    np.testing.assert_array_equal(answer, np.square((values + 1) * 2))


def test_loading_an_ensemble_loads_its_composing_models(
    control: grpcclient.InferenceServerClient,
) -> None:
    for model in ("solo", "solo_pre", "solo_left"):
        assert not control.is_model_ready(model), model
    control.load_model("solo")
    for model in ("solo", "solo_pre", "solo_left"):
        assert control.is_model_ready(model), model
    values = np.arange(2 * WIDTH, dtype=np.float32).reshape(2, WIDTH)
    answer = control.infer("solo", [fp32("IN", values)]).as_numpy("OUT")
    np.testing.assert_array_equal(answer, (values + 1) * 2)


def health(explicit: ServerProcess, model: str) -> int:
    with grpc.insecure_channel(explicit.url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=f"inference.GRPCInferenceService/{model}"),
            timeout=10,
        )
    return int(reply.status)


def test_unloading_a_composing_model_makes_the_ensemble_unready_until_it_is_loaded_again(
    control: grpcclient.InferenceServerClient, explicit: ServerProcess
) -> None:
    values = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    control.load_model("pair")
    assert control.is_model_ready("pair")
    assert health(explicit, "pair") == health_pb2.HealthCheckResponse.SERVING
    control.unload_model("pair_left")
    assert not control.is_model_ready("pair")
    assert health(explicit, "pair") == health_pb2.HealthCheckResponse.NOT_SERVING
    entries = index_entries(control, "pair")
    assert entries
    for entry in entries:
        assert entry.state == "UNAVAILABLE", entry
        assert "pair_left" in entry.reason, entry
    with pytest.raises(InferenceServerException) as refused:
        control.infer("pair", [fp32("IN", values)])
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    control.load_model("pair_left")
    assert control.is_model_ready("pair")
    assert health(explicit, "pair") == health_pb2.HealthCheckResponse.SERVING
    assert [e.state for e in index_entries(control, "pair")] == ["READY"]
    answer = control.infer("pair", [fp32("IN", values)]).as_numpy("OUT")
    np.testing.assert_array_equal(answer, (values + 1) * 2)


def freed_versions(server: ServerProcess, model: str) -> int:
    """How many versions of ``model`` the server's log says it freed (drained and closed)."""
    return sum(
        1
        for r in server.records()
        if r.get("event") == "model version freed" and r.get("model") == model
    )


def test_reloading_a_composing_model_under_ensemble_traffic_loses_nothing(
    control: grpcclient.InferenceServerClient, explicit: ServerProcess
) -> None:
    control.load_model("chain")
    freed_before = freed_versions(explicit, "left")
    stop = threading.Event()
    failures: list[str] = []
    answered = [0] * 4

    def traffic(number: int) -> None:
        rng = np.random.default_rng(number)
        reference = InProcess(explicit.repository)
        with grpcclient.InferenceServerClient(explicit.url) as own:
            while not stop.is_set():
                values = rows(rng, 1 + int(rng.integers(0, 4)))
                try:
                    answer = own.infer("chain", [fp32("IN", values)]).as_numpy("OUT")
                except InferenceServerException as e:
                    failures.append(str(e))
                    continue
                if not np.array_equal(answer, reference.chain(values)):
                    failures.append(f"wrong answer for {values}")
                answered[number] += 1

    threads = [threading.Thread(target=traffic, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()

    def wait_for_traffic() -> None:
        """Until every client has had three more answers (or one failed)."""
        since = list(answered)
        wait_until(
            lambda: bool(failures) or all(a - b >= 3 for a, b in zip(answered, since, strict=True)),
            "three more answers for every client",
        )

    try:
        for _ in range(3):
            wait_for_traffic()
            control.load_model("left")  # the same files: a new version replaces the serving one
        wait_for_traffic()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert failures == []
    assert min(answered) >= 12, answered  # every client's traffic spanned the reloads
    assert freed_versions(explicit, "left") == freed_before + 3  # three really replaced it
    assert control.is_model_ready("chain")


def test_an_ensemble_naming_a_model_the_repository_lacks_adds_no_such_model(
    tmp_path: Path,
) -> None:
    # At start (model control "none"), an ensemble whose step names a model that is not in the
    # repository fails alone, with the step named; the repository gains no model by it.
    repository = tmp_path / "models"
    names = write_base(repository)
    write_ensemble(repository / "orphan", chain_config("orphan", left="nothere"))
    with (
        running_server(
            repository,
            [*names, "orphan"],
            tmp_path,
            "--exit-on-error=false",
            expected_errors=lambda record: record.get("model") == "orphan",
        ) as server,
        grpcclient.InferenceServerClient(server.url) as client,
    ):
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert sorted(index) == sorted([*names, "orphan"])
        assert index["orphan"].state == "UNAVAILABLE"
        assert "step[1] (model 'nothere')" in index["orphan"].reason, index["orphan"]
        assert client.is_model_ready("chain")
