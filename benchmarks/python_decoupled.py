"""A decoupled python model's streamed responses (issue 17): responses per second, time to first
response, and server CPU per response (the server process and its python worker together).

    python benchmarks/python_decoupled.py                     # 1 and 16 streams, 100 tokens each
    python benchmarks/python_decoupled.py --streams 1 --tokens 20 --requests 5

Serves the `generate` example (``inferd make-examples``: a decoupled python model, one worker,
one BYTES token per response) and drives it with tritonclient: one client and one stream per
thread, each sending ``--requests`` requests one after another (``MAX_TOKENS`` = ``--tokens``,
``enable_empty_final_response``), each waited for to its final flag; every token is checked.
Server CPU is read from /proc (utime + stime of the server and of its children) around the
measured requests, after a warm-up request per stream. Prints a markdown table and writes
results.json into ``--out`` (default benchmarks/out/python-decoupled-<timestamp>/).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

import harness
from inferd.examples import make_examples

PROMPT = b"to be or not to be that is the question"


def one_request(client: Any, responses: queue.Queue[Any], tokens: int) -> tuple[int, float]:
    """Sends one request and reads its stream to the final flag: (responses, seconds to first)."""
    inputs = [
        grpcclient.InferInput("PROMPT", [1], "BYTES"),
        grpcclient.InferInput("MAX_TOKENS", [1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([PROMPT], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([tokens], dtype=np.int32))
    words = PROMPT.split()
    start = time.perf_counter()
    client.async_stream_infer("generate", inputs, enable_empty_final_response=True)
    first = 0.0
    count = 0
    while True:
        result = responses.get(timeout=60)
        if isinstance(result, Exception):
            raise result
        if count == 0:
            first = time.perf_counter() - start
        token = result.as_numpy("TOKEN")
        if token is not None:
            assert token[0] == words[count % len(words)], (token, count)
            count += 1
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    assert count == tokens, (count, tokens)
    return count, first


def run(port: int, pid: int, streams: int, requests: int, tokens: int) -> dict[str, Any]:
    barrier = threading.Barrier(streams + 1)
    done = threading.Barrier(streams + 1)
    firsts: list[float] = []
    counted: list[int] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def stream() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        responses: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put(error or result))
        try:
            one_request(client, responses, tokens)  # warm-up
            barrier.wait()
            for _ in range(requests):
                count, first = one_request(client, responses, tokens)
                with lock:
                    firsts.append(first)
                    counted.append(count)
        except BaseException as error:  # reported below; the barrier must not hang
            failures.append(error)
            barrier.abort()
        finally:
            with contextlib.suppress(threading.BrokenBarrierError):
                done.wait()
            client.stop_stream()
            client.close()

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for thread in threads:
        thread.start()
    barrier.wait()
    ticks, start = sum(harness.process_ticks(pid)), time.perf_counter()
    done.wait()
    seconds, ticks = time.perf_counter() - start, sum(harness.process_ticks(pid)) - ticks
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    total = sum(counted)
    firsts.sort()
    return {
        "streams": streams,
        "tokens_per_request": tokens,
        "requests": len(counted),
        "responses": total,
        "seconds": seconds,
        "responses_per_s": total / seconds,
        "first_response_p50_ms": 1e3 * firsts[len(firsts) // 2],
        "first_response_p99_ms": 1e3 * firsts[min(len(firsts) - 1, int(0.99 * len(firsts)))],
        "server_cpu_us_per_response": 1e6 * ticks / os.sysconf("SC_CLK_TCK") / total,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=20, help="per stream, measured")
    parser.add_argument("--tokens", type=int, default=100, help="responses per request")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path("benchmarks/out") / time.strftime("python-decoupled-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        repository = Path(root) / "models"
        make_examples(repository)
        command = harness.inferd_command(
            args.python,
            repository,
            ["--model-control-mode", "explicit", "--load-model", "generate"],
        )
        server = harness.start_server(command, out / "server.log")
        try:
            rows = [
                run(server.port, server.pid, s, args.requests, args.tokens) for s in args.streams
            ]
        finally:
            server.stop()
    report = {"machine": harness.machine_info(args.python), "command": sys.argv, "rows": rows}
    (out / "results.json").write_text(json.dumps(report, indent=2))
    print(
        "| streams | responses/s | first response p50 / p99 (ms) | server CPU per response (µs) |"
    )
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['responses_per_s']:.0f} | {r['first_response_p50_ms']:.1f} / "
            f"{r['first_response_p99_ms']:.1f} | {r['server_cpu_us_per_response']:.0f} |"
        )
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
