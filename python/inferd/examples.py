"""Example model repository generator (backs `inferd make-examples DIR`).

Writes a Triton-layout repository (`<root>/<model>/1/model.onnx` plus an
optional `<root>/<model>/config.pbtxt`). Everything is built with
`onnx.helper` from a fixed seed so the output is byte-for-byte reproducible.
"""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inferd.datatypes import DATATYPES

# Pinned explicitly: onnx's defaults track its own newest IR/opset, which an
# older onnxruntime may refuse to load.
OPSET: Final = 17
IR_VERSION: Final = 9
PLATFORM: Final = "onnxruntime_onnx"
SEED: Final = 0


# Kept literal (mirrors Triton's own "simple" example) so it reads as docs.
SIMPLE_CONFIG: Final = """\
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""

Dim = int | str  # int = fixed size, str = symbolic (dim_param)


class TensorSpec(NamedTuple):
    name: str
    config_type: str
    dims: Sequence[int]  # config dims: excludes the batch dim when batching


def _format_tensors(key: str, tensors: Sequence[TensorSpec]) -> str:
    entries = []
    for t in tensors:
        dims = ", ".join(str(d) for d in t.dims)
        entries.append(
            "  {\n"
            f'    name: "{t.name}"\n'
            f"    data_type: {t.config_type}\n"
            f"    dims: [ {dims} ]\n"
            "  }"
        )
    return f"{key} [\n" + ",\n".join(entries) + "\n]\n"


def format_config(
    name: str,
    max_batch_size: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> str:
    """Render a model config in protobuf text format (same layout as SIMPLE_CONFIG)."""
    return (
        f'name: "{name}"\n'
        f'platform: "{PLATFORM}"\n'
        f"max_batch_size: {max_batch_size}\n"
        + _format_tensors("input", inputs)
        + _format_tensors("output", outputs)
    )


def _value_info(name: str, elem_type: int, shape: Sequence[Dim]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def _save(model_dir: pathlib.Path, graph: onnx.GraphProto, config: str | None) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    # full_check also runs strict shape inference, catching wiring mistakes.
    onnx.checker.check_model(model, full_check=True)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.onnx").write_bytes(model.SerializeToString())
    config_path = model_dir / "config.pbtxt"
    if config is not None:
        config_path.write_text(config, encoding="utf-8")
    else:
        # A rerun into an existing repo must not leave a stale config behind.
        config_path.unlink(missing_ok=True)


def write_identity_model(
    model_dir: pathlib.Path,
    datatype: str,
    *,
    max_batch_size: int = 8,
    with_config: bool = True,
) -> None:
    """Write INPUT0 [batch, length] -> OUTPUT0 = Identity(INPUT0) of `datatype`."""
    try:
        info = DATATYPES[datatype]
    except KeyError:
        raise ValueError(f"unknown datatype {datatype!r}") from None
    shape: list[Dim] = ["batch", "length"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        model_dir.name,
        [_value_info("INPUT0", info.onnx_type, shape)],
        [_value_info("OUTPUT0", info.onnx_type, shape)],
    )
    config = None
    if with_config:
        # With batching the config omits the batch dim; without it the config
        # must describe the model's full rank-2 shape.
        dims = [-1] if max_batch_size > 0 else [-1, -1]
        config = format_config(
            model_dir.name,
            max_batch_size,
            [TensorSpec("INPUT0", info.config_name, dims)],
            [TensorSpec("OUTPUT0", info.config_name, dims)],
        )
    _save(model_dir, graph, config)


def _write_simple(model_dir: pathlib.Path) -> None:
    shape: list[Dim] = ["batch", 16]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "simple",
        [
            _value_info("INPUT0", TensorProto.INT32, shape),
            _value_info("INPUT1", TensorProto.INT32, shape),
        ],
        [
            _value_info("OUTPUT0", TensorProto.INT32, shape),
            _value_info("OUTPUT1", TensorProto.INT32, shape),
        ],
    )
    _save(model_dir, graph, SIMPLE_CONFIG)


MLP_SIZES: Final = (512, 2048, 2048, 10)


def _write_mlp(model_dir: pathlib.Path, rng: np.random.Generator) -> None:
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    x = "INPUT0"
    n_layers = len(MLP_SIZES) - 1
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(MLP_SIZES)):
        # 1/sqrt(fan_in) keeps activations O(1) through the stack.
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        initializers += [
            numpy_helper.from_array(w, f"fc{i}.weight"),
            numpy_helper.from_array(b, f"fc{i}.bias"),
        ]
        last = i == n_layers - 1
        y = "OUTPUT0" if last else f"fc{i}"
        nodes.append(
            helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [y], name=f"fc{i}")
        )
        if not last:
            nodes.append(helper.make_node("Relu", [y], [f"relu{i}"], name=f"relu{i}"))
            y = f"relu{i}"
        x = y
    graph = helper.make_graph(
        nodes,
        "mlp",
        [_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_SIZES[0]])],
        [_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_SIZES[-1]])],
        initializer=initializers,
    )
    config = format_config(
        "mlp",
        64,
        [TensorSpec("INPUT0", "TYPE_FP32", [MLP_SIZES[0]])],
        [TensorSpec("OUTPUT0", "TYPE_FP32", [MLP_SIZES[-1]])],
    )
    # Warm-up: the first real request should not pay ONNX Runtime's first-run cost.
    config += (
        "model_warmup [\n"
        '  { name: "zeros" batch_size: 1\n'
        f'    inputs {{ key: "INPUT0" value: {{ data_type: TYPE_FP32 dims: [ {MLP_SIZES[0]} ] '
        "zero_data: true } } }\n"
        "]\n"
    )
    _save(model_dir, graph, config)


def make_examples(root: pathlib.Path) -> list[str]:
    """Write the example repository under root; return the model names written."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    _write_simple(root / "simple")
    # No config: exercises the server completing the config from the ONNX model.
    write_identity_model(root / "identity_fp32", "FP32", with_config=False)
    _write_mlp(root / "mlp", rng)
    write_identity_model(root / "identity_bytes", "BYTES", max_batch_size=8)
    return ["simple", "identity_fp32", "mlp", "identity_bytes"]
