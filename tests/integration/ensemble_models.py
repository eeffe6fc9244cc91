"""Triton-layout repositories with ensembles (issue 16) for the integration tests: small ONNX
composing models, the ensembles' config.pbtxt, and the same models run one by one in-process
with onnxruntime, which is what an ensemble's answer is compared with.

Composing models, FP32 ``[batch, 4]`` unless said, max_batch_size 8, dynamically batched:
``pre`` RAW -> PRE = RAW + 1; ``left`` X -> Y = 2 X; ``right`` X -> Y = X * X; ``combine`` A, B
-> SUM = A + B; ``double1`` X -> Y = 2 X on ``[batch, 1]``; ``gather`` (gather_model.py) INPUT0
INT64 ``[batch, 1]`` -> OUTPUT0 = TABLE[INPUT0], failing inside ONNX Runtime for an index
outside 0..3; ``busy`` and ``slow`` (slow_model.py) INPUT0 -> OUTPUT0 = INPUT0 after work that
scales with the rows, light (about 1.5 ms a row) and heavy (about 100 ms a row); ``ordered``
heavier still (about 0.8 s a row), one request at a time, by priority.

Ensembles: DIAMOND (pre fans out to left and right, combine adds them; outputs OUT and the
intermediate SQUARE), CHAIN (pre -> left -> right), LOOKUP (gather -> double1, listed in the
config with the consumer first), and chains of ``pre`` and ``busy``, ``slow`` or ``ordered``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

from inferd.examples import IR_VERSION, OPSET
from tests.integration.gather_model import write_gather_model
from tests.integration.slow_model import write_slow_model

WIDTH = 4  # the row length of the FP32 models
MAX_BATCH_SIZE = 8


def _composing_config(
    name: str,
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    batching: str = "dynamic_batching { }",
) -> str:
    """A composing model's config.pbtxt: tensors as name -> 'TYPE dims' ('TYPE_FP32 [ 4 ]')."""

    def tensors(key: str, declared: Mapping[str, str]) -> str:
        entries = []
        for tensor, spec in declared.items():
            datatype, dims = spec.split(" ", 1)
            entries.append(f'{{ name: "{tensor}" data_type: {datatype} dims: {dims} }}')
        return f"{key} [ " + ", ".join(entries) + " ]\n"

    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + tensors("input", inputs)
        + tensors("output", outputs)
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + batching
        + "\n"
    )


def _save(model_dir: Path, graph: onnx.GraphProto, config: str) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(config)


def _fp32(name: str, width: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])


def write_elementwise_model(
    model_dir: Path, operation: str, inputs: tuple[str, ...], output: str, width: int = WIDTH
) -> None:
    """``output`` = ``operation`` of ``inputs`` (FP32 [batch, width]): "add_one" (x + 1),
    "double" (2 x), "square" (x * x) of one input, "add" (a + b) of two. The model's name is
    its folder's."""
    constants = {
        "add_one": ("Add", 1.0),
        "double": ("Mul", 2.0),
    }
    initializers = []
    if operation in constants:
        op, value = constants[operation]
        node = helper.make_node(op, [inputs[0], "constant"], [output])
        initializers.append(helper.make_tensor("constant", TensorProto.FLOAT, [], [value]))
    elif operation == "square":
        node = helper.make_node("Mul", [inputs[0], inputs[0]], [output])
    elif operation == "add":
        node = helper.make_node("Add", list(inputs), [output])
    else:
        raise ValueError(f"unknown operation {operation!r}")
    graph = helper.make_graph(
        [node],
        model_dir.name,
        [_fp32(i, width) for i in inputs],
        [_fp32(output, width)],
        initializers,
    )
    dims = f"TYPE_FP32 [ {width} ]"
    config = _composing_config(model_dir.name, dict.fromkeys(inputs, dims), {output: dims})
    _save(model_dir, graph, config)


def write_pre(model_dir: Path) -> None:
    """``pre``: RAW -> PRE = RAW + 1."""
    write_elementwise_model(model_dir, "add_one", ("RAW",), "PRE")


def write_left(model_dir: Path) -> None:
    """``left``: X -> Y = 2 X."""
    write_elementwise_model(model_dir, "double", ("X",), "Y")


def write_right(model_dir: Path) -> None:
    """``right``: X -> Y = X * X."""
    write_elementwise_model(model_dir, "square", ("X",), "Y")


def write_combine(model_dir: Path) -> None:
    """``combine``: A, B -> SUM = A + B."""
    write_elementwise_model(model_dir, "add", ("A", "B"), "SUM")


# Batches of up to 8 wait up to 20 ms to fill, so concurrent good and bad lookups share them.
GATHER_CONFIG = f"""
name: "gather"
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH_SIZE}
input [ {{ name: "INPUT0" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
"""


def _slow_config(name: str, batching: str, max_batch_size: int = MAX_BATCH_SIZE) -> str:
    return f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
dynamic_batching {{ {batching} }}
"""


BUSY_SIZE = 256  # about 1.5 ms a row: a burst of clients queues behind it and batches form
SLOW_SIZE = 1024  # about 100 ms a row: one request keeps the model busy while others queue
# About 0.8 s a row (8 x SLOW_SIZE's work): a queue behind one request holds long enough for a
# metrics poll to see it under AddressSanitizer on a loaded machine.
ORDERED_SIZE = 2048


def write_busy(model_dir: Path) -> None:
    """``busy``: INPUT0 -> OUTPUT0 = INPUT0 (FP32 [batch, 4]), light work per row, batches
    waiting up to 20 ms to fill."""
    config = _slow_config(model_dir.name, "max_queue_delay_microseconds: 20000")
    write_slow_model(model_dir, config, BUSY_SIZE, WIDTH)


def write_slow(model_dir: Path) -> None:
    """``slow``: INPUT0 -> OUTPUT0 = INPUT0 (FP32 [batch, 4]), heavy work per row."""
    write_slow_model(model_dir, _slow_config(model_dir.name, ""), SLOW_SIZE, WIDTH)


def write_ordered(model_dir: Path) -> None:
    """``ordered``: as ``slow``, heavier, one request per execution (max_batch_size 1) taken by
    priority (levels 1 and 2, 2 by default): the execution order is the queue's."""
    config = _slow_config(
        model_dir.name, "priority_levels: 2 default_priority_level: 2", max_batch_size=1
    )
    write_slow_model(model_dir, config, ORDERED_SIZE, WIDTH)


def _step(model: str, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return (
        f'  {{\n    model_name: "{model}"\n    model_version: -1\n    '
        + "\n    ".join(maps)
        + "\n  }"
    )


def ensemble_config(
    name: str,
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    steps: list[str],
    max_batch_size: int = MAX_BATCH_SIZE,
) -> str:
    """An ensemble's config.pbtxt (``platform: "ensemble"``), tensors as name -> 'TYPE dims'
    and steps made by ``_step``, in the order given."""

    def tensors(key: str, declared: Mapping[str, str]) -> str:
        entries = []
        for tensor, spec in declared.items():
            datatype, dims = spec.split(" ", 1)
            entries.append(f'  {{ name: "{tensor}" data_type: {datatype} dims: {dims} }}')
        return f"{key} [\n" + ",\n".join(entries) + "\n]\n"

    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        + tensors("input", inputs)
        + tensors("output", outputs)
        + "ensemble_scheduling {\n  step [\n"
        + ",\n".join(steps)
        + "\n  ]\n}\n"
    )


def write_ensemble(model_dir: Path, config: str) -> None:
    """An ensemble's folder: its config and an empty version folder, as Triton's layout has."""
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)


FP32_ROW = f"TYPE_FP32 [ {WIDTH} ]"

# Steps written out of order (the combining step first): the server orders them by their tensors.
DIAMOND = ensemble_config(
    "diamond",
    {"IN": FP32_ROW},
    {"OUT": FP32_ROW, "SQUARE": FP32_ROW},
    [
        _step("combine", {"A": "doubled", "B": "SQUARE"}, {"SUM": "OUT"}),
        _step("pre", {"RAW": "IN"}, {"PRE": "shifted"}),
        _step("left", {"X": "shifted"}, {"Y": "doubled"}),
        _step("right", {"X": "shifted"}, {"Y": "SQUARE"}),
    ],
)


def chain_config(name: str, pre: str = "pre", left: str = "left", right: str = "right") -> str:
    """IN -> pre -> left -> right -> OUT, three steps (two with ``right=""``)."""
    steps = [
        _step(pre, {"RAW": "IN"}, {"PRE": "shifted"}),
        _step(left, {"X": "shifted"}, {"Y": "doubled" if right else "OUT"}),
    ]
    if right:
        steps.append(_step(right, {"X": "doubled"}, {"Y": "OUT"}))
    return ensemble_config(name, {"IN": FP32_ROW}, {"OUT": FP32_ROW}, steps)


CHAIN = chain_config("chain")

# The failing step (gather) is step 1: the config lists its consumer first.
LOOKUP = ensemble_config(
    "lookup",
    {"INDEX": "TYPE_INT64 [ 1 ]"},
    {"OUT": "TYPE_FP32 [ 1 ]"},
    [
        _step("double1", {"X": "looked_up"}, {"Y": "OUT"}),
        _step("gather", {"INPUT0": "INDEX"}, {"OUTPUT0": "looked_up"}),
    ],
)


def slow_chain_config(name: str, slow: str, max_batch_size: int = MAX_BATCH_SIZE) -> str:
    """IN -> pre -> ``slow`` -> OUT: the answer is IN + 1, its second step queues at ``slow``."""
    return ensemble_config(
        name,
        {"IN": FP32_ROW},
        {"OUT": FP32_ROW},
        [
            _step("pre", {"RAW": "IN"}, {"PRE": "shifted"}),
            _step(slow, {"INPUT0": "shifted"}, {"OUTPUT0": "OUT"}),
        ],
        max_batch_size,
    )


# The models every repository here holds, by name.
BASE_MODELS: dict[str, Callable[[Path], None]] = {
    "pre": write_pre,
    "left": write_left,
    "right": write_right,
    "combine": write_combine,
}


def write_base(repository: Path) -> list[str]:
    """pre, left, right and combine, with the diamond and chain ensembles over them."""
    for name, write in BASE_MODELS.items():
        write(repository / name)
    write_ensemble(repository / "diamond", DIAMOND)
    write_ensemble(repository / "chain", CHAIN)
    return [*BASE_MODELS, "diamond", "chain"]


def write_serving_repository(repository: Path) -> list[str]:
    """The base models and ensembles, the lookup ensemble (gather -> double1) and the busy, slow
    and ordered chains (pre -> busy as ``busy_chain``, and so on)."""
    names = write_base(repository)
    write_gather_model(repository / "gather", GATHER_CONFIG)
    write_elementwise_model(repository / "double1", "double", ("X",), "Y", width=1)
    write_ensemble(repository / "lookup", LOOKUP)
    write_busy(repository / "busy")
    write_ensemble(repository / "busy_chain", slow_chain_config("busy_chain", "busy"))
    write_slow(repository / "slow")
    write_ensemble(repository / "slow_chain", slow_chain_config("slow_chain", "slow"))
    write_ordered(repository / "ordered")
    write_ensemble(repository / "ordered_chain", slow_chain_config("ordered_chain", "ordered", 1))
    return [
        *names,
        *("gather", "double1", "lookup", "busy", "busy_chain", "slow", "slow_chain"),
        *("ordered", "ordered_chain"),
    ]


class InProcess:
    """A repository's ONNX models run one at a time with onnxruntime in this process."""

    def __init__(self, repository: Path) -> None:
        self._repository = repository
        self._sessions: dict[str, onnxruntime.InferenceSession] = {}

    def run(self, model: str, **inputs: np.ndarray) -> np.ndarray:
        """The model's only output for ``inputs``."""
        if model not in self._sessions:
            self._sessions[model] = onnxruntime.InferenceSession(
                str(self._repository / model / "1" / "model.onnx"),
                providers=["CPUExecutionProvider"],
            )
        (output,) = self._sessions[model].run(None, inputs)
        return np.asarray(output)

    def diamond(self, values: np.ndarray) -> dict[str, np.ndarray]:
        shifted = self.run("pre", RAW=values)
        doubled = self.run("left", X=shifted)
        square = self.run("right", X=shifted)
        return {"OUT": self.run("combine", A=doubled, B=square), "SQUARE": square}

    def chain(self, values: np.ndarray) -> np.ndarray:
        return self.run("right", X=self.run("left", X=self.run("pre", RAW=values)))

    def lookup(self, indexes: np.ndarray) -> np.ndarray:
        return self.run("double1", X=self.run("gather", INPUT0=indexes))
