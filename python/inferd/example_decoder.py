"""The example autoregressive decoder (``decoder``, written by ``inferd make-examples``): a GRU
over a 512-token vocabulary with fixed weights (a seeded generator), served as an iterative
sequence so that the core batches generations continuously, step by step, and streams each
token. ``decoder_whole`` is the same network run the classic way, the benchmark's baseline: one
request is one whole generation inside one execution, a batch running until its longest request
is done (an ONNX Loop).

One step: the embedding of TOKEN, a GRU cell from the hidden state H, NEXT the most likely next
token (argmax of the logits), DONE once STEP (the steps so far) reaches the request's LENGTH. H
and STEP are implicit state (the core keeps them per generation), NEXT is fed back as the next
step's TOKEN (``inferd.iterative.feedback``), DONE ends it (``inferd.iterative.end_output``).
"""

from __future__ import annotations

import pathlib
from typing import Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inferd.onnx_versions import IR_VERSION, OPSET

VOCABULARY: Final = 512
EMBEDDING: Final = 128
HIDDEN: Final = 384
MAX_STEPS: Final = 1024  # a generation's most tokens
MAX_BATCH: Final = 64
SEED: Final = 7
ZERO: Final = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])

DECODER_CONFIG: Final = f"""\
name: "decoder"
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
input [
  {{ name: "TOKEN" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "LENGTH" data_type: TYPE_INT32 dims: [ 1 ] }}
]
output [
  {{ name: "NEXT" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "DONE" data_type: TYPE_BOOL dims: [ 1 ] }}
]
model_transaction_policy {{ decoupled: true }}
sequence_batching {{
  iterative_sequence: true
  oldest {{ max_candidate_sequences: {MAX_BATCH} }}
  state [
    {{
      input_name: "H"
      output_name: "H_OUT"
      data_type: TYPE_FP32
      dims: [ {HIDDEN} ]
      initial_state {{ data_type: TYPE_FP32 dims: [ {HIDDEN} ] zero_data: true name: "zero" }}
    }},
    {{
      input_name: "STEP"
      output_name: "STEP_OUT"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }}
    }}
  ]
}}
parameters {{ key: "inferd.iterative.feedback" value: {{ string_value: "NEXT:TOKEN" }} }}
parameters {{ key: "inferd.iterative.end_output" value: {{ string_value: "DONE" }} }}
parameters {{ key: "inferd.iterative.max_steps" value: {{ string_value: "{MAX_STEPS}" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

DECODER_WHOLE_CONFIG: Final = f"""\
name: "decoder_whole"
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
input [
  {{ name: "TOKEN" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "LENGTH" data_type: TYPE_INT32 dims: [ 1 ] }}
]
output [ {{ name: "TOKENS" data_type: TYPE_INT64 dims: [ -1 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _weights() -> list[onnx.TensorProto]:
    """The network's fixed weights, scaled so that the hidden state neither dies nor saturates."""
    rng = np.random.default_rng(SEED)

    def tensor(name: str, *shape: int, scale: float) -> onnx.TensorProto:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        return numpy_helper.from_array(values, name)

    return [
        tensor("embedding", VOCABULARY, EMBEDDING, scale=1.0),
        tensor("w_input", EMBEDDING, 3 * HIDDEN, scale=EMBEDDING**-0.5),
        tensor("w_hidden", HIDDEN, 3 * HIDDEN, scale=HIDDEN**-0.5),
        tensor("b_gates", 3 * HIDDEN, scale=0.1),
        tensor("w_logits", HIDDEN, VOCABULARY, scale=HIDDEN**-0.5),
        numpy_helper.from_array(np.array([HIDDEN] * 3, np.int64), "gate_sizes"),
    ]


def _step(token: str, hidden: str, prefix: str) -> tuple[list[onnx.NodeProto], str, str]:
    """One GRU step's nodes (PyTorch's gate order r, z, n): the new hidden state's name and
    the next token's ([batch, 1] INT64)."""

    def name(part: str) -> str:
        return f"{prefix}{part}"

    nodes = [
        helper.make_node("Gather", ["embedding", token], [name("embedded")], axis=0),
        helper.make_node("Flatten", [name("embedded")], [name("x")], axis=1),
        helper.make_node("MatMul", [name("x"), "w_input"], [name("xw")]),
        helper.make_node("Add", [name("xw"), "b_gates"], [name("gi")]),
        helper.make_node("MatMul", [hidden, "w_hidden"], [name("gh")]),
        helper.make_node(
            "Split", [name("gi"), "gate_sizes"], [name("gi_r"), name("gi_z"), name("gi_n")], axis=1
        ),
        helper.make_node(
            "Split", [name("gh"), "gate_sizes"], [name("gh_r"), name("gh_z"), name("gh_n")], axis=1
        ),
        helper.make_node("Add", [name("gi_r"), name("gh_r")], [name("r_in")]),
        helper.make_node("Sigmoid", [name("r_in")], [name("r")]),
        helper.make_node("Add", [name("gi_z"), name("gh_z")], [name("z_in")]),
        helper.make_node("Sigmoid", [name("z_in")], [name("z")]),
        helper.make_node("Mul", [name("r"), name("gh_n")], [name("r_gh_n")]),
        helper.make_node("Add", [name("gi_n"), name("r_gh_n")], [name("n_in")]),
        helper.make_node("Tanh", [name("n_in")], [name("n")]),
        # h' = n + z * (h - n)
        helper.make_node("Sub", [hidden, name("n")], [name("h_minus_n")]),
        helper.make_node("Mul", [name("z"), name("h_minus_n")], [name("z_h")]),
        helper.make_node("Add", [name("n"), name("z_h")], [name("h_new")]),
        helper.make_node("MatMul", [name("h_new"), "w_logits"], [name("logits")]),
        helper.make_node("ArgMax", [name("logits")], [name("next")], axis=1, keepdims=1),
    ]
    return nodes, name("h_new"), name("next")


def _save(model_dir: pathlib.Path, graph: onnx.GraphProto, config: str) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (model_dir / "config.pbtxt").write_text(config, encoding="utf-8")


def write_decoder(model_dir: pathlib.Path) -> None:
    """The decoder's one step, served as an iterative sequence (DECODER_CONFIG)."""
    nodes, hidden, next_token = _step("TOKEN", "H", "")
    one = numpy_helper.from_array(np.array(1, np.int32), "one")
    nodes += [
        helper.make_node("Identity", [hidden], ["H_OUT"]),
        helper.make_node("Identity", [next_token], ["NEXT"]),
        helper.make_node("Add", ["STEP", "one"], ["STEP_OUT"]),
        helper.make_node("GreaterOrEqual", ["STEP_OUT", "LENGTH"], ["DONE"]),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [
            helper.make_tensor_value_info("TOKEN", TensorProto.INT64, ["batch", 1]),
            helper.make_tensor_value_info("LENGTH", TensorProto.INT32, ["batch", 1]),
            helper.make_tensor_value_info("H", TensorProto.FLOAT, ["batch", HIDDEN]),
            helper.make_tensor_value_info("STEP", TensorProto.INT32, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("NEXT", TensorProto.INT64, ["batch", 1]),
            helper.make_tensor_value_info("DONE", TensorProto.BOOL, ["batch", 1]),
            helper.make_tensor_value_info("H_OUT", TensorProto.FLOAT, ["batch", HIDDEN]),
            helper.make_tensor_value_info("STEP_OUT", TensorProto.INT32, ["batch", 1]),
        ],
        initializer=[*_weights(), one],
    )
    _save(model_dir, graph, DECODER_CONFIG)


def write_whole_decoder(model_dir: pathlib.Path) -> None:
    """The same network, a whole generation per request: TOKENS [batch, n], n the batch's
    longest LENGTH (a request's first LENGTH tokens are its own)."""
    body_nodes, hidden, next_token = _step("token_in", "h_in", "body_")
    body_nodes += [
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Identity", [hidden], ["h_out"]),
        helper.make_node("Identity", [next_token], ["token_out"]),
        helper.make_node("Identity", [next_token], ["scanned"]),
    ]
    body = helper.make_graph(
        body_nodes,
        "step",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["batch", HIDDEN]),
            helper.make_tensor_value_info("token_in", TensorProto.INT64, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["batch", HIDDEN]),
            helper.make_tensor_value_info("token_out", TensorProto.INT64, ["batch", 1]),
            helper.make_tensor_value_info("scanned", TensorProto.INT64, ["batch", 1]),
        ],
    )
    constants = [
        numpy_helper.from_array(np.array([HIDDEN], np.int64), "hidden_size"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_1d"),
        numpy_helper.from_array(np.array([1], np.int64), "one_1d"),
        numpy_helper.from_array(np.array([2], np.int64), "two_1d"),
        numpy_helper.from_array(np.array(True), "true"),
    ]
    nodes = [
        helper.make_node("ReduceMax", ["LENGTH"], ["longest_i32"], keepdims=0),
        helper.make_node("Cast", ["longest_i32"], ["longest"], to=TensorProto.INT64),
        helper.make_node("Shape", ["TOKEN"], ["token_shape"]),
        helper.make_node("Slice", ["token_shape", "zero_1d", "one_1d"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "hidden_size"], ["h_shape"], axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["h_shape"],
            ["h0"],
            value=ZERO,
        ),
        helper.make_node(
            "Loop",
            ["longest", "true", "h0", "TOKEN"],
            ["h_last", "token_last", "tokens_by_step"],
            body=body,
        ),
        helper.make_node("Squeeze", ["tokens_by_step", "two_1d"], ["tokens_nb"]),
        helper.make_node("Transpose", ["tokens_nb"], ["TOKENS"], perm=[1, 0]),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder_whole",
        [
            helper.make_tensor_value_info("TOKEN", TensorProto.INT64, ["batch", 1]),
            helper.make_tensor_value_info("LENGTH", TensorProto.INT32, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("TOKENS", TensorProto.INT64, ["batch", "steps"])],
        initializer=[*_weights(), *constants],
    )
    _save(model_dir, graph, DECODER_WHOLE_CONFIG)


def reference_tokens(first: int, length: int) -> list[int]:
    """What the decoder generates from `first` for `length` steps, computed with numpy from the
    same weights: what a client checks the served tokens against."""
    weights = {t.name: numpy_helper.to_array(t) for t in _weights()}
    h = np.zeros((1, HIDDEN), np.float32)
    token = first
    out: list[int] = []
    for _ in range(length):
        x = weights["embedding"][token][None, :]
        gi = x @ weights["w_input"] + weights["b_gates"]
        gh = h @ weights["w_hidden"]
        r = 1 / (1 + np.exp(-(gi[:, :HIDDEN] + gh[:, :HIDDEN])))
        z = 1 / (1 + np.exp(-(gi[:, HIDDEN : 2 * HIDDEN] + gh[:, HIDDEN : 2 * HIDDEN])))
        n = np.tanh(gi[:, 2 * HIDDEN :] + r * gh[:, 2 * HIDDEN :])
        h = (n + z * (h - n)).astype(np.float32)
        token = int(np.argmax(h @ weights["w_logits"], axis=1)[0])
        out.append(token)
    return out
