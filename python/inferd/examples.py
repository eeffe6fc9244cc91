"""Example model repository generator (backs `inferd make-examples DIR`).

Writes a Triton-layout repository (`<root>/<model>/1/model.onnx` plus an
optional `<root>/<model>/config.pbtxt`). Everything is built with
`onnx.helper` from a fixed seed so the output is byte-for-byte reproducible.
Besides the ONNX models: a python-backend model (`tokenize`, `1/model.py`),
an ensemble (`text_embedding`: tokenize -> embed), a decoupled python model
streaming tokens (`generate`) and a GRU decoder served as an iterative sequence
(`decoder`, example_decoder.py).
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
from inferd.example_decoder import write_decoder
from inferd.onnx_versions import IR_VERSION, OPSET

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


TOKENS: Final = 16  # token ids per text: the first 16 UTF-8 bytes, padded with 0
VOCABULARY: Final = 257  # id 0 is padding, byte b is id b + 1
EMBEDDING_WIDTH: Final = 8

# Written from Triton's python_backend README (the add_sub example's shape), so it reads as docs.
TOKENIZE_MODEL_PY: Final = f"""\
\"\"\"Byte-level tokenizer: each row's UTF-8 text -> its first {TOKENS} bytes as token ids
(byte b -> id b + 1), padded with 0.\"\"\"

import json

import numpy as np
import triton_python_backend_utils as pb_utils

TOKENS = {TOKENS}


def token_ids(text):
    ids = np.zeros(TOKENS, dtype=np.int64)
    codes = np.frombuffer(text[:TOKENS], dtype=np.uint8)
    ids[: len(codes)] = codes.astype(np.int64) + 1
    return ids


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(model_config, "TOKEN_IDS")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            # TEXT is [rows, 1]: one string per row of the request.
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            ids = np.stack([token_ids(text) for text in texts[:, 0]])
            out = pb_utils.Tensor("TOKEN_IDS", ids.astype(self.output_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

TOKENIZE_CONFIG: Final = f"""\
name: "tokenize"
backend: "python"
max_batch_size: 8
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "TOKEN_IDS" data_type: TYPE_INT64 dims: [ {TOKENS} ] }} ]
# One worker process: each instance is one.
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ }}
"""

TEXT_EMBEDDING_CONFIG: Final = f"""\
name: "text_embedding"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ {EMBEDDING_WIDTH} ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "tokenize"
      model_version: -1
      input_map {{ key: "TEXT" value: "TEXT" }}
      output_map {{ key: "TOKEN_IDS" value: "token_ids" }}
    }},
    {{
      model_name: "embed"
      model_version: -1
      input_map {{ key: "TOKEN_IDS" value: "token_ids" }}
      output_map {{ key: "EMBEDDING" value: "EMBEDDING" }}
    }}
  ]
}}
"""


# A decoupled model (Triton's "Decoupled mode"): any number of responses per request, streamed on
# ModelStreamInfer, then the final flag.
GENERATE_MODEL_PY: Final = """\
\"\"\"A token generator that streams: for a PROMPT and MAX_TOKENS, MAX_TOKENS responses, each one
TOKEN: the prompt's whitespace-separated words in turn, starting over after the last (an empty
prompt or MAX_TOKENS below 1 gives none); then the final flag alone. MAX_TOKENS above
MAX_TOKENS_LIMIT is answered with an error, and a cancelled request stops generating.\"\"\"

import itertools

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_TOKENS_LIMIT = 1_000_000
# Asking whether the request was cancelled is a round trip to the server: once per this many
# tokens (asked at every token, it cut the stream from ~6,500 tokens/s to ~1,900).
CANCEL_CHECK_EVERY = 32


def tokens(prompt, max_tokens):
    \"\"\"One token at a time: the list of them all could be larger than the worker's memory.\"\"\"
    return itertools.islice(itertools.cycle(prompt.split()), max(0, max_tokens))


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()[0]
            count = pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy()[0]
            max_tokens = int(count)
            sender = request.get_response_sender()
            if max_tokens > MAX_TOKENS_LIMIT:
                error = pb_utils.TritonError(
                    f"MAX_TOKENS {max_tokens} is more than this model generates "
                    f"({MAX_TOKENS_LIMIT})",
                    pb_utils.TritonError.INVALID_ARG,
                )
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            for i, token in enumerate(tokens(prompt, max_tokens)):
                if i % CANCEL_CHECK_EVERY == 0 and sender.is_cancelled():
                    break  # the client went away (or its deadline passed): stop generating
                out = pb_utils.Tensor("TOKEN", np.array([token], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        # A decoupled model answers through its senders only.
        return None
"""

GENERATE_CONFIG: Final = """\
name: "generate"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "MAX_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _write_python_model(model_dir: pathlib.Path, model_py: str, config: str) -> None:
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(model_py, encoding="utf-8")
    (model_dir / "config.pbtxt").write_text(config, encoding="utf-8")


def _write_embed(model_dir: pathlib.Path, rng: np.random.Generator) -> None:
    """TOKEN_IDS INT64 [batch, 16] -> EMBEDDING FP32 [batch, 8]: the mean of the table rows of
    the non-padding ids (an embedding bag); all padding gives zeros."""
    table = rng.standard_normal((VOCABULARY, EMBEDDING_WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "TOKEN_IDS"], ["rows"], name="lookup"),
        helper.make_node("Greater", ["TOKEN_IDS", "padding_id"], ["is_token"], name="is_token"),
        helper.make_node("Cast", ["is_token"], ["mask"], to=TensorProto.FLOAT, name="mask"),
        helper.make_node("Unsqueeze", ["mask", "last_axis"], ["mask3"], name="mask3"),
        helper.make_node("Mul", ["rows", "mask3"], ["kept"], name="keep"),
        helper.make_node("ReduceSum", ["kept", "token_axis"], ["total"], keepdims=0, name="sum"),
        helper.make_node("ReduceSum", ["mask", "token_axis"], ["count"], keepdims=1, name="count"),
        helper.make_node("Max", ["count", "one"], ["divisor"], name="at_least_one"),
        helper.make_node("Div", ["total", "divisor"], ["EMBEDDING"], name="mean"),
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [_value_info("TOKEN_IDS", TensorProto.INT64, ["batch", TOKENS])],
        [_value_info("EMBEDDING", TensorProto.FLOAT, ["batch", EMBEDDING_WIDTH])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array(0, dtype=np.int64), "padding_id"),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "last_axis"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "token_axis"),
            numpy_helper.from_array(np.array(1, dtype=np.float32), "one"),
        ],
    )
    config = format_config(
        "embed",
        8,
        [TensorSpec("TOKEN_IDS", "TYPE_INT64", [TOKENS])],
        [TensorSpec("EMBEDDING", "TYPE_FP32", [EMBEDDING_WIDTH])],
    )
    _save(model_dir, graph, config)


def _write_text_embedding(model_dir: pathlib.Path) -> None:
    # An ensemble's version folder is empty: the steps are the model.
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(TEXT_EMBEDDING_CONFIG, encoding="utf-8")


def make_examples(root: pathlib.Path) -> list[str]:
    """Write the example repository under root; return the model names written."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    _write_simple(root / "simple")
    # No config: exercises the server completing the config from the ONNX model.
    write_identity_model(root / "identity_fp32", "FP32", with_config=False)
    _write_mlp(root / "mlp", rng)
    write_identity_model(root / "identity_bytes", "BYTES", max_batch_size=8)
    _write_python_model(root / "tokenize", TOKENIZE_MODEL_PY, TOKENIZE_CONFIG)
    _write_embed(root / "embed", rng)
    _write_text_embedding(root / "text_embedding")
    _write_python_model(root / "generate", GENERATE_MODEL_PY, GENERATE_CONFIG)
    write_decoder(root / "decoder")
    return [
        "simple",
        "identity_fp32",
        "mlp",
        "identity_bytes",
        "tokenize",
        "embed",
        "text_embedding",
        "generate",
        "decoder",
    ]
