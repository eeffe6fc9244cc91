"""A repository of Triton python-backend models written here from Triton's documented API (the
python_backend README's Business Logic Scripting and Decoupled mode sections and the shapes of
its bls and repeat examples), not copied: what tests/integration/test_triton_python_models.py
serves.

* ``scale`` (ONNX): ``OUTPUT0 = INPUT0 * WEIGHT + BIAS``, FP32 [batch, 4], element by element (so
  a row's answer never depends on what it is batched with).
* ``bls_sync``: ``execute`` calls the model named by its ``MODEL_NAME`` input with
  ``InferenceRequest(...).exec()`` and answers twice its ``OUTPUT0``; a failed call becomes this
  request's error response ("BLS call to '<model>' failed: <the call's message>").
* ``bls_async``: ``async def execute`` sends three calls per request (``INPUT0``, ``+1``, ``+2``),
  all requests' calls at once through ``asyncio.gather`` of ``async_exec()``, and answers the sum
  of their ``OUTPUT0``; a failed call raises ``TritonModelException`` with the call's message.
* ``text_upper``: ``TEXT_OUT`` = ``TEXT`` (BYTES [-1]) upper-cased, and ``PARAMETERS`` = the
  request's ``parameters()`` (its JSON, as one BYTES element).
* ``bls_text``: calls ``text_upper`` with its ``TEXT`` and the parameters ``{"k": 5, "flag":
  true, "s": "x"}``, and answers the call's outputs. ``TEXT`` ``["leave-open"]``: the call is made
  from a thread that ``execute`` does not wait for, and the answer is what the previous such
  call got (``"none"`` for the first): its ``TEXT_OUT``, or ``"error: <message>"``.
* ``repeat_int32`` (``decoupled: true``): for each request, one response per element of ``IN``
  (``OUT`` = the element, ``IDX`` = its index; ``DELAY`` [ms] waited before each), sent through
  ``request.get_response_sender()``, then the final flag alone; ``execute`` returns None.
* ``repeat_threaded``: the same, sent from a thread that ``execute`` starts and does not wait for
  (Triton allows responses after ``execute`` returned); ``finalize`` waits for those threads.
* ``square_int32`` (``decoupled: true``, the shape of Triton's square example): for ``IN`` = n,
  n responses ``OUT`` = n, the last sent together with the final flag
  (``sender.send(response, flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)``); n = 0: the final flag
  alone; n < 0: an error response sent with the final flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inferd.examples import IR_VERSION, OPSET

SCALE_WEIGHT: Final = np.array([0.5, -2.0, 3.25, 1.0], dtype=np.float32)
SCALE_BIAS: Final = np.array([1.0, 0.0, -0.75, 10.0], dtype=np.float32)
WIDTH: Final = 4

SCALE_CONFIG: Final = """\
name: "scale"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

BLS_SYNC_MODEL: Final = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()
            target = model_name.flat[0].decode()
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            call = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", in_0.as_numpy())],
            )
            response = call.exec()
            if response.has_error():
                error = pb_utils.TritonError(
                    f"BLS call to '{target}' failed: {response.error().message()}"
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out * 2)])
            )
        return responses
"""

BLS_ASYNC_MODEL: Final = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

SHIFTS = (0, 1, 2)


class TritonPythonModel:
    async def execute(self, requests):
        calls = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            for shift in SHIFTS:
                call = pb_utils.InferenceRequest(
                    model_name=target.flat[0].decode(),
                    requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", in_0 + np.float32(shift))],
                )
                calls.append(call.async_exec())
        answers = await asyncio.gather(*calls)
        for answer in answers:
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
        responses = []
        for i in range(len(requests)):
            parts = answers[i * len(SHIFTS) : (i + 1) * len(SHIFTS)]
            outs = [pb_utils.get_output_tensor_by_name(p, "OUTPUT0").as_numpy() for p in parts]
            total = outs[0] + outs[1] + outs[2]
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", total)])
            )
        return responses
"""

TEXT_UPPER_MODEL: Final = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text.reshape(-1)], dtype=object)
            parameters = np.array([request.parameters().encode()], dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("TEXT_OUT", upper.reshape(text.shape)),
                        pb_utils.Tensor("PARAMETERS", parameters),
                    ]
                )
            )
        return responses
"""

BLS_TEXT_MODEL: Final = """\
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.thread = None
        self.left_open = [np.array([b"none"], dtype=object)]

    def call(self, text):
        call = pb_utils.InferenceRequest(
            model_name="text_upper",
            requested_output_names=["TEXT_OUT", "PARAMETERS"],
            inputs=[pb_utils.Tensor("TEXT", text)],
            parameters={"k": 5, "flag": True, "s": "x"},
        )
        return call.exec()

    def leave_open(self, text):
        response = self.call(text)
        if response.has_error():
            got = np.array([("error: " + response.error().message()).encode()], dtype=object)
        else:
            got = pb_utils.get_output_tensor_by_name(response, "TEXT_OUT").as_numpy()
        self.left_open.append(got)

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            if text.reshape(-1)[0] == b"leave-open":
                if self.thread is not None:
                    self.thread.join(timeout=30)
                previous = self.left_open[-1]
                self.thread = threading.Thread(target=self.leave_open, args=(text,))
                self.thread.start()
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("TEXT_OUT", previous),
                            pb_utils.Tensor("PARAMETERS", np.array([b""], dtype=object)),
                        ]
                    )
                )
                continue
            response = self.call(text)
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            responses.append(
                pb_utils.InferenceResponse(output_tensors=response.output_tensors())
            )
        return responses
"""

TEXT_CONFIG: Final = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [
  {{ name: "TEXT_OUT" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

BLS_CONFIG: Final = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }}
]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""

# One request's responses, as Triton's repeat example sends them: one per IN element, each after
# its DELAY (ms), then the final flag alone. Both repeat models below run it.
_REPEAT_FUNCTION: Final = """
def repeat(request):
    sender = request.get_response_sender()
    values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
    for index, value in enumerate(values):
        time.sleep(float(delays[index]) / 1000)
        out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
        idx = pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32))
        sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

REPEAT_MODEL: Final = (
    """\
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
"""
    + _REPEAT_FUNCTION
    + """


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("repeat needs decoupled: true")

    def execute(self, requests):
        for request in requests:
            repeat(request)
        return None
"""
)

REPEAT_THREADED_MODEL: Final = (
    """\
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils
"""
    + _REPEAT_FUNCTION
    + """


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        # Responses go out after execute returned: execute only starts the work.
        for request in requests:
            thread = threading.Thread(target=repeat, args=(request,))
            thread.start()
            self.threads.append(thread)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""
)

REPEAT_CONFIG: Final = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }}
]
output [
  {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""

SQUARE_MODEL: Final = """\
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if n < 0:
                error = pb_utils.TritonError(f"IN must be at least 0, got {n}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            if n == 0:
                sender.send(flags=FINAL)
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))
                sender.send(
                    pb_utils.InferenceResponse(output_tensors=[out]),
                    flags=FINAL if i == n - 1 else 0,
                )
        return None
"""

SQUARE_CONFIG: Final = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def write_scale(model_dir: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT0", "weight"], ["scaled"], name="scale"),
            helper.make_node("Add", ["scaled", "bias"], ["OUTPUT0"], name="shift"),
        ],
        "scale",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[
            numpy_helper.from_array(SCALE_WEIGHT, "weight"),
            numpy_helper.from_array(SCALE_BIAS, "bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (model_dir / "config.pbtxt").write_text(SCALE_CONFIG)


def write_python_model(model_dir: Path, model_py: str, config: str) -> None:
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(model_py)
    (model_dir / "config.pbtxt").write_text(config.format(name=model_dir.name))


def write_bls_repository(repository: Path) -> list[str]:
    """``scale``, ``bls_sync``, ``bls_async``, ``text_upper`` and ``bls_text``; returns their
    names."""
    write_scale(repository / "scale")
    write_python_model(repository / "bls_sync", BLS_SYNC_MODEL, BLS_CONFIG)
    write_python_model(repository / "bls_async", BLS_ASYNC_MODEL, BLS_CONFIG)
    write_python_model(repository / "text_upper", TEXT_UPPER_MODEL, TEXT_CONFIG)
    write_python_model(repository / "bls_text", BLS_TEXT_MODEL, TEXT_CONFIG)
    return ["scale", "bls_sync", "bls_async", "text_upper", "bls_text"]


def write_decoupled_repository(repository: Path) -> list[str]:
    """``repeat_int32``, ``repeat_threaded`` and ``square_int32``; returns their names."""
    write_python_model(repository / "repeat_int32", REPEAT_MODEL, REPEAT_CONFIG)
    write_python_model(repository / "repeat_threaded", REPEAT_THREADED_MODEL, REPEAT_CONFIG)
    write_python_model(repository / "square_int32", SQUARE_MODEL, SQUARE_CONFIG)
    return ["repeat_int32", "repeat_threaded", "square_int32"]
