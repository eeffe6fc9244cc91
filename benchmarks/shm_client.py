"""A load generator for benchmarks/shared_memory.py (``--load-generator python``): CLIENTS threads,
each with its own gRPC channel to inferd's Unix socket and, in shm mode, its own input and
output region, send ModelInfer to the FP32 identity model back to back; every answer is checked
against the client's own input (a value per client), so a request that read or wrote another
client's region is counted as wrong. Prints one JSON object: infer/s, p50/p99/mean latency in µs
over the measured seconds (after a warm-up), answers, wrong answers, errors.

    python benchmarks/shm_client.py --socket /tmp/inferd.sock --elements 1048576 --mode shm

Regions are made with multiprocessing.shared_memory (POSIX shm_open; tritonclient's own
utils.shared_memory needs pkg_resources, which this venv's setuptools no longer has) and
registered with tritonclient's register_system_shared_memory; unregistered and unlinked at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

MODEL = "identity"


class Client:
    """One client: a channel, its input (filled with its own value) and, for shm, its regions."""

    def __init__(self, index: int, socket: str, elements: int, mode: str) -> None:
        self.index = index
        self.mode = mode
        self.client = grpcclient.InferenceServerClient(f"unix://{socket}")
        self.data = np.full((1, elements), float(index + 1), dtype=np.float32)
        self.nbytes = self.data.nbytes
        self.regions: list[shared_memory.SharedMemory] = []
        self.input = grpcclient.InferInput("INPUT0", list(self.data.shape), "FP32")
        self.output = grpcclient.InferRequestedOutput("OUTPUT0")
        if mode == "shm":
            tag = f"bench{os.getpid()}_{index}"
            shm_in = shared_memory.SharedMemory(create=True, size=self.nbytes)
            shm_out = shared_memory.SharedMemory(create=True, size=self.nbytes)
            self.regions = [shm_in, shm_out]
            np.ndarray(self.data.shape, np.float32, shm_in.buf)[:] = self.data
            self.client.register_system_shared_memory(f"{tag}_in", "/" + shm_in.name, self.nbytes)
            self.client.register_system_shared_memory(f"{tag}_out", "/" + shm_out.name, self.nbytes)
            self.input.set_shared_memory(f"{tag}_in", self.nbytes)
            self.output.set_shared_memory(f"{tag}_out", self.nbytes)
            self.names = [f"{tag}_in", f"{tag}_out"]
        else:
            self.input.set_data_from_numpy(self.data)
        self.latencies_ns: list[int] = []
        self.answers = self.wrong = self.errors = 0
        self.last_error = ""

    def infer_once(self) -> bool:
        """One request; True when the answer is this client's data."""
        result = self.client.infer(MODEL, [self.input], outputs=[self.output])
        if self.mode == "shm":
            out = np.ndarray(self.data.shape, np.float32, self.regions[1].buf)
            # The client's value everywhere: a cheap full check (min and max), then clear one
            # element so that a request that wrote nothing is caught next time.
            ok = bool(out.min() == out.max() == self.index + 1)
            out[0, 0] = 0.0
            return ok
        got = result.as_numpy("OUTPUT0")
        return got is not None and bool(got.min() == got.max() == self.index + 1)

    def run(self, start_measuring: float, stop: float) -> None:
        while True:
            began = time.perf_counter_ns()
            if began / 1e9 >= stop:
                return
            try:
                ok = self.infer_once()
            except Exception as e:  # counted, and the run goes on: the report says how many
                self.errors += 1
                self.last_error = str(e)[:300]
                continue
            ended = time.perf_counter_ns()
            if began / 1e9 >= start_measuring:
                self.latencies_ns.append(ended - began)
                self.answers += 1
                self.wrong += 0 if ok else 1

    def close(self) -> None:
        if self.regions:
            for name in self.names:
                self.client.unregister_system_shared_memory(name)
            for region in self.regions:
                region.close()
                region.unlink()
        self.client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--elements", type=int, required=True, help="FP32 elements per tensor")
    parser.add_argument("--mode", choices=("raw", "shm"), required=True)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    args = parser.parse_args()
    clients = [Client(i, args.socket, args.elements, args.mode) for i in range(args.clients)]
    try:
        now = time.perf_counter()
        start, stop = now + args.warmup, now + args.warmup + args.seconds
        threads = [threading.Thread(target=c.run, args=(start, stop)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for client in clients:
            client.close()
    latencies = np.array([x for c in clients for x in c.latencies_ns], dtype=np.float64) / 1e3
    answers = sum(c.answers for c in clients)
    report: dict[str, Any] = {
        "infer_per_s": answers / args.seconds,
        "p50_us": float(np.percentile(latencies, 50)) if answers else None,
        "p99_us": float(np.percentile(latencies, 99)) if answers else None,
        "avg_us": float(latencies.mean()) if answers else None,
        "answers": answers,
        "wrong": sum(c.wrong for c in clients),
        "errors": sum(c.errors for c in clients),
        "last_error": next((c.last_error for c in clients if c.last_error), ""),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
