# Type stub for the C++ extension built from cpp/bindings (see module.cpp). Keep in step with it:
# tests/unit/test_core_stub.py checks its names, kinds and parameters against the built module.
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

class StatusCode:
    __members__: ClassVar[dict[str, StatusCode]]
    OK: ClassVar[StatusCode]
    INVALID_ARGUMENT: ClassVar[StatusCode]
    NOT_FOUND: ClassVar[StatusCode]
    UNAVAILABLE: ClassVar[StatusCode]
    RESOURCE_EXHAUSTED: ClassVar[StatusCode]
    DEADLINE_EXCEEDED: ClassVar[StatusCode]
    CANCELLED: ClassVar[StatusCode]
    INTERNAL: ClassVar[StatusCode]
    UNIMPLEMENTED: ClassVar[StatusCode]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...

class QueuePolicy:
    delay_on_timeout: bool
    default_timeout_us: int
    allow_timeout_override: bool
    max_queue_size: int
    def __init__(self) -> None: ...

class Padding:
    inputs: list[bool]
    value: float
    reference_input: int
    outputs: list[list[tuple[int, int]]]
    def __init__(self) -> None: ...

class BatcherOptions:
    dynamic: bool
    max_batch_size: int
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    priority_levels: int
    default_priority_level: int
    default_queue_policy: QueuePolicy
    level_queue_policies: dict[int, QueuePolicy]
    preserve_ordering: bool
    padding: Padding
    def __init__(self) -> None: ...

class PinnedBufferPool:
    def __init__(self, capacity_bytes: int, use_cuda: bool = True) -> None: ...
    def stats(self) -> dict[str, int | bool]: ...

def cuda_runtime_description() -> str: ...
def cuda_device_count() -> int: ...

class CudaStream:
    def __init__(self, device: int) -> None: ...
    @property
    def on_device(self) -> bool: ...
    @property
    def device(self) -> int: ...
    @property
    def handle(self) -> int: ...
    def copy_to_device(self, dst: int, src: Any) -> None: ...
    def copy_to_host(self, dst: Any, src: int) -> None: ...
    def synchronize(self) -> None: ...

class CudaEvent:
    def __init__(self, device: int) -> None: ...
    def record(self, stream: CudaStream) -> None: ...
    def make_wait(self, stream: CudaStream) -> None: ...
    def synchronize(self) -> None: ...
    @staticmethod
    def elapsed_ms(start: CudaEvent, end: CudaEvent) -> float: ...

class DeviceBuffer:
    @property
    def ptr(self) -> int: ...
    @property
    def size(self) -> int: ...

class DeviceBufferPool:
    def __init__(self, device: int, capacity_bytes: int) -> None: ...
    def lease(self, size: int) -> DeviceBuffer: ...
    @property
    def device(self) -> int: ...
    def stats(self) -> dict[str, int | bool]: ...

def pinned_array(pool: PinnedBufferPool, size: int) -> np.ndarray: ...

class RequestTiming:
    def __init__(
        self,
        enqueued: int,
        compute_start: int,
        input_done: int,
        infer_done: int,
        compute_end: int,
        batch_id: int,
        batch_requests: int,
        batch_rows: int,
        instance: int,
    ) -> None: ...
    @property
    def enqueued(self) -> int: ...
    @property
    def compute_start(self) -> int: ...
    @property
    def input_done(self) -> int: ...
    @property
    def infer_done(self) -> int: ...
    @property
    def compute_end(self) -> int: ...
    @property
    def batch_id(self) -> int: ...
    @property
    def batch_requests(self) -> int: ...
    @property
    def batch_rows(self) -> int: ...
    @property
    def instance(self) -> int: ...
    @staticmethod
    def now_ns() -> int: ...
    @staticmethod
    def wall_ns(steady_ns: int) -> int: ...

class CompletionQueue:
    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    # (token, status code, message, outputs, timing); outputs: [(datatype, shape, array)], or the
    # serialized response of a request submitted with submit_request.
    def drain(
        self,
    ) -> list[
        tuple[
            int,
            int,
            str,
            list[tuple[int, tuple[int, ...], np.ndarray]] | bytes,
            RequestTiming,
        ]
    ]: ...

def load_onnxruntime(path: str) -> str: ...
def set_onnxruntime_logging(minimum_severity: int) -> None: ...
def set_core_logging(minimum_level: int, json: bool) -> None: ...

class OnnxRuntimeSession:
    def __init__(
        self,
        model_path: str,
        input_names: list[str],
        output_names: list[str],
        output_datatypes: list[int],
        intra_op_threads: int,
        inter_op_threads: int,
    ) -> None: ...
    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]: ...

class ModelSignature:
    def __init__(
        self,
        name: str,
        version: str,
        max_batch_size: int,
        inputs: list[tuple[str, int, list[int], tuple[int, ...] | None, bool, bool]],
        outputs: list[tuple[str, int, list[int], bool]],
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...

class WireRequest:
    @property
    def model_name(self) -> str: ...
    @property
    def model_version(self) -> str: ...
    @property
    def id(self) -> str: ...

def parse_infer_request(data: bytes) -> WireRequest: ...

class Duration:
    def __init__(self, count: int = 0, ns: int = 0) -> None: ...
    @property
    def count(self) -> int: ...
    @property
    def ns(self) -> int: ...

class BatchDurations:
    def __init__(
        self,
        compute_input: Duration = ...,
        compute_infer: Duration = ...,
        compute_output: Duration = ...,
    ) -> None: ...
    @property
    def compute_input(self) -> Duration: ...
    @property
    def compute_infer(self) -> Duration: ...
    @property
    def compute_output(self) -> Duration: ...

class LatencyHistogram:
    # counts: one per bound and one above the last (13), or None for all 0
    def __init__(self, counts: Sequence[int] | None = None, sum_ns: int = 0) -> None: ...
    @property
    def bounds_us(self) -> list[int]: ...
    @property
    def counts(self) -> list[int]: ...
    @property
    def sum_ns(self) -> int: ...

class StatisticsSnapshot:
    def __init__(
        self,
        *,
        last_inference_ms: int = 0,
        inference_count: int = 0,
        execution_count: int = 0,
        success: Duration = ...,
        fail: Duration = ...,
        queue: Duration = ...,
        compute_input: Duration = ...,
        compute_infer: Duration = ...,
        compute_output: Duration = ...,
        batches: Mapping[int, BatchDurations] = ...,
        request_duration: LatencyHistogram = ...,
        queue_duration: LatencyHistogram = ...,
    ) -> None: ...
    @property
    def last_inference_ms(self) -> int: ...
    @property
    def inference_count(self) -> int: ...
    @property
    def execution_count(self) -> int: ...
    @property
    def success(self) -> Duration: ...
    @property
    def fail(self) -> Duration: ...
    @property
    def queue(self) -> Duration: ...
    @property
    def compute_input(self) -> Duration: ...
    @property
    def compute_infer(self) -> Duration: ...
    @property
    def compute_output(self) -> Duration: ...
    @property
    def batches(self) -> dict[int, BatchDurations]: ...
    @property
    def request_duration(self) -> LatencyHistogram: ...
    @property
    def queue_duration(self) -> LatencyHistogram: ...

class Scheduler:
    def __init__(
        self,
        model_name: str,
        batching: BatcherOptions,
        executors: list[Any],
        output_datatypes: list[int],
        completions: CompletionQueue,
        pool: PinnedBufferPool,
    ) -> None: ...
    def submit(
        self,
        token: int,
        batch_size: int,
        inputs: list[tuple[int, Sequence[int], Any]],
        priority: int = 0,
        timeout_us: int = 0,
        deadline_us: int = 0,
    ) -> tuple[int, str]: ...
    def submit_request(
        self,
        token: int,
        signature: ModelSignature,
        request: WireRequest,
        deadline_us: int = 0,
        stream: bool = False,
    ) -> tuple[int, str]: ...
    def cancel(self, token: int) -> bool: ...
    def shutdown(self, reject_queued: bool) -> None: ...
    def pending_requests(self) -> int: ...
    @property
    def batcher_options(self) -> BatcherOptions: ...
    def statistics(self) -> StatisticsSnapshot: ...

class TraceSampling:
    def __init__(
        self, enabled: bool = False, parent_based: bool = False, ratio: float = 0.0
    ) -> None: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def parent_based(self) -> bool: ...
    @property
    def ratio(self) -> float: ...
    def traced(self, traceparent: str) -> bool: ...

class GrpcServer:
    def __init__(
        self,
        addresses: list[str],
        backend_address: str,
        max_message_bytes: int,
        keepalive_time_ms: int = 0,
        keepalive_timeout_ms: int = 0,
        max_concurrent_streams: int = 0,
        use_ssl: bool = False,
        use_ssl_mutual: bool = False,
        server_cert_pem: str = "",
        server_key_pem: str = "",
        root_cert_pem: str = "",
        max_stream_outstanding: int = 1024,
        max_connection_idle_ms: int = 0,
        restricted_protocols: list[tuple[list[str], str, str]] = ...,
        control_on_tcp: bool = False,
        max_inflight_bytes: int = 0,
    ) -> None: ...
    @property
    def ports(self) -> list[int]: ...
    def publish(
        self,
        live: bool,
        ready: bool,
        accepting: bool,
        forward_inference: bool,
        tracing: TraceSampling,
        routes: list[tuple[Any, ...]],
    ) -> None: ...
    def failures(self) -> list[tuple[str, str, int, int]]: ...
    def shutdown(self, grace_s: float) -> None: ...

def grpc_status_code(code: StatusCode) -> int: ...
