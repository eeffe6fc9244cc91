"""The example decoder (``decoder``, example_decoder.py) served as an iterative sequence by the
session server: one request is one whole generation, run a step per batch by the core, each
token streamed as a response on ModelStreamInfer and as an event on HTTP generate_stream, each
generation's tokens exactly what numpy computes from the same weights, while generations of
different lengths join and leave the running batch."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import queue
import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from inferd.example_decoder import reference_tokens
from tests.integration.conftest import ServerProcess


def decoder_inputs(first: int, length: int) -> list[grpcclient.InferInput]:
    tensors = [
        grpcclient.InferInput("TOKEN", [1, 1], "INT64"),
        grpcclient.InferInput("LENGTH", [1, 1], "INT32"),
    ]
    tensors[0].set_data_from_numpy(np.array([[first]], np.int64))
    tensors[1].set_data_from_numpy(np.array([[length]], np.int32))
    return tensors


def final(result: grpcclient.InferResult) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def generate(url: str, first: int, length: int) -> list[tuple[int, bool, bool]]:
    """(token, DONE, final flag) of each response of one generation, in order."""
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    got: list[tuple[int, bool, bool]] = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("decoder", decoder_inputs(first, length))
        while not got or not got[-1][2]:
            result, error = answers.get(timeout=60)
            if error is not None:
                raise error
            assert result is not None
            got.append(
                (
                    int(result.as_numpy("NEXT")[0][0]),
                    bool(result.as_numpy("DONE")[0][0]),
                    final(result),
                )
            )
        client.stop_stream()
    return got


def test_a_generation_streams_each_token_and_ends_with_the_final_flag(url: str) -> None:
    got = generate(url, 5, 12)
    assert [token for token, _, _ in got] == reference_tokens(5, 12)
    assert [done for _, done, _ in got] == [False] * 11 + [True]
    assert [flag for _, _, flag in got] == [False] * 11 + [True]


def test_generations_of_different_lengths_share_the_running_batch(
    url: str, client: grpcclient.InferenceServerClient
) -> None:
    before = client.get_inference_statistics("decoder", as_json=True)["model_stats"][0]
    lengths = [40, 3, 25, 1, 60, 8, 33, 17, 50, 5, 12, 29, 44, 2, 21, 9]
    results: dict[int, list[int]] = {}
    failures: list[str] = []

    def run(index: int) -> None:
        try:
            results[index] = [token for token, _, _ in generate(url, index * 31, lengths[index])]
        except Exception as error:  # reported below, with the generation that met it
            failures.append(f"generation {index}: {error}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(lengths))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    for index, length in enumerate(lengths):
        assert results[index] == reference_tokens(index * 31, length), f"generation {index}"
    after = client.get_inference_statistics("decoder", as_json=True)["model_stats"][0]
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    tokens = int(after["inference_count"]) - int(before.get("inference_count", 0))
    assert tokens == sum(lengths)  # one row per step of each generation
    assert executions < tokens  # steps of several generations shared batches
    requests = int(after["inference_stats"]["success"]["count"])
    assert (
        requests - int(before.get("inference_stats", {}).get("success", {}).get("count", 0)) == 16
    )


def test_http_generate_stream_sends_each_token_as_an_event(server: ServerProcess) -> None:
    host, port = server.http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(
            "POST",
            "/v2/models/decoder/generate_stream",
            json.dumps({"TOKEN": 11, "LENGTH": 6}),
            {"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        assert response.status == 200
        body = response.read().decode()
    finally:
        connection.close()
    events = [json.loads(b[len("data: ") :]) for b in body.split("\n\n") if b.startswith("data: ")]
    assert [event["NEXT"] for event in events] == reference_tokens(11, 6)
    assert [event["DONE"] for event in events] == [False] * 5 + [True]


EXAMPLES_DOC = Path(__file__).resolve().parents[2] / "docs" / "examples.md"


def test_the_docs_decoder_snippet_prints_the_generated_tokens(url: str) -> None:
    blocks = re.findall(r"```python\n(.*?)```", EXAMPLES_DOC.read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if '"decoder"' in block]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet.replace('"localhost:8001"', repr(url)), str(EXAMPLES_DOC), "exec"), {})
    assert [int(line) for line in out.getvalue().split()] == reference_tokens(5, 8)


def active_generations(server: ServerProcess) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    sample = 'inferd_sequences_active{model="decoder",version="1"} '
    return float(next(line for line in metrics.splitlines() if line.startswith(sample)).split()[1])


def steps_run(client: grpcclient.InferenceServerClient) -> int:
    stats = client.get_inference_statistics("decoder", as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0))


def test_a_stream_cancelled_mid_generation_stops_it_between_steps(
    server: ServerProcess, url: str, client: grpcclient.InferenceServerClient
) -> None:
    before = steps_run(client)
    answers: queue.Queue[object] = queue.Queue()
    streaming = grpcclient.InferenceServerClient(url)
    try:
        streaming.start_stream(callback=lambda result, error: answers.put(error or result))
        streaming.async_stream_infer("decoder", decoder_inputs(1, 1000))
        for _ in range(3):
            assert isinstance(answers.get(timeout=30), grpcclient.InferResult)
        streaming.stop_stream(cancel_requests=True)
    finally:
        streaming.close()
    deadline = time.monotonic() + 10
    while active_generations(server) != 0:
        assert time.monotonic() < deadline, "the cancelled generation still runs"
        time.sleep(0.05)
    assert 3 <= steps_run(client) - before < 1000  # it ended long before its 1000 steps
