"""The transport floor: the fastest a Python grpcio server can answer the Triton protocol.

    python benchmarks/transport_floor.py --model-repository examples-repo --model mlp [--port 0]
    python benchmarks/transport_floor.py --model-repository examples-repo --model mlp --inline
    python benchmarks/transport_floor.py --model-repository examples-repo --model mlp \
        --write-responses DIR

A grpc.aio server of ``inference.GRPCInferenceService`` with inferd's server options (the same
message size limits) whose ModelInfer returns one canned ``ModelInferResponse``, built once at start
from the model's outputs for a batch of one, with the request's ``id`` set, and does nothing else:
no decoding, no checks, no compute. What inferd spends above this floor is inferd's own cost.
ServerLive/Ready, ModelReady, ServerMetadata (extension "model_configuration" only, so
perf_analyzer asks for no statistics), ModelMetadata and ModelConfig answer from the model's
config as inferd completes it, so perf_analyzer and tritonclient accept the server.
ModelStatistics answers the number of ModelInfer calls answered (inference_count =
execution_count; no durations), counted with one integer increment per call, so that
benchmarks/run.py can divide the server's CPU by it.

``--write-responses DIR`` serves nothing: it writes these answers, serialized, for the C++ floor
(benchmarks/floor_cpp, grpc++): one file per RPC named after it (ServerLive, ServerReady,
ModelReady, ServerMetadata, ModelMetadata, ModelConfig, and ModelInfer without an id), made by the
handlers below for the served model. The C++ server appends the request's id to ModelInfer's and
writes ModelStatistics itself, from its own count.

``--inline`` is the naive server instead: ModelInfer decodes the raw inputs with numpy, runs ONNX
Runtime inline in the handler (``session.run`` on the event loop's thread; inferd's session
options: intra-op threads = cores unless the model's parameters say, inter-op 1) and encodes the
outputs raw. One request at a time, no batching, no queue.

Serves one model, on loopback. Logs ``{"event": "server started", "port": N}`` to stderr as inferd
does (``--port 0`` picks a free port), and stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np

import harness
import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc

# inferd's default (settings.grpc_max_message_bytes): Triton's limit, not gRPC's 4 MiB.
MAX_MESSAGE_BYTES = 2**31 - 1


def example_inputs(config: Any, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Fixed-seed inputs for ``batch`` rows (no batch dim when max_batch_size is 0); variable
    dims are 16 wide; BYTES inputs are short ASCII strings."""
    from inferd.datatypes import BY_CONFIG_TYPE

    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for tensor in config.input:
        dims = [16 if d < 0 else int(d) for d in tensor.dims]
        shape = ([batch] if config.max_batch_size > 0 else []) + dims
        datatype = BY_CONFIG_TYPE[tensor.data_type]
        if datatype.is_bytes:
            count = int(np.prod(shape, dtype=np.int64))
            values = [f"s{int(v)}" for v in rng.integers(0, 1000, size=count)]
            feeds[tensor.name] = np.array(values, dtype=object).reshape(shape)
        elif datatype.name == "BOOL":
            feeds[tensor.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif datatype.numpy.kind == "f":
            feeds[tensor.name] = rng.standard_normal(size=shape).astype(datatype.numpy)
        else:
            feeds[tensor.name] = rng.integers(0, 100, size=shape).astype(datatype.numpy)
    return feeds


def _raw(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        from inferd.datatypes import serialize_bytes

        return serialize_bytes([str(v).encode() for v in array.reshape(-1)])
    return np.ascontiguousarray(array).tobytes()


class FloorServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Control RPCs from the model's config; ModelInfer per subclass."""

    server_name = "inferd-transport-floor"

    def __init__(self, model: harness.ModelFiles) -> None:
        self.model = model
        config = model.config
        batch_dim = [-1] if config.max_batch_size > 0 else []
        self.metadata = pb.ModelMetadataResponse(
            name=model.name, versions=[str(model.version)], platform=config.platform
        )
        for tensor in config.input:
            self.metadata.inputs.add(
                name=tensor.name,
                datatype=harness.datatype_name(tensor.data_type),
                shape=batch_dim + list(tensor.dims),
            )
        for tensor in config.output:
            self.metadata.outputs.add(
                name=tensor.name,
                datatype=harness.datatype_name(tensor.data_type),
                shape=batch_dim + list(tensor.dims),
            )
        self.config_response = pb.ModelConfigResponse(config=config)
        self.answered = 0  # ModelInfer calls: the subclasses' one cost beyond the floor's work

    def _known(self, name: str, version: str) -> bool:
        return name == self.model.name and version in ("", str(self.model.version))

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=self._known(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        # No "statistics": perf_analyzer then never calls ModelStatistics.
        return pb.ServerMetadataResponse(
            name=self.server_name, version="0", extensions=["model_configuration"]
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        if not self._known(request.name, request.version):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name!r}")
        return self.metadata

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        if not self._known(request.name, request.version):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name!r}")
        return self.config_response

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        if request.name and not self._known(request.name, request.version):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name!r}")
        response = pb.ModelStatisticsResponse()
        response.model_stats.add(
            name=self.model.name,
            version=str(self.model.version),
            inference_count=self.answered,
            execution_count=self.answered,
        )
        return response


class CannedServicer(FloorServicer):
    """ModelInfer answers the same pre-built response, whatever the request."""

    def __init__(self, model: harness.ModelFiles, intra: int, inter: int) -> None:
        super().__init__(model)
        # The real outputs of a batch of one, computed once, so the answer has the real size.
        session = harness.ort_session(model.onnx_path, intra, inter)
        names = [t.name for t in model.config.output]
        outputs = session.run(names, example_inputs(model.config, 1))
        self.response = pb.ModelInferResponse(
            model_name=model.name, model_version=str(model.version)
        )
        for tensor, array in zip(model.config.output, outputs, strict=True):
            datatype = harness.datatype_name(tensor.data_type)
            self.response.outputs.add(name=tensor.name, datatype=datatype, shape=array.shape)
            self.response.raw_output_contents.append(_raw(array, datatype))
        del session

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.answered += 1
        # The answer carries the request's id, as the protocol says: perf_analyzer's async
        # client (--async) matches answers to requests by it. Set on the one canned message
        # (0.2 µs; a copy per request would cost 1.3 µs): grpc.aio serializes what a handler
        # returns before the event loop runs anything else, so no other call sees this id.
        self.response.id = request.id
        return self.response


class InlineServicer(FloorServicer):
    """The naive server: decode raw inputs, session.run on the loop's thread, encode raw."""

    server_name = "inferd-inline-naive"

    def __init__(self, model: harness.ModelFiles, intra: int, inter: int) -> None:
        super().__init__(model)
        from inferd.datatypes import DATATYPES

        self.session = harness.ort_session(model.onnx_path, intra, inter)
        self.dtypes = {name: d.numpy for name, d in DATATYPES.items()}
        self.all_outputs = [t.name for t in model.config.output]
        self.output_types = {
            t.name: harness.datatype_name(t.data_type) for t in model.config.output
        }

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        if len(request.raw_input_contents) != len(request.inputs):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the inline server takes raw_input_contents only"
            )
        feeds: dict[str, np.ndarray] = {}
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
            if tensor.datatype == "BYTES":
                await context.abort(
                    grpc.StatusCode.UNIMPLEMENTED, "the inline server takes no BYTES inputs"
                )
            feeds[tensor.name] = np.frombuffer(raw, dtype=self.dtypes[tensor.datatype]).reshape(
                tuple(tensor.shape)
            )
        names = [o.name for o in request.outputs] or self.all_outputs
        try:
            outputs = self.session.run(names, feeds)  # blocks the loop: that is the point
        except Exception as e:
            await context.abort(grpc.StatusCode.INTERNAL, str(e))
        response = pb.ModelInferResponse(
            model_name=self.model.name, model_version=str(self.model.version), id=request.id
        )
        for name, array in zip(names, outputs, strict=True):
            datatype = self.output_types[name]
            response.outputs.add(name=name, datatype=datatype, shape=array.shape)
            response.raw_output_contents.append(_raw(array, datatype))
        self.answered += 1
        return response


# The RPCs the C++ floor answers from a file (ModelStatistics it writes itself).
CPP_FLOOR_RPCS = (
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig",
    "ModelInfer",
)  # fmt: skip


async def write_responses(servicer: CannedServicer, directory: Path) -> None:
    """The C++ floor's answers, one file per RPC: what ``servicer``'s handlers answer for its
    model (ModelReady: ready; ModelInfer: the canned response, without an id)."""
    name = servicer.model.name
    requests: dict[str, Any] = {
        "ServerLive": pb.ServerLiveRequest(),
        "ServerReady": pb.ServerReadyRequest(),
        "ModelReady": pb.ModelReadyRequest(name=name),
        "ServerMetadata": pb.ServerMetadataRequest(),
        "ModelMetadata": pb.ModelMetadataRequest(name=name),
        "ModelConfig": pb.ModelConfigRequest(name=name),
        "ModelInfer": pb.ModelInferRequest(model_name=name),
    }
    assert tuple(requests) == CPP_FLOOR_RPCS
    directory.mkdir(parents=True, exist_ok=True)
    for method, request in requests.items():
        response = await getattr(servicer, method)(request, None)  # known model: no context used
        (directory / method).write_bytes(response.SerializeToString())


async def serve(servicer: FloorServicer, host: str, port: int) -> None:
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    server = grpc.aio.server(options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    print(
        json.dumps({"event": "server started", "port": bound, "server": servicer.server_name}),
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(5)
    print(json.dumps({"event": "server stopped"}), file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-repository", type=Path, default=Path("examples-repo"))
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--inline", action="store_true", help="decode and run ONNX Runtime in the handler"
    )
    parser.add_argument(
        "--write-responses",
        type=Path,
        metavar="DIR",
        help="write the C++ floor's answers into DIR and exit (serves nothing)",
    )
    parser.add_argument(
        "--intra-op-thread-count", type=int, default=0, help="0 = one per core (inferd's default)"
    )
    parser.add_argument("--inter-op-thread-count", type=int, default=1)
    parser.add_argument(
        "--default-max-batch-size", type=int, default=4, help="as inferd's, for configless models"
    )
    args = parser.parse_args()
    if args.inline and args.write_responses:
        parser.error("--write-responses writes the canned floor's answers: not with --inline")

    model = harness.load_model(args.model_repository, args.model, args.default_max_batch_size)
    intra, inter = harness.session_threads(
        model.config, args.intra_op_thread_count, args.inter_op_thread_count
    )
    if args.write_responses:
        canned = CannedServicer(model, intra, inter)
        canned.server_name = "inferd-transport-floor-cpp"  # ServerMetadata names the C++ server
        asyncio.run(write_responses(canned, args.write_responses))
        return 0
    servicer: FloorServicer = (
        InlineServicer(model, intra, inter) if args.inline else CannedServicer(model, intra, inter)
    )
    asyncio.run(serve(servicer, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
