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

CUDA shared memory (issue 15): this process plays a Triton client. It allocates device memory
(cudaMalloc through cupy's runtime bindings, else through the libcudart PyTorch loaded), exports
it as a CUDA IPC handle (cudaIpcGetMemHandle), registers it with an inferd server over its Unix
socket (CudaSharedMemoryRegister) and infers an identity model (FP32, on a CPU instance: the
server copies through host memory) with the input, the output or both in the region; the values
read back from the device must be the ones written. The refusals are checked too: a byte_size
past the allocation's real size (asked of the driver), a handle that is not 64 bytes, a device
that does not exist, a live name. Then one throughput row: 4 MiB in and out per request, raw
bytes against CUDA shared memory, ``--clients`` callers. Without CUDA the check asks only that
the server refuse CudaSharedMemoryRegister with UNIMPLEMENTED and say why.

    python benchmarks/gpu_check.py --out benchmarks/out/gpu-check [--seconds 2]
    python benchmarks/gpu_check.py --only cuda-shared-memory     # that part alone
"""

from __future__ import annotations

import argparse
import ctypes
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
        from inferd.core import HostBufferPool
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
        from inferd.core import HostBufferPool
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

    from inferd.core import cuda_device_count, cuda_runtime_description
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


# --- CUDA shared memory ---------------------------------------------------------------------------

SHM_ELEMENTS = 1 << 20  # FP32 values per tensor: 4 MiB, the size of RESULTS.md's system shm row
HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class CupyRuntime:
    """The CUDA runtime calls the client needs, through cupy's bindings (no cupy memory pool: each
    allocation is its own cudaMalloc, so its IPC handle names exactly it, at offset 0)."""

    def __init__(self) -> None:
        import cupy.cuda.runtime as rt

        self.rt = rt
        self.name = f"cupy {__import__('cupy').__version__}"

    def device_count(self) -> int:
        return int(self.rt.getDeviceCount())

    def malloc(self, device: int, size: int) -> int:
        self.rt.setDevice(device)
        return int(self.rt.malloc(size))

    def free(self, ptr: int) -> None:
        self.rt.free(ptr)

    def ipc_handle(self, ptr: int) -> bytes:
        return bytes(self.rt.ipcGetMemHandle(ptr))

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self.rt.memcpy(ptr, array.ctypes.data, array.nbytes, self.rt.memcpyHostToDevice)

    def download(self, ptr: int, out: np.ndarray) -> None:
        self.rt.memcpy(out.ctypes.data, ptr, out.nbytes, self.rt.memcpyDeviceToHost)


class TorchCudartRuntime(CupyRuntime):
    """The same calls through ctypes on the libcudart PyTorch loaded (found in /proc/self/maps)."""

    def __init__(self) -> None:  # no super().__init__(): no cupy here
        import torch

        torch.cuda.init()
        maps = Path("/proc/self/maps").read_text().split()
        paths = sorted({p for p in maps if "libcudart.so" in Path(p).name})
        if not paths:
            raise RuntimeError("PyTorch loaded no libcudart.so (statically linked?)")
        self.lib = ctypes.CDLL(paths[0])
        self.name = f"torch {torch.__version__}, {paths[0]}"

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what}: CUDA error {code}")

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._check(self.lib.cudaGetDeviceCount(ctypes.byref(count)), "cudaGetDeviceCount")
        return count.value

    def malloc(self, device: int, size: int) -> int:
        self._check(self.lib.cudaSetDevice(device), "cudaSetDevice")
        ptr = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)), "cudaMalloc")
        return int(ptr.value or 0)

    def free(self, ptr: int) -> None:
        self.lib.cudaFree(ctypes.c_void_p(ptr))

    def ipc_handle(self, ptr: int) -> bytes:
        handle = ctypes.create_string_buffer(HANDLE_BYTES)
        self._check(
            self.lib.cudaIpcGetMemHandle(handle, ctypes.c_void_p(ptr)), "cudaIpcGetMemHandle"
        )
        return handle.raw

    def _copy(self, dst: int, src: int, size: int, kind: int) -> None:
        copied = self.lib.cudaMemcpy(
            ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(size), kind
        )
        self._check(copied, "cudaMemcpy")

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self._copy(ptr, array.ctypes.data, array.nbytes, 1)  # cudaMemcpyHostToDevice

    def download(self, ptr: int, out: np.ndarray) -> None:
        self._copy(out.ctypes.data, ptr, out.nbytes, 2)  # cudaMemcpyDeviceToHost


def client_runtime() -> tuple[CupyRuntime | None, str]:
    """A CUDA runtime for the client's side, or None and why there is none."""
    reasons = []
    for make in (CupyRuntime, TorchCudartRuntime):
        try:
            runtime = make()
            if runtime.device_count() > 0:
                return runtime, runtime.name
            reasons.append(f"{make.__name__}: no CUDA device")
        except Exception as e:  # ImportError, no driver, no device: each said in the report
            reasons.append(f"{make.__name__}: {e!r}")
    return None, "; ".join(reasons)


def identity_onnx() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", "n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def shm_request(
    pb: Any, values: np.ndarray, input_region: str | None, output_region: str | None
) -> Any:
    """ModelInferRequest for identity: INPUT0 raw or in ``input_region``, OUTPUT0 likewise."""
    request = pb.ModelInferRequest(model_name="identity")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, values.size])
    if input_region is None:
        request.raw_input_contents.append(values.tobytes())
    else:
        tensor.parameters["shared_memory_region"].string_param = input_region
        tensor.parameters["shared_memory_byte_size"].int64_param = values.nbytes
    output = request.outputs.add(name="OUTPUT0")
    if output_region is not None:
        output.parameters["shared_memory_region"].string_param = output_region
        output.parameters["shared_memory_byte_size"].int64_param = values.nbytes
    return request


def cuda_shared_memory(tmp: Path, seconds: float, clients: int) -> dict[str, Any]:
    """The CUDA shared-memory checks and throughput row (see the module's docstring)."""
    import grpc

    import inferd._proto.grpc_service_pb2 as pb
    import inferd._proto.grpc_service_pb2_grpc as pb_grpc
    from inferd.core import cuda_device_count, cuda_runtime_description

    report: dict[str, Any] = {"checks": [], "throughput": []}
    runtime, client = client_runtime()
    server_gpus = cuda_device_count()
    report["client"] = client
    report["server_cuda"] = cuda_runtime_description()

    def check(name: str, ok: bool, detail: str = "") -> None:
        report["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"cuda shm  {name:58s} {'ok' if ok else 'FAIL'} {detail}")

    repository = tmp / "shm-models"
    (repository / "identity" / "1").mkdir(parents=True)
    (repository / "identity" / "1" / "model.onnx").write_bytes(identity_onnx())
    (repository / "identity" / "config.pbtxt").write_text(
        "max_batch_size: 8\n"
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
        "instance_group [{ kind: KIND_CPU }]\n"
    )
    socket = tmp / "inferd-shm.sock"
    command = harness.inferd_command(
        sys.executable,
        repository,
        ["--grpc-unix-socket", str(socket), "--metrics-port", "-1", "--shared-memory", "all"],
    )
    server = harness.start_server(command, tmp / "server-cuda-shm.log", timeout=120)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    allocations: list[int] = []
    with (
        harness.running(server),
        grpc.insecure_channel(f"unix://{socket}", options=options) as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        def register(name: str, handle: bytes, device: int, size: int) -> grpc.StatusCode:
            try:
                stub.CudaSharedMemoryRegister(
                    pb.CudaSharedMemoryRegisterRequest(
                        name=name, raw_handle=handle, device_id=device, byte_size=size
                    ),
                    timeout=30,
                )
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                report.setdefault("messages", {})[name] = e.details()
                return e.code()

        if runtime is None or not server_gpus:
            why = (
                client
                if runtime is None
                else f"the server sees no CUDA device ({report['server_cuda']})"
            )
            report["not_run"] = why
            code = register("no-cuda", bytes(HANDLE_BYTES), 0, 16)
            message = report.get("messages", {}).get("no-cuda", "")
            check(
                "no CUDA: register answers UNIMPLEMENTED, saying why",
                code == grpc.StatusCode.UNIMPLEMENTED
                and "needs the CUDA runtime and a GPU" in message,
                f"{code.name}: {message}",
            )
            return report
        try:
            nbytes = SHM_ELEMENTS * 4

            def allocate() -> int:
                ptr = runtime.malloc(0, nbytes)
                allocations.append(ptr)
                return ptr

            src, dst = allocate(), allocate()
            code_in = register("input", runtime.ipc_handle(src), 0, nbytes)
            code_out = register("output", runtime.ipc_handle(dst), 0, nbytes)
            check(
                "register an input and an output region",
                code_in == code_out == grpc.StatusCode.OK,
                f"{code_in.name}, {code_out.name}",
            )
            status = stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(), timeout=30)
            listed = {name: (r.device_id, r.byte_size) for name, r in status.regions.items()}
            check(
                "status lists both, device 0, their sizes",
                listed == {"input": (0, nbytes), "output": (0, nbytes)},
                repr(listed),
            )

            rng = np.random.default_rng()
            for input_region, output_region in (
                ("input", "output"),
                ("input", None),
                (None, "output"),
            ):
                values = rng.standard_normal(SHM_ELEMENTS).astype(np.float32)
                runtime.upload(src, values)
                runtime.upload(dst, np.zeros_like(values))
                answer = stub.ModelInfer(
                    shm_request(pb, values, input_region, output_region), timeout=60
                )
                got = np.empty_like(values)
                if output_region is None:
                    got = np.frombuffer(answer.raw_output_contents[0], np.float32)
                else:
                    runtime.download(dst, got)
                    # Triton's answer for an output in shared memory: no bytes in the response.
                    if any(answer.raw_output_contents):
                        got = np.zeros_like(values)
                where = f"input {'in ' + input_region if input_region else 'raw'}, " + (
                    f"output {'in ' + output_region if output_region else 'raw'}"
                )
                check(
                    f"identity, {where}: the values come back",
                    np.array_equal(got, values),
                    f"{int(np.sum(got != values))} of {values.size} differ",
                )

            # Refusals: each a clear status, and the server still serves.
            small = allocate()
            handle = runtime.ipc_handle(small)
            code = register("too-big", handle, 0, nbytes + 1)
            check(
                "byte_size past the allocation (driver's size): INVALID_ARGUMENT",
                code == grpc.StatusCode.INVALID_ARGUMENT,
                f"{code.name}: {report.get('messages', {}).get('too-big', '')}",
            )
            code = register("short-handle", handle[:-1], 0, 16)
            check(
                "a 63-byte handle: INVALID_ARGUMENT",
                code == grpc.StatusCode.INVALID_ARGUMENT,
                code.name,
            )
            code = register("no-device", handle, server_gpus, 16)
            check(
                "a device the server does not have: INVALID_ARGUMENT",
                code == grpc.StatusCode.INVALID_ARGUMENT,
                code.name,
            )
            code = register("input", handle, 0, 16)
            check("a live name: ALREADY_EXISTS", code == grpc.StatusCode.ALREADY_EXISTS, code.name)
            stub.CudaSharedMemoryUnregister(
                pb.CudaSharedMemoryUnregisterRequest(name="input"), timeout=30
            )
            try:
                stub.ModelInfer(
                    shm_request(pb, np.zeros(16, np.float32), "input", None), timeout=60
                )
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            check(
                "infer naming an unregistered region: INVALID_ARGUMENT",
                code == grpc.StatusCode.INVALID_ARGUMENT,
                code.name,
            )
            stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(), timeout=30)
            status = stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(), timeout=30)
            check(
                "unregister with no name removes every region",
                not status.regions,
                repr(dict(status.regions)),
            )

            # Throughput: each caller its own input and output allocation, raw against CUDA shm.
            values = np.random.default_rng(1).standard_normal(SHM_ELEMENTS).astype(np.float32)
            requests = {"raw": [shm_request(pb, values, None, None)] * clients, "cuda shm": []}
            for c in range(clients):
                a, b = allocate(), allocate()
                runtime.upload(a, values)
                ok = register(f"in{c}", runtime.ipc_handle(a), 0, nbytes) == grpc.StatusCode.OK
                ok &= register(f"out{c}", runtime.ipc_handle(b), 0, nbytes) == grpc.StatusCode.OK
                if not ok:
                    raise RuntimeError(
                        f"registering caller {c}'s regions failed: {report.get('messages')}"
                    )
                requests["cuda shm"].append(shm_request(pb, values, f"in{c}", f"out{c}"))
            for mode, per_client in requests.items():
                row = {
                    "mode": mode,
                    "bytes_per_tensor": nbytes,
                    "clients": clients,
                    **measure_infer(stub, per_client, seconds),
                }
                report["throughput"].append(row)
                print(f"cuda shm  throughput {row}")
            raw_rate = report["throughput"][0]["infer_per_s"]
            report["shm_over_raw"] = (
                report["throughput"][1]["infer_per_s"] / raw_rate if raw_rate else None
            )
            # Last (a sticky CUDA error in the server would spoil what follows): a client that
            # frees its allocation while it is registered. The request completes or fails with a
            # status, and the server goes on serving.
            freed = allocations.pop(allocations.index(small))
            runtime.upload(freed, np.arange(16, dtype=np.float32))
            code = register("freed", runtime.ipc_handle(freed), 0, 64)
            runtime.free(freed)
            try:
                stub.ModelInfer(
                    shm_request(pb, np.zeros(16, np.float32), "freed", None), timeout=60
                )
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            values = np.arange(SHM_ELEMENTS, dtype=np.float32)
            runtime.upload(src, values)
            register("input", runtime.ipc_handle(src), 0, nbytes)
            answer = stub.ModelInfer(shm_request(pb, values, "input", None), timeout=60)
            served = np.array_equal(
                np.frombuffer(answer.raw_output_contents[0], np.float32), values
            )
            check(
                "client frees a registered allocation: a status, then still serving",
                code != grpc.StatusCode.UNKNOWN and served,
                f"infer on the freed region: {code.name}",
            )
        except Exception as e:  # reported: the rest of the GPU check goes on
            check("CUDA shared memory", False, repr(e))
        finally:
            for ptr in allocations:
                runtime.free(ptr)
    return report


def measure_infer(stub: Any, per_client: list[Any], seconds: float) -> dict[str, float]:
    """infer/s and p50 latency of len(per_client) callers, each sending its request in a loop."""
    latencies: list[list[float]] = [[] for _ in per_client]
    stop = time.monotonic() + seconds + 1.0

    def call(index: int) -> None:
        stub.ModelInfer(per_client[index], timeout=60)  # warm-up
        begin = time.monotonic() + 1.0  # measured after a second of load
        while (now := time.monotonic()) < stop:
            stub.ModelInfer(per_client[index], timeout=60)
            if now >= begin:
                latencies[index].append(time.monotonic() - now)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(per_client))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = sorted(x for per in latencies for x in per)
    return {
        "infer_per_s": len(every) / seconds,
        "p50_ms": every[len(every) // 2] * 1e3 if every else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "gpu-check")
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput figure")
    parser.add_argument("--clients", type=int, default=4, help="concurrent gRPC callers")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument(
        "--only", choices=("executors", "cuda-shared-memory"), help="run that part alone"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    models = make_models(np.random.default_rng(int(time.time())))  # fresh weights each run
    rng = np.random.default_rng(int(time.time() * 1000) % 2**32)  # and fresh inputs
    all_engines = engines() if args.only != "cuda-shared-memory" else []
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
        shm: dict[str, Any] = {"not_run": "--only executors"}
        if args.only != "executors":
            try:
                shm = cuda_shared_memory(Path(tmp), args.seconds, args.clients)
            except Exception as e:  # the server did not start, say: reported, and a failure
                shm = {"checks": [{"check": "CUDA shared memory", "ok": False, "detail": repr(e)}]}
            failed |= not all(c["ok"] for c in shm.get("checks", []))
    report = {"correctness": correctness, "throughput": throughput, "cuda_shared_memory": shm}
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
    return "\n".join(lines + shm_markdown(report["cuda_shared_memory"])) + "\n"


def shm_markdown(shm: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "CUDA shared memory (identity model, FP32, CPU instance; over the Unix socket)",
        "",
    ]
    if "client" in shm:
        lines += [f"client: {shm['client']}; server: {shm.get('server_cuda', '?')}", ""]
    if "not_run" in shm:
        lines += [f"not run: {shm['not_run']}", ""]
    lines += ["| check | ok | detail |", "|---|---|---|"]
    for c in shm.get("checks", []):
        lines.append(f"| {c['check']} | {'yes' if c['ok'] else 'NO'} | {c['detail'][:200]} |")
    if shm.get("throughput"):
        lines += [
            "",
            "| tensors | bytes per tensor | clients | infer/s | p50 ms |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in shm["throughput"]:
            lines.append(
                f"| {r['mode']} | {r['bytes_per_tensor']} | {r['clients']} | "
                f"{r['infer_per_s']:.1f} | {r['p50_ms']:.2f} |"
            )
        if shm.get("shm_over_raw"):
            lines += ["", f"CUDA shm / raw infer/s: {shm['shm_over_raw']:.2f}"]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
