"""The GPU check's tables (run by benchmarks/gpu_check.sh; runs on a CPU machine too, where the GPU
rows say why they did not run).

Correctness: each executor runs two models (``mlp``: FP32 [b,512] -> 2048 -> 2048 -> 10, ReLU;
``conv``: FP32 [b,3,32,32] -> conv3x3(16) -> ReLU -> conv3x3/2(32) -> ReLU -> global average
pool -> 10) on fresh random inputs; the answer is compared with a float64 reference computed
with numpy from the same weights, by relative error max|y - ref| / max|ref| (FP32 must stay under
1e-3; FP16 and TF32 within 1e-2). inferd's executors run through the same classes the server uses
(OnnxRuntimeExecutor with the instance's placement, IOBinding and stream); PyTorch on CUDA is the
raw-engine reference.

Throughput: rows/s at batch 1, 8, 32 and max (64), raw (the engine called in-process, in a loop)
and served (an inferd server subprocess with the model on that executor, driven through gRPC by
``--clients`` concurrent callers sending requests of that batch size), and their ratio.

    python benchmarks/gpu_check.py --out benchmarks/out/gpu-check [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import harness  # benchmarks/ is on sys.path when a script here runs

ROOT = Path(__file__).resolve().parent.parent
BATCHES = (1, 8, 32, 64)
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 1e-2}


# --- models and their float64 reference ---------------------------------------------------------


@dataclass
class Model:
    name: str
    input_shape: tuple[int, ...]  # without the batch dim
    weights: dict[str, np.ndarray]
    graph_nodes: list[Any]
    output_width: int = 10

    def onnx_bytes(self) -> bytes:
        graph = helper.make_graph(
            self.graph_nodes,
            self.name,
            [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", *self.input_shape])],
            [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", self.output_width])],
            initializer=[numpy_helper.from_array(w, name) for name, w in self.weights.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model.SerializeToString()

    def reference(self, x: np.ndarray) -> np.ndarray:
        w = {k: v.astype(np.float64) for k, v in self.weights.items()}
        h = x.astype(np.float64)
        if self.name == "mlp":
            h = np.maximum(h @ w["W0"] + w["B0"], 0)
            h = np.maximum(h @ w["W1"] + w["B1"], 0)
            return h @ w["W2"] + w["B2"]
        h = np.maximum(_conv2d(h, w["C0"], w["D0"], stride=1), 0)
        h = np.maximum(_conv2d(h, w["C1"], w["D1"], stride=2), 0)
        h = h.mean(axis=(2, 3))
        return h @ w["W"].T + w["B"]


def _conv2d(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """NCHW convolution, padding 1 (as the ONNX graph's pads), in float64."""
    k = kernel.shape[-1]
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]
    return np.einsum("bchwij,ocij->bohw", windows, kernel) + bias[None, :, None, None]


def make_models(rng: np.random.Generator) -> list[Model]:
    def dense(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
        scale = np.sqrt(2.0 / n_in)
        w = (rng.standard_normal((n_in, n_out)) * scale).astype(np.float32)
        return w, (rng.standard_normal(n_out) * 0.01).astype(np.float32)

    (w0, b0), (w1, b1), (w2, b2) = dense(512, 2048), dense(2048, 2048), dense(2048, 10)
    mlp_nodes = [
        helper.make_node("MatMul", ["INPUT0", "W0"], ["m0"]),
        helper.make_node("Add", ["m0", "B0"], ["a0"]),
        helper.make_node("Relu", ["a0"], ["h0"]),
        helper.make_node("MatMul", ["h0", "W1"], ["m1"]),
        helper.make_node("Add", ["m1", "B1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node("MatMul", ["h1", "W2"], ["m2"]),
        helper.make_node("Add", ["m2", "B2"], ["OUTPUT0"]),
    ]
    mlp = Model(
        "mlp", (512,), {"W0": w0, "B0": b0, "W1": w1, "B1": b1, "W2": w2, "B2": b2}, mlp_nodes
    )

    def kernel(c_out: int, c_in: int) -> np.ndarray:
        scale = np.sqrt(2.0 / (c_in * 9))
        return (rng.standard_normal((c_out, c_in, 3, 3)) * scale).astype(np.float32)

    conv_weights = {
        "C0": kernel(16, 3),
        "D0": np.zeros(16, np.float32),
        "C1": kernel(32, 16),
        "D1": np.zeros(32, np.float32),
        "W": (rng.standard_normal((10, 32)) * 0.25).astype(np.float32),
        "B": np.zeros(10, np.float32),
    }
    conv_nodes = [
        helper.make_node("Conv", ["INPUT0", "C0", "D0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "C1", "D1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "W", "B"], ["OUTPUT0"], transB=1),
    ]
    return [mlp, Model("conv", (3, 32, 32), conv_weights, conv_nodes)]


# --- engines --------------------------------------------------------------------------------------


@dataclass
class Engine:
    """One way to run a model: ``make(model, path)`` returns a callable batch -> output."""

    name: str
    precision: str
    served_config: str | None  # the config.pbtxt tail that puts a served model on it
    absent: str | None  # why it cannot run here; None when it can
    make: Callable[[Model, Path], Callable[[np.ndarray], np.ndarray]] = field(repr=False)


def _inferd_executor(placement: Any, accelerator: Any) -> Callable[[Model, Path], Any]:
    def make(model: Model, path: Path) -> Callable[[np.ndarray], np.ndarray]:
        from inferd.batching import HostBufferPool
        from inferd.executors import OnnxRuntimeExecutor, OnnxRuntimeOptions

        executor = OnnxRuntimeExecutor(
            path,
            ["INPUT0"],
            ["OUTPUT0"],
            OnnxRuntimeOptions(max(1, (os.cpu_count() or 2) - 1), 1),
            placement=placement,
            accelerator=accelerator,
            host_pool=HostBufferPool(1 << 30),
        )
        return lambda x: executor.execute([x])[0]

    return make


def _torch_engine(precision: str) -> Callable[[Model, Path], Any]:
    def make(model: Model, path: Path) -> Callable[[np.ndarray], np.ndarray]:
        import torch
        import torch.nn.functional as F

        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        dtype = torch.float16 if precision == "fp16" else torch.float32
        w = {k: torch.from_numpy(v).to("cuda", dtype) for k, v in model.weights.items()}

        @torch.inference_mode()
        def run(x: np.ndarray) -> np.ndarray:
            h = torch.from_numpy(x).to("cuda", dtype, non_blocking=True)
            if model.name == "mlp":
                h = F.relu(h @ w["W0"] + w["B0"])
                h = F.relu(h @ w["W1"] + w["B1"])
                h = h @ w["W2"] + w["B2"]
            else:
                h = F.relu(F.conv2d(h, w["C0"], w["D0"], padding=1))
                h = F.relu(F.conv2d(h, w["C1"], w["D1"], padding=1, stride=2))
                h = F.linear(h.mean(dim=(2, 3)), w["W"], w["B"])
            return h.float().cpu().numpy()

        return run

    return make


def _native_tensorrt(precision: str) -> Callable[[Model, Path], Any]:
    """inferd's TensorRT executor, made the way the server makes it (create_executors)."""

    def make(model: Model, path: Path) -> Callable[[np.ndarray], np.ndarray]:
        from google.protobuf import text_format

        import inferd._proto.model_config_pb2 as model_config_pb2
        from inferd.batching import HostBufferPool
        from inferd.executors import OnnxRuntimeOptions
        from inferd.executors.selection import create_executors
        from inferd.repository import GpuAccelerator, InstancePlacement

        config = model_config_pb2.ModelConfig()
        text_format.Parse(
            f'name: "{model.name}" max_batch_size: 64 '
            'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: '
            f"{list(model.input_shape)} }}] "
            'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [10] }] '
            'parameters { key: "inferd.executor" value { string_value: "tensorrt" } }',
            config,
        )
        accelerator = GpuAccelerator(
            "tensorrt", {"precision_mode": "FP16"} if precision == "fp16" else {}
        )
        (executor,) = create_executors(
            config,
            path,
            [InstancePlacement("gpu", 0)],
            accelerator,
            OnnxRuntimeOptions(1, 1),
            HostBufferPool(1 << 30),
            path.parent / "engines",
        )
        return lambda x: executor.execute([x])[0]

    return make


def engines() -> list[Engine]:
    import onnxruntime as ort

    from inferd.batching import cuda_device_count, cuda_runtime_description
    from inferd.repository import GpuAccelerator, InstancePlacement

    providers = ort.get_available_providers()
    gpus = cuda_device_count()
    no_gpu = None if gpus else f"no CUDA device ({cuda_runtime_description()})"

    def need(provider: str) -> str | None:
        if no_gpu:
            return no_gpu
        return (
            None if provider in providers else f"{provider} absent (onnxruntime-gpu not installed)"
        )

    gpu0 = InstancePlacement("gpu", 0)
    trt = 'optimization { execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt"'
    try:
        import torch

        torch_absent = None if torch.cuda.is_available() else "PyTorch sees no CUDA device"
    except ImportError:
        torch_absent = "PyTorch not installed"
    try:
        import tensorrt  # noqa: F401

        native_absent = no_gpu
    except ImportError:
        native_absent = "tensorrt not installed"
    native = 'parameters { key: "inferd.executor" value { string_value: "tensorrt" } }'
    gpu_group = "instance_group [{ kind: KIND_GPU gpus: [0] }]"
    return [
        Engine(
            "inferd onnxruntime CPU", "fp32", "instance_group [{ kind: KIND_CPU }]", None,
            _inferd_executor(InstancePlacement("cpu"), None),
        ),
        Engine(
            "inferd onnxruntime CUDA", "fp32", gpu_group, need("CUDAExecutionProvider"),
            _inferd_executor(gpu0, None),
        ),
        Engine(
            "inferd onnxruntime TensorRT", "fp32", f"{gpu_group} {trt} }}] }} }}",
            need("TensorrtExecutionProvider"),
            _inferd_executor(gpu0, GpuAccelerator("tensorrt")),
        ),
        Engine(
            "inferd onnxruntime TensorRT", "fp16",
            f'{gpu_group} {trt} parameters {{ key: "precision_mode" value: "FP16" }} }}] }} }}',
            need("TensorrtExecutionProvider"),
            _inferd_executor(gpu0, GpuAccelerator("tensorrt", {"precision_mode": "FP16"})),
        ),
        Engine(
            "inferd native TensorRT", "fp32", f"{gpu_group} {native}", native_absent,
            _native_tensorrt("fp32"),
        ),
        Engine(
            "inferd native TensorRT", "fp16",
            f'{gpu_group} {native} {trt} parameters {{ key: "precision_mode" value: "FP16" }} '
            "}] } }",
            native_absent, _native_tensorrt("fp16"),
        ),
        Engine("PyTorch CUDA (raw)", "fp32", None, torch_absent, _torch_engine("fp32")),
        Engine("PyTorch CUDA (raw)", "tf32", None, torch_absent, _torch_engine("tf32")),
        Engine("PyTorch CUDA (raw)", "fp16", None, torch_absent, _torch_engine("fp16")),
    ]  # fmt: skip


# --- measuring ------------------------------------------------------------------------------------


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def raw_rows_per_s(run: Callable[[np.ndarray], np.ndarray], x: np.ndarray, seconds: float) -> float:
    for _ in range(3):
        run(x)  # warm-up (first-run allocations, kernel selection)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        run(x)  # each call returns host memory: it includes the device's copies and sync
        count += 1
    return count * x.shape[0] / (time.perf_counter() - started)


def served_rows_per_s(
    model: Model, engine: Engine, repository: Path, batch: int, clients: int, seconds: float
) -> float:
    """An inferd server with the model on ``engine``, driven by ``clients`` gRPC callers."""
    import grpc

    import inferd._proto.grpc_service_pb2 as pb
    import inferd._proto.grpc_service_pb2_grpc as pb_grpc

    folder = repository / f"{model.name}_served"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(model.onnx_bytes())
    (folder / "config.pbtxt").write_text(
        f"max_batch_size: 64 dynamic_batching {{ }}\n{engine.served_config}\n"
    )
    command = harness.inferd_command(
        sys.executable,
        repository,
        ["--model-control-mode", "explicit", "--load-model", folder.name, "--metrics-port", "-1"],
    )
    server = harness.start_server(command, repository / f"server-{model.name}.log", timeout=120)
    port = server.port
    with harness.running(server):
        x = np.random.default_rng(0).standard_normal((batch, *model.input_shape)).astype(np.float32)
        request = pb.ModelInferRequest(model_name=folder.name, raw_input_contents=[x.tobytes()])
        request.inputs.add(name="INPUT0", datatype="FP32", shape=list(x.shape))
        rows = [0] * clients
        stop = time.monotonic() + seconds + 1.0

        def call(index: int) -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                stub.ModelInfer(request, timeout=60)  # warm-up
                begin = time.monotonic() + 1.0  # measure after a second of load
                while (now := time.monotonic()) < stop:
                    stub.ModelInfer(request, timeout=60)
                    if now >= begin:
                        rows[index] += batch

        threads = [threading.Thread(target=call, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(rows) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "gpu-check")
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput figure")
    parser.add_argument("--clients", type=int, default=4, help="concurrent gRPC callers")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    models = make_models(np.random.default_rng(int(time.time())))  # fresh weights each run
    rng = np.random.default_rng(int(time.time() * 1000) % 2**32)  # and fresh inputs
    all_engines = engines()
    correctness: list[dict[str, Any]] = []
    throughput: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="inferd-gpu-check-") as tmp:
        repository = Path(tmp) / "models"
        repository.mkdir()
        for model in models:
            path = Path(tmp) / f"{model.name}.onnx"
            path.write_bytes(model.onnx_bytes())
            for engine in all_engines:
                label = f"{engine.name} {engine.precision}"
                if engine.absent:
                    correctness.append(
                        {"model": model.name, "engine": label, "not_run": engine.absent}
                    )
                    continue
                try:
                    run = engine.make(model, path)
                    x = rng.standard_normal((8, *model.input_shape)).astype(np.float32)
                    error = relative_error(run(x), model.reference(x))
                except Exception as e:  # reported in the table: one engine must not stop the rest
                    correctness.append({"model": model.name, "engine": label, "error": repr(e)})
                    failed = True
                    continue
                ok = error < TOLERANCE[engine.precision]
                failed |= not ok
                correctness.append(
                    {"model": model.name, "engine": label, "relative_error": error, "ok": ok}
                )
                verdict = "ok" if ok else "FAIL"
                print(f"{model.name:5s} {label:36s} relative error {error:.2e} {verdict}")
                for batch in batches:
                    x = rng.standard_normal((batch, *model.input_shape)).astype(np.float32)
                    row: dict[str, Any] = {"model": model.name, "engine": label, "batch": batch}
                    row["raw_rows_per_s"] = raw_rows_per_s(run, x, args.seconds)
                    if engine.served_config is not None:
                        try:
                            row["served_rows_per_s"] = served_rows_per_s(
                                model, engine, repository, batch, args.clients, args.seconds
                            )
                            row["ratio"] = row["served_rows_per_s"] / row["raw_rows_per_s"]
                        except Exception as e:
                            row["served_error"] = repr(e)
                            failed = True
                    throughput.append(row)
                    print(f"      batch {batch:3d}: {row}")
    report = {"correctness": correctness, "throughput": throughput}
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    (args.out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    return 1 if failed else 0


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| model | executor | relative error vs float64 | within tolerance |",
        "|---|---|---:|---|",
    ]
    for r in report["correctness"]:
        if "not_run" in r:
            lines.append(f"| {r['model']} | {r['engine']} | not run: {r['not_run']} | |")
        elif "error" in r:
            lines.append(f"| {r['model']} | {r['engine']} | failed: {r['error']} | no |")
        else:
            lines.append(
                f"| {r['model']} | {r['engine']} | {r['relative_error']:.2e} | "
                f"{'yes' if r['ok'] else 'NO'} |"
            )
    lines += [
        "",
        "| model | executor | batch | raw rows/s | served rows/s | served / raw |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in report["throughput"]:
        served = r.get("served_rows_per_s")
        lines.append(
            f"| {r['model']} | {r['engine']} | {r['batch']} | {r['raw_rows_per_s']:.0f} | "
            + (
                f"{served:.0f} | {r['ratio']:.2f} |"
                if served
                else f"{r.get('served_error', '-')} | |"
            )
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
