"""Measuring one candidate config: an inferd serving it (a child process this starts, or a running
server at ``--url`` told to load it), driven by the C++ load generator at each load point, with the
server's CPU and memory read from /proc for a child."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from google.protobuf import json_format, text_format

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core.load_generator import generate_load

START_TIMEOUT_S = 180.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class LoadPoint:
    """A closed loop of ``concurrency`` requests in flight, or (``rate`` > 0) Poisson arrivals at
    ``rate`` per second with at most ``concurrency`` in flight."""

    concurrency: int
    rate: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.rate:g}/s" if self.rate else f"c={self.concurrency}"


@dataclass(frozen=True)
class PointResult:
    load: LoadPoint
    throughput: float  # answered OK per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    requests: int
    errors: int  # answered with an error, plus (open loop) arrivals dropped
    first_error: str = ""

    @property
    def error_rate(self) -> float:
        total = self.requests + self.errors
        return self.errors / total if total else 1.0


@dataclass
class Measurement:
    """One candidate's figures: a point per load, and the server's cost (None where unmeasured:
    a server at --url is not this process's child)."""

    points: list[PointResult] = field(default_factory=list)
    cold_start_s: float | None = None
    cpu_us_per_inference: float | None = None
    memory_mib: float | None = None
    failure: str = ""  # the candidate could not be served (its load failed)


def run_point(target: str, requests: list[bytes], load: LoadPoint, window_s: float) -> PointResult:
    """One load point, driven by the C++ load generator (the GIL released while it runs)."""
    outcome = generate_load(
        target,
        requests,
        concurrency=load.concurrency,
        rate=load.rate,
        warmup_s=min(1.0, window_s / 2),
        measure_s=window_s,
    )
    latencies = np.asarray(outcome.latencies_ns, dtype=np.float64) / 1e6
    if len(latencies) == 0:
        latencies = np.asarray([np.inf])
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    answered = len(outcome.latencies_ns)
    dropped = "arrivals dropped: the load generator's limit" if outcome.dropped else ""
    return PointResult(
        load,
        answered / outcome.seconds if outcome.seconds else 0.0,
        float(p50),
        float(p95),
        float(p99),
        answered,
        outcome.errors + outcome.dropped,
        outcome.first_error or dropped,
    )


def _ticks(pid: int) -> int:
    """utime + stime of ``pid`` and its waited-for children (a python model's workers)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15])


def _peak_rss_mib(pid: int) -> float | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


class ChildServer:
    """``inferd serve`` on a repository of one model, as a child process of this one."""

    def __init__(self, repository: Path, log: Path) -> None:
        self.log = log
        command = [
            sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository),
            "--grpc-port", "0", "--host", "127.0.0.1", "--http-port", "off",
            "--metrics-port", "off", "--log-format", "json",
        ]  # fmt: skip
        started = time.monotonic()
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.port = self._wait_started()
        self.cold_start_s = time.monotonic() - started

    def _wait_started(self) -> int:
        assert self.process.stderr is not None
        timer = threading.Timer(START_TIMEOUT_S, self.process.kill)
        timer.start()
        lines: list[str] = []
        try:
            with self.log.open("w") as sink:
                for line in self.process.stderr:
                    sink.write(line)
                    lines.append(line)
                    with contextlib.suppress(json.JSONDecodeError, AttributeError, KeyError):
                        event = json.loads(line)
                        if event.get("event") == "server started":
                            threading.Thread(target=self._drain, daemon=True).start()
                            return int(event["port"])
        finally:
            timer.cancel()
        self.process.wait()
        errors = [line for line in lines if '"error"' in line] or lines[-3:]
        raise RuntimeError(f"the server did not start: {''.join(errors).strip()[-600:]}")

    def _drain(self) -> None:
        assert self.process.stderr is not None
        with self.log.open("a") as sink:
            for line in self.process.stderr:
                sink.write(line)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def write_repository(root: Path, name: str, config: ModelConfig, model_file: Path) -> Path:
    """A repository of one model, version 1: ``config`` and ``model_file``."""
    version = root / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    target = version / model_file.name
    if not target.exists():
        # A hard link, or a copy: the server refuses a model file that resolves outside its
        # model's folder (a symbolic link would).
        try:
            os.link(model_file, target)
        except OSError:
            shutil.copyfile(model_file, target)
    (root / name / "config.pbtxt").write_text(text_format.MessageToString(config))
    return root


def measure_child(
    repository: Path, name: str, requests: list[bytes], loads: list[LoadPoint], window_s: float,
    log: Path,
) -> Measurement:  # fmt: skip
    """Starts an inferd on ``repository``, measures every load point, stops it."""
    try:
        server = ChildServer(repository, log)
    except RuntimeError as e:
        return Measurement(failure=str(e))
    measurement = Measurement(cold_start_s=server.cold_start_s)
    try:
        before = _ticks(server.process.pid)
        for load in loads:
            measurement.points.append(
                run_point(f"127.0.0.1:{server.port}", requests, load, window_s)
            )
        answered = sum(p.requests + p.errors for p in measurement.points)
        used = (_ticks(server.process.pid) - before) / CLK_TCK
        # Warm-up requests ran too: spread over what was answered in the windows, the CPU per
        # inference errs high by at most the warm-ups' share.
        measurement.cpu_us_per_inference = used * 1e6 / answered if answered else None
        measurement.memory_mib = _peak_rss_mib(server.process.pid)
    finally:
        server.stop()
    return measurement


@contextlib.contextmanager
def _channel(url: str) -> Iterator[GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(url)
    try:
        yield GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


def measure_remote(
    url: str, name: str, config: ModelConfig, requests: list[bytes], loads: list[LoadPoint],
    window_s: float,
) -> Measurement:  # fmt: skip
    """Loads ``config`` for model ``name`` on the server at ``url`` (Triton's load with a config
    override: the server must allow model control, --model-control-mode explicit) and measures it.
    Its CPU and memory are not this process's to read."""
    override = json_format.MessageToJson(config, preserving_proto_field_name=True)
    request = pb.RepositoryModelLoadRequest(model_name=name)
    request.parameters["config"].string_param = override
    with _channel(url) as stub:
        started = time.monotonic()
        try:
            stub.RepositoryModelLoad(request, timeout=START_TIMEOUT_S)
        except grpc.RpcError as e:
            return Measurement(failure=f"load refused: {e.details()}")
        measurement = Measurement(cold_start_s=time.monotonic() - started)
    for load in loads:
        measurement.points.append(run_point(url, requests, load, window_s))
    return measurement
