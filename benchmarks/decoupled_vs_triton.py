"""Decoupled python models served by inferd and by Triton 2.51, side by side (issue 28): streamed
responses per second with server CPU per response, and the first-response latency of a new
stream while other streams are still generating.

    python benchmarks/decoupled_vs_triton.py --triton-venv /tmp/pytriton-venv     # 2 rounds
    python benchmarks/decoupled_vs_triton.py --rounds 1 --requests 5

Triton is found and prepared as benchmarks/python_vs_triton.py says (nvidia-pytriton 0.7.0's
tritonserver and python backend, Debian's python3-numpy for the stub). One repository, written
from Triton's python-backend API, is served unchanged by both servers; each model has one
KIND_CPU instance, ``max_batch_size: 0`` and ``model_transaction_policy { decoupled: true }``:

- ``tokens``: INT32 N [1] -> N responses OUT = [k] sent from ``execute``'s loop, then the final
  flag: Triton's decoupled example shape, the model's own cost near nothing, so what is measured
  is each server's way from the model's ``send`` to the client.
- ``generate``: the same N responses, each after a 5 ms wait (a stand-in for an engine's step),
  sent by a thread of the model's; ``execute`` returns at once (in-flight batching, as Triton's
  documentation shows it).

Throughput, with perf_analyzer as the load (C++, as every other benchmark here): ``--streaming``
over gRPC at each of ``--streams`` concurrencies (one stream per concurrent request), each
request ``N = --tokens`` to ``tokens``, read to its final flag. Responses per second are
perf_analyzer's requests per second times ``--tokens``; CPU = utime + stime of the server and of
its descendants (inferd's worker, Triton's stub), each, over the whole perf_analyzer run, per
response (the model's statistics count the requests run, each ``--tokens`` responses).

The same with tritonclient's Python stream, one client and one stream per thread (the same code
for both servers): ``--streams`` streams each send ``--requests`` requests, every response
checked. It is the load a Python user's own client puts on; on a 2-core machine its threads
spend about as much CPU per response as the server does, so it bounds what it measures, and the
table says its own CPU per response beside the server's.

Then the latency test on ``generate``: ``--probes`` requests of 1 token on a fresh stream, one at
a time, first with the server idle, then while ``--busy`` other streams each generate
``--busy-tokens`` tokens without pause; the time from the send to the first response, p50 and
p99 of each, and busy over idle.

Rounds (``--rounds``) alternate which server goes first; each server is started fresh for its
turn and stopped after it. Writes results.json and results.md into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shlex
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

import harness
import python_backend
import python_vs_triton as pvt
import server_usage

SERVERS = (pvt.INFERD, pvt.TRITON)
TOKENS_MODEL = "tokens"
GENERATE_MODEL = "generate"

TOKENS_PY = '''"""N responses OUT = [k], k = 0 .. N-1, from execute's loop, then the final flag."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for k in range(n):
                out = pb_utils.Tensor("OUT", np.array([k], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

GENERATE_PY = '''"""N responses OUT = [k], one every 5 ms, from a thread per request."""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def _generate(self, request):
        n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
        sender = request.get_response_sender()
        for k in range(n):
            time.sleep(0.005)
            out = pb_utils.Tensor("OUT", np.array([k], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def execute(self, requests):
        self.threads = [t for t in self.threads if t.is_alive()]
        for request in requests:
            thread = threading.Thread(target=self._generate, args=(request,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return None

    def finalize(self):
        for thread in self.threads:
            thread.join()
'''

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
model_transaction_policy {{ decoupled: true }}
"""


def write_repository(repository: Path) -> None:
    for name, source in ((TOKENS_MODEL, TOKENS_PY), (GENERATE_MODEL, GENERATE_PY)):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(source)
        (repository / name / "config.pbtxt").write_text(CONFIG.format(name=name))


class Stream:
    """One client with one open stream; requests on it are read to their final flag."""

    def __init__(self, port: int) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        self.answers: queue.Queue[tuple[float, Any]] = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.answers.put((time.perf_counter(), error or result))
        )

    def request(self, model: str, tokens: int) -> tuple[int, float]:
        """Sends one request; returns (responses, seconds from the send to the first)."""
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([tokens], dtype=np.int32))
        sent = time.perf_counter()
        self.client.async_stream_infer(model, [n], enable_empty_final_response=True)
        count, first = 0, 0.0
        while True:
            at, result = self.answers.get(timeout=120)
            if isinstance(result, Exception):
                raise result
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            if count == 0:
                first = at - sent
            value = int(result.as_numpy("OUT")[0])
            assert value == count, (value, count)
            count += 1
        assert count == tokens, (count, tokens)
        return count, first

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.stop_stream(cancel_requests=True)
        self.client.close()


def throughput(server: harness.Server, streams: int, requests: int, tokens: int) -> dict[str, Any]:
    """``streams`` streams, each ``requests`` requests of ``tokens`` tokens to TOKENS_MODEL."""
    opened = [Stream(server.port) for _ in range(streams)]
    start = threading.Barrier(streams + 1)
    done = threading.Barrier(streams + 1)
    counted: list[int] = []
    failures: list[BaseException] = []

    def run(stream: Stream) -> None:
        try:
            stream.request(TOKENS_MODEL, tokens)  # warm-up
            start.wait()
            for _ in range(requests):
                counted.append(stream.request(TOKENS_MODEL, tokens)[0])
        except BaseException as error:  # reported below; the barriers must not hang
            failures.append(error)
            start.abort()
        finally:
            with contextlib.suppress(threading.BrokenBarrierError):
                done.wait()

    threads = [threading.Thread(target=run, args=(s,)) for s in opened]
    for thread in threads:
        thread.start()
    try:
        start.wait()
        before, began = harness.process_ticks(server.process.pid), time.perf_counter()
        client_before = os.times()
        done.wait()
        seconds = time.perf_counter() - began
        client_after = os.times()
        after = harness.process_ticks(server.process.pid)
    finally:
        for thread in threads:
            thread.join()
        for stream in opened:
            stream.close()
    if failures:
        raise failures[0]
    total = sum(counted)
    per_response = 1e6 / os.sysconf("SC_CLK_TCK") / total
    own, children = after[0] - before[0], after[1] - before[1]
    return {
        "streams": streams,
        "responses": total,
        "seconds": seconds,
        "responses_per_s": total / seconds,
        "cpu_us_per_response": (own + children) * per_response,
        "server_cpu_us_per_response": own * per_response,
        "children_cpu_us_per_response": children * per_response,
        # This client's own threads, on the same cores.
        "client_cpu_us_per_response": 1e6
        * (client_after.user + client_after.system - client_before.user - client_before.system)
        / total,
    }


def throughput_pa(
    server: harness.Server,
    pa: harness.PerfAnalyzer,
    args: argparse.Namespace,
    streams: int,
    data: Path,
    log: Path,
) -> dict[str, Any]:
    """perf_analyzer --streaming at concurrency ``streams`` on TOKENS_MODEL, requests of
    ``args.tokens`` tokens; CPU per response over the whole run."""
    extra = ["--streaming", "--input-data", str(data), "--stability-percentage", "25"]
    statistics = server_usage.StatisticsClient(server.port)
    try:
        before = pvt.Probe(server.process.pid, statistics, TOKENS_MODEL)
        result = pa.measure(
            TOKENS_MODEL, server.port, streams, args.measurement_interval, extra, log
        )
        after = pvt.Probe(server.process.pid, statistics, TOKENS_MODEL)
    finally:
        statistics.close()
    if result.error is not None:
        raise RuntimeError(f"perf_analyzer on {TOKENS_MODEL}: {result.error}")
    usage = python_backend.window(server.process.pid, before, after)
    summary = result.summary()
    per_request = args.tokens

    def per_response(key: str) -> float | None:
        value = usage[key]
        return None if value is None else value / per_request

    return {
        "streams": streams,
        "requests_per_s": summary["infer_per_s"],
        "responses_per_s": summary["infer_per_s"] * per_request,
        "first_response_p50_us": summary["p50_us"],
        "first_response_p99_us": summary["p99_us"],
        "requests": usage["inferences"],
        "cpu_us_per_response": per_response("server_cpu_us_per_infer"),
        "server_cpu_us_per_response": per_response("server_process_us_per_infer"),
        "children_cpu_us_per_response": per_response("children_us_per_infer"),
        "load_generator_cores": usage["load_generator_cores"],
        "machine_cores": usage["machine_cores"],
        "command": summary["command"],
    }


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def first_response(
    server: harness.Server, probes: int, busy: int, busy_tokens: int
) -> dict[str, Any]:
    """First-response latency of 1-token requests to GENERATE_MODEL, idle and while ``busy``
    streams generate ``busy_tokens`` tokens each, one request after another."""
    probe = Stream(server.port)
    try:
        probe.request(GENERATE_MODEL, 1)  # warm-up
        idle = [probe.request(GENERATE_MODEL, 1)[1] for _ in range(probes)]
        stop = threading.Event()
        failures: list[BaseException] = []
        generated: list[int] = []

        def generate() -> None:
            stream = Stream(server.port)
            try:
                while not stop.is_set():
                    generated.append(stream.request(GENERATE_MODEL, busy_tokens)[0])
            except BaseException as error:
                failures.append(error)
            finally:
                stream.close()

        threads = [threading.Thread(target=generate) for _ in range(busy)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # every busy stream is generating
        busy_firsts = [probe.request(GENERATE_MODEL, 1)[1] for _ in range(probes)]
        stop.set()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
    finally:
        probe.close()
    idle_p50, busy_p50 = percentile(idle, 50), percentile(busy_firsts, 50)
    return {
        "busy_streams": busy,
        "idle_p50_ms": 1e3 * idle_p50,
        "idle_p99_ms": 1e3 * percentile(idle, 99),
        "busy_p50_ms": 1e3 * busy_p50,
        "busy_p99_ms": 1e3 * percentile(busy_firsts, 99),
        "busy_over_idle_p50": busy_p50 / idle_p50,
        "busy_responses": sum(generated),
    }


def start(
    name: str, args: argparse.Namespace, triton: pvt.Triton, repository: Path, log: Path
) -> harness.Server:
    if name == pvt.TRITON:
        server, _ = pvt.start_triton(
            triton, repository, [], log, models=(TOKENS_MODEL, GENERATE_MODEL)
        )
        return server
    return harness.start_server(harness.inferd_command(args.python, repository, []), log)


def median(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def throughput_table(report: dict[str, Any], key: str, client: bool) -> list[str]:
    head = (
        "| streams | inferd responses/s | Triton responses/s | ratio | inferd CPU µs/response "
        "(server + worker) | Triton CPU µs/response (server + stub) | CPU ratio |"
    )
    rule = "| --- | --- | --- | --- | --- | --- | --- |"
    if client:
        head += " client CPU µs/response, inferd / Triton |"
        rule += " --- |"
    lines = [head, rule]
    for streams in report["args"]["streams"]:
        rows = {
            s: [r for r in report[key] if r["server"] == s and r["streams"] == streams]
            for s in SERVERS
        }
        ours, theirs = (median(rows[s], "responses_per_s") for s in SERVERS)
        cpu = {s: median(rows[s], "cpu_us_per_response") for s in SERVERS}
        split = {
            s: f"{cpu[s]:.0f} ({median(rows[s], 'server_cpu_us_per_response'):.0f} + "
            f"{median(rows[s], 'children_cpu_us_per_response'):.0f})"
            for s in SERVERS
        }
        cpu_ratio = cpu[pvt.INFERD] / cpu[pvt.TRITON]
        line = (
            f"| {streams} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f} "
            f"| {split[pvt.INFERD]} | {split[pvt.TRITON]} | {cpu_ratio:.2f} |"
        )
        if client:
            own = [median(rows[s], "client_cpu_us_per_response") for s in SERVERS]
            line += f" {own[0]:.0f} / {own[1]:.0f} |"
        lines.append(line)
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = ["perf_analyzer --streaming:", ""]
    lines += throughput_table(report, "throughput", client=False)
    lines += ["", "tritonclient's Python stream, a thread per stream:", ""]
    lines += throughput_table(report, "python_client", client=True)
    lines += [
        "",
        "| server | idle first response p50 / p99 ms | busy p50 / p99 ms | busy / idle p50 |",
        "| --- | --- | --- | --- |",
    ]
    for server in SERVERS:
        rows = [r for r in report["latency"] if r["server"] == server]
        lines.append(
            f"| {pvt.TITLES[server]} | {median(rows, 'idle_p50_ms'):.2f} / "
            f"{median(rows, 'idle_p99_ms'):.2f} | {median(rows, 'busy_p50_ms'):.2f} / "
            f"{median(rows, 'busy_p99_ms'):.2f} | {median(rows, 'busy_over_idle_p50'):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--triton-venv", type=Path, default=Path("/tmp/pytriton-venv"))
    parser.add_argument("--stub-python", default="3.11")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=20, help="per Python stream, measured")
    parser.add_argument("--measurement-interval", type=int, default=4000, help="ms per window")
    parser.add_argument("--tokens", type=int, default=100, help="responses per request")
    parser.add_argument("--probes", type=int, default=40, help="first-response requests")
    parser.add_argument("--busy", type=int, default=4, help="streams generating meanwhile")
    parser.add_argument("--busy-tokens", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    # python_vs_triton.prepare_triton's options that this script leaves at their defaults.
    args.tritonserver = args.backend_directory = args.stub = args.triton_libs = None
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime(
        "decoupled-vs-triton-%Y%m%d-%H%M%S"
    )
    (out / "logs").mkdir(parents=True, exist_ok=True)
    machine = harness.machine_info(args.python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    pa = harness.PerfAnalyzer.find(args.python)
    throughput_rows: list[dict[str, Any]] = []
    client_rows: list[dict[str, Any]] = []
    latency_rows: list[dict[str, Any]] = []
    clock = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="inferd-decoupled-vs-triton-") as tmp:
        repository = Path(tmp) / "repository"
        write_repository(repository)
        data = Path(tmp) / "tokens.json"
        data.write_text(json.dumps({"data": [{"N": [args.tokens]}]}))
        triton = pvt.prepare_triton(args, Path(tmp))
        for round_ in range(1, args.rounds + 1):
            order = list(SERVERS) if round_ % 2 else list(reversed(SERVERS))
            for name in order:
                server = start(
                    name, args, triton, repository, out / "logs" / f"{name}-r{round_}.log"
                )
                try:
                    for streams in args.streams:
                        log = out / "logs" / f"pa-{name}-r{round_}-{streams}.log"
                        row = throughput_pa(server, pa, args, streams, data, log)
                        throughput_rows.append({"server": name, "round": round_, **row})
                        print(
                            f"round {round_} {name} {streams} streams (perf_analyzer): "
                            f"{row['responses_per_s']:,.0f} responses/s, "
                            f"{row['cpu_us_per_response']:.0f} µs CPU/response",
                            flush=True,
                        )
                    for streams in args.streams:
                        row = throughput(server, streams, args.requests, args.tokens)
                        client_rows.append({"server": name, "round": round_, **row})
                        print(
                            f"round {round_} {name} {streams} streams (Python client): "
                            f"{row['responses_per_s']:,.0f} responses/s, "
                            f"{row['cpu_us_per_response']:.0f} µs CPU/response, the client's "
                            f"{row['client_cpu_us_per_response']:.0f}",
                            flush=True,
                        )
                    row = first_response(server, args.probes, args.busy, args.busy_tokens)
                    latency_rows.append({"server": name, "round": round_, **row})
                    print(
                        f"round {round_} {name} first response: idle p50 "
                        f"{row['idle_p50_ms']:.2f} ms, busy p50 {row['busy_p50_ms']:.2f} ms",
                        flush=True,
                    )
                finally:
                    server.stop()
    report = {
        "started": started.isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - clock) / 60,
        "invocation": shlex.join([harness.relative(sys.executable), *sys.argv]),
        "machine": machine,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "throughput": throughput_rows,
        "python_client": client_rows,
        "latency": latency_rows,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (out / "results.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
