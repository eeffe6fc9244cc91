"""The load generator of benchmarks/ensemble.py (issue 16): the same client measures a 3-step
chain served as an ensemble and the client calling the three models itself.

    python benchmarks/ensemble_client.py --target 127.0.0.1:8001 --shape ensemble --clients 8
    python benchmarks/ensemble_client.py --target unix:/tmp/inferd.sock --shape client-chain

CLIENTS threads, each with its own gRPC channel and raw KServe v2 stub (tritonclient's generated
``service_pb2_grpc``, no tritonclient wrapper: the client's own CPU per call stays small and is
the same code in both shapes), send back to back:

  ensemble      one ModelInfer to ``chain`` per inference
  client-chain  ModelInfer to ``add_one``, its OUTPUT0 bytes as ``scale``'s INPUT0, ``scale``'s
                OUTPUT0 bytes as ``squash``'s INPUT0: three calls per inference

Every final answer is compared with numpy (``expected``). After ``--warmup`` seconds the client
prints ``measuring`` (the parent samples the server then), after ``--seconds`` more ``stopped``,
then one JSON object: complete inferences (chains) per second, p50/p99/mean latency per inference
in µs (first send to last answer), per call p50 in client-chain, wrong answers, errors, and this
process's CPU and context switches (getrusage) over the measured seconds. Only inferences that
started and ended inside the measured seconds count.
"""

from __future__ import annotations

import argparse
import json
import resource
import threading
import time
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from tritonclient.grpc import service_pb2, service_pb2_grpc

ENSEMBLE = "chain"
STEPS = ("add_one", "scale", "squash")  # the chain's composing models, in order
ELEMENTS = 16
SHAPES = ("ensemble", "client-chain")
VARIANTS = 8  # distinct inputs per client, cycled; each answer is checked against its own
ATOL, RTOL = 1e-6, 1e-5  # ONNX Runtime's tanh and numpy's may differ in the last bits

Array = npt.NDArray[np.float32]


def expected(x: Array) -> Array:
    """What the chain computes: add_one (x + 1), scale (MatMul by 2 I), squash (tanh)."""
    return np.tanh((x + np.float32(1)) * np.float32(2)).astype(np.float32)


def request(model: str, input_name: str, data: bytes) -> Any:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name=input_name, datatype="FP32", shape=[1, ELEMENTS]
    )
    return service_pb2.ModelInferRequest(
        model_name=model, inputs=[tensor], raw_input_contents=[data]
    )


def cpu_and_switches() -> tuple[float, int]:
    """This process's CPU seconds and context switches (every thread's, voluntary or not)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


class Client:
    """One client: a channel, a stub, its inputs with their expected answers, its figures."""

    def __init__(self, index: int, target: str, shape: str) -> None:
        self.shape = shape
        self.channel = grpc.insecure_channel(target)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        rng = np.random.default_rng(index)
        inputs = [rng.uniform(-1, 1, (1, ELEMENTS)).astype(np.float32) for _ in range(VARIANTS)]
        self.expected = [expected(x) for x in inputs]
        first_model, first_input = (
            (ENSEMBLE, "INPUT") if shape == "ensemble" else (STEPS[0], "INPUT0")
        )
        self.first = [request(first_model, first_input, x.tobytes()) for x in inputs]
        self.latencies_ns: list[int] = []
        self.step_latencies_ns: list[list[int]] = [[] for _ in STEPS]
        self.answers = self.wrong = self.errors = 0
        self.last_error = ""

    def infer_once(self, variant: int, step_ns: list[int]) -> bytes:
        """One inference; its final output's bytes. ``step_ns``: each call's duration."""
        if self.shape == "ensemble":
            return bytes(self.stub.ModelInfer(self.first[variant]).raw_output_contents[0])
        message = self.first[variant]
        for step in range(len(STEPS)):
            began = time.perf_counter_ns()
            answer = self.stub.ModelInfer(message).raw_output_contents[0]
            step_ns.append(time.perf_counter_ns() - began)
            if step + 1 < len(STEPS):
                message = request(STEPS[step + 1], "INPUT0", answer)
        return bytes(answer)

    def run(self, start_measuring: float, stop: float) -> None:
        variant = 0
        while True:
            began = time.perf_counter_ns()
            if began / 1e9 >= stop:
                return
            variant = (variant + 1) % VARIANTS
            step_ns: list[int] = []
            try:
                answer = self.infer_once(variant, step_ns)
            except grpc.RpcError as e:  # counted, and the run goes on: the report says how many
                self.errors += 1
                self.last_error = f"{e.code()}: {e.details()}"[:300]  # type: ignore[attr-defined]
                continue
            ended = time.perf_counter_ns()
            if began / 1e9 < start_measuring or ended / 1e9 > stop:
                continue
            got = np.frombuffer(answer, dtype=np.float32).reshape(1, ELEMENTS)
            self.wrong += 0 if np.allclose(got, self.expected[variant], RTOL, ATOL) else 1
            self.answers += 1
            self.latencies_ns.append(ended - began)
            for step, ns in enumerate(step_ns):
                self.step_latencies_ns[step].append(ns)


def percentile_us(values_ns: list[int], q: float) -> float | None:
    return (
        float(np.percentile(np.array(values_ns, dtype=np.float64), q)) / 1e3 if values_ns else None
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True, help="HOST:PORT or unix:PATH")
    parser.add_argument("--shape", choices=SHAPES, required=True)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    args = parser.parse_args()
    clients = [Client(i, args.target, args.shape) for i in range(args.clients)]
    now = time.perf_counter()
    start, stop = now + args.warmup, now + args.warmup + args.seconds
    threads = [threading.Thread(target=c.run, args=(start, stop)) for c in clients]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, start - time.perf_counter()))
    cpu_start, switches_start = cpu_and_switches()
    print("measuring", flush=True)
    time.sleep(max(0.0, stop - time.perf_counter()))
    cpu_end, switches_end = cpu_and_switches()
    cpu_s, switches = cpu_end - cpu_start, switches_end - switches_start
    print("stopped", flush=True)
    for thread in threads:
        thread.join()
    for client in clients:
        client.channel.close()
    latencies = [ns for c in clients for ns in c.latencies_ns]
    answers = sum(c.answers for c in clients)
    report: dict[str, Any] = {
        "shape": args.shape,
        "clients": args.clients,
        "seconds": args.seconds,
        "infer_per_s": answers / args.seconds,
        "p50_us": percentile_us(latencies, 50),
        "p99_us": percentile_us(latencies, 99),
        "avg_us": float(np.mean(latencies)) / 1e3 if latencies else None,
        "step_p50_us": [
            percentile_us([ns for c in clients for ns in c.step_latencies_ns[s]], 50)
            for s in range(len(STEPS))
        ]
        if args.shape == "client-chain"
        else [],
        "answers": answers,
        "calls": answers * (1 if args.shape == "ensemble" else len(STEPS)),
        "wrong": sum(c.wrong for c in clients),
        "errors": sum(c.errors for c in clients),
        "last_error": next((c.last_error for c in clients if c.last_error), ""),
        "client_cpu_s": cpu_s,
        "client_cores": cpu_s / args.seconds,
        "client_cpu_us_per_infer": cpu_s * 1e6 / answers if answers else None,
        "client_switches_per_infer": switches / answers if answers else None,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
