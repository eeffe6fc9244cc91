"""inferd's triton_python_backend_utils behaves as Triton's python backend documents it.

The models here are model.py files written the way Triton's README shows them (add_sub, error
responses, auto_complete_config, a decoupled repeat, BLS, logging, strings); each is imported
with ``import triton_python_backend_utils as pb_utils`` resolving to inferd's module, as the
worker process arranges, and driven the way the worker drives it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pathlib
import sys
import textwrap
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from inferd.python_backend import pb_utils


@pytest.fixture(autouse=True)
def _as_triton_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """pb_utils importable under Triton's name, with no worker hooks left over between tests."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    yield
    pb_utils.set_bls_executor(None)
    pb_utils.set_log_sink(None)


def load_module(tmp_path: pathlib.Path, source: str) -> ModuleType:
    """Imports ``source`` as a model.py, as the worker does."""
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_model(tmp_path: pathlib.Path, source: str) -> Any:
    """The TritonPythonModel class of ``source`` imported as a model.py."""
    return load_module(tmp_path, source).TritonPythonModel


ADD_SUB_CONFIG = {
    "name": "add_sub",
    "backend": "python",
    "max_batch_size": 0,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
}

ADD_SUB = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.model_config = model_config = json.loads(args["model_config"])
            output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
            output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
            self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
            self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

        def execute(self, requests):
            responses = []
            for request in requests:
                in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
                out_0, out_1 = (
                    in_0.as_numpy() + in_1.as_numpy(),
                    in_0.as_numpy() - in_1.as_numpy(),
                )
                out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
                out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
                inference_response = pb_utils.InferenceResponse(
                    output_tensors=[out_tensor_0, out_tensor_1]
                )
                responses.append(inference_response)
            return responses

        def finalize(self):
            print("Cleaning up...")
"""


def request(
    inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str], **kwargs: Any
) -> pb_utils.InferenceRequest:
    """A request built the way the worker builds one for ``execute``."""
    return pb_utils.InferenceRequest(
        model_name="m",
        inputs=[pb_utils.Tensor(name, data) for name, data in inputs.items()],
        requested_output_names=outputs,
        **kwargs,
    )


def initialize_args(config: dict[str, Any]) -> dict[str, str]:
    return {
        "model_config": json.dumps(config),
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
        "model_repository": "/models/add_sub",
        "model_version": "1",
        "model_name": config["name"],
    }


def test_add_sub_answers_each_request_of_a_batch(tmp_path: pathlib.Path) -> None:
    model = load_model(tmp_path, ADD_SUB)()
    model.initialize(initialize_args(ADD_SUB_CONFIG))
    batch = [
        request(
            {
                "INPUT0": np.arange(4, dtype=np.float32) + k,
                "INPUT1": np.ones(4, dtype=np.float32),
            },
            ["OUTPUT0", "OUTPUT1"],
        )
        for k in range(3)
    ]
    responses = model.execute(batch)
    assert len(responses) == 3
    for k, response in enumerate(responses):
        assert not response.has_error() and response.error() is None
        out0 = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
        out1 = pb_utils.get_output_tensor_by_name(response, "OUTPUT1")
        assert out0 is not None and out1 is not None
        np.testing.assert_array_equal(out0.as_numpy(), np.arange(4) + k + 1)
        np.testing.assert_array_equal(out1.as_numpy(), np.arange(4) + k - 1)
        assert out0.as_numpy().dtype == np.float32
        assert out0.triton_dtype() == 11 and out0.shape() == [4] and out0.is_cpu()
        assert pb_utils.get_output_tensor_by_name(response, "OUTPUT2") is None
    assert pb_utils.get_input_tensor_by_name(batch[0], "INPUT9") is None


def test_input_tensor_keeps_the_workers_array_without_a_copy() -> None:
    data = np.arange(6, dtype=np.int64).reshape(2, 3)
    tensor = pb_utils.Tensor("X", data)
    assert tensor.as_numpy() is data
    assert tensor.name() == "X" and tensor.shape() == [2, 3] and tensor.triton_dtype() == 9
    text = np.array([b"a", b"bc"], dtype=np.object_)  # how the worker decodes a BYTES input
    assert pb_utils.Tensor("T", text).as_numpy() is text


ERRORS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                if pb_utils.get_input_tensor_by_name(request, "X") is None:
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("An Error Occurred")))
                elif request.is_cancelled():
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("Message", pb_utils.TritonError.CANCELLED)))
                else:
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            "The file is not found", pb_utils.TritonError.NOT_FOUND)))
            return responses

        def finalize(self):
            raise pb_utils.TritonModelException("An error occurred during finalize.")
"""


def test_error_responses_carry_message_and_code(tmp_path: pathlib.Path) -> None:
    model = load_model(tmp_path, ERRORS)()
    cancelled = request({"X": np.zeros(1, np.float32)}, [])
    cancelled._attach_cancellation(lambda: True)
    missing, found = request({}, []), request({"X": np.zeros(1, np.float32)}, [])
    responses = model.execute([missing, cancelled, found])
    assert all(r.has_error() for r in responses)
    errors = [r.error() for r in responses]
    assert [(e.message(), e.code()) for e in errors] == [
        ("An Error Occurred", pb_utils.TritonError.INTERNAL),
        ("Message", pb_utils.TritonError.CANCELLED),
        ("The file is not found", pb_utils.TritonError.NOT_FOUND),
    ]
    assert not found.is_cancelled() and cancelled.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="during finalize") as raised:
        model.finalize()
    assert raised.value.message() == "An error occurred during finalize."


def test_error_codes_are_tritons() -> None:
    codes = {
        name: getattr(pb_utils.TritonError, name)
        for name in (
            "UNKNOWN",
            "INTERNAL",
            "NOT_FOUND",
            "INVALID_ARG",
            "UNAVAILABLE",
            "UNSUPPORTED",
            "ALREADY_EXISTS",
            "CANCELLED",
        )
    }
    # TRITONSERVER_Error_Code, in tritonserver.h's order.
    assert list(codes.values()) == list(range(8))
    with pytest.raises(pb_utils.TritonModelException, match="not a TritonError code"):
        pb_utils.TritonError("x", 42)


def test_a_response_refuses_what_is_not_a_tensor_or_an_error() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="list of Tensor"):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(2)])  # type: ignore[list-item]
    with pytest.raises(pb_utils.TritonModelException, match="must be a TritonError"):
        pb_utils.InferenceResponse(error="boom")  # type: ignore[arg-type]
    empty = pb_utils.InferenceResponse()
    assert empty.output_tensors() == [] and not empty.has_error()


AUTO_COMPLETE = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            inputs = [{
                'name': 'INPUT0',
                'data_type': 'TYPE_FP32',
                'dims': [4],
                'optional': True
            }, {
                'name': 'INPUT1',
                'data_type': 'TYPE_FP32',
                'dims': [4]
            }]
            outputs = [{
                'name': 'OUTPUT0',
                'data_type': 'TYPE_FP32',
                'dims': [4]
            }, {
                'name': 'OUTPUT1',
                'data_type': 'TYPE_FP32',
                'dims': [4]
            }]
            config = auto_complete_model_config.as_dict()
            input_names = []
            output_names = []
            for input in config['input']:
                input_names.append(input['name'])
            for output in config['output']:
                output_names.append(output['name'])
            for input in inputs:
                if input['name'] not in input_names:
                    auto_complete_model_config.add_input(input)
            for output in outputs:
                if output['name'] not in output_names:
                    auto_complete_model_config.add_output(output)
            auto_complete_model_config.set_max_batch_size(8)
            auto_complete_model_config.set_dynamic_batching()
            auto_complete_model_config.set_model_transaction_policy({"decoupled": False})
            return auto_complete_model_config
"""


def test_auto_complete_config_fills_a_minimal_config(tmp_path: pathlib.Path) -> None:
    model_class = load_model(tmp_path, AUTO_COMPLETE)
    given = {
        "name": "auto",
        "backend": "python",
        "input": [{"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    completed = model_class.auto_complete_config(pb_utils.ModelConfig(given)).as_dict()
    assert [i["name"] for i in completed["input"]] == ["INPUT1", "INPUT0"]
    assert pb_utils.get_input_config_by_name(completed, "INPUT0") == {
        "name": "INPUT0",
        "data_type": "TYPE_FP32",
        "dims": [4],
        "optional": True,
    }
    assert [o["name"] for o in completed["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert completed["max_batch_size"] == 8
    assert completed["dynamic_batching"] == {}
    assert completed["model_transaction_policy"] == {"decoupled": False}
    assert not pb_utils.using_decoupled_model_transaction_policy(completed)
    assert given["input"] == [{"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}]
    assert pb_utils.get_output_config_by_name(completed, "NOPE") is None


def base_config(**fields: Any) -> pb_utils.ModelConfig:
    config: dict[str, Any] = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    config.update(fields)
    return pb_utils.ModelConfig(config)


@pytest.mark.parametrize(
    ("config", "change", "message"),
    [
        (
            {"input": [{"name": "A", "data_type": "TYPE_INT32", "dims": [4]}]},
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]}),
            "input 'A' of model 'm': the configuration specifies data_type TYPE_INT32",
        ),
        (
            {"input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [2]}]},
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]}),
            "specifies dims \\[2\\], auto_complete_config sets \\[4\\]",
        ),
        (
            {"input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": False}]},
            lambda c: c.add_input(
                {"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": True}
            ),
            "specifies optional False",
        ),
        (
            {"output": [{"name": "B", "data_type": "TYPE_INT32", "dims": [1]}]},
            lambda c: c.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1]}),
            "output 'B' of model 'm': the configuration specifies data_type TYPE_INT32",
        ),
        (
            {},
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4], "x": 1}),
            "has properties \\['x'\\]",
        ),
        (
            {},
            lambda c: c.add_output(
                {"name": "B", "data_type": "TYPE_FP32", "dims": [4], "optional": True}
            ),
            "has properties \\['optional'\\]",
        ),
        ({}, lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32"}), "missing 'dims'"),
        ({}, lambda c: c.add_output({"name": "B", "dims": [1]}), "missing 'data_type'"),
        (
            {"max_batch_size": 16},
            lambda c: c.set_max_batch_size(8),
            "specifies max_batch_size 16, auto_complete_config sets 8",
        ),
        (
            {"sequence_batching": {}},
            lambda c: c.set_dynamic_batching(),
            "scheduler is sequence_batching",
        ),
        (
            {"model_transaction_policy": {"decoupled": True}},
            lambda c: c.set_model_transaction_policy({"decoupled": False}),
            "specifies decoupled True",
        ),
        (
            {},
            lambda c: c.set_model_transaction_policy({"decoupled": True, "ordered": True}),
            "accepts only 'decoupled'",
        ),
    ],
)
def test_model_config_refuses_a_contradiction(
    config: dict[str, Any], change: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        change(base_config(**config))


def test_model_config_completes_what_the_configuration_leaves_open() -> None:
    config = base_config(
        max_batch_size=4,
        input=[{"name": "A", "data_type": "TYPE_INVALID", "dims": []}],
        output=[{"name": "B", "data_type": "TYPE_FP32", "dims": [3]}],
        dynamic_batching={"max_queue_delay_microseconds": 100},
    )
    config.add_input({"name": "A", "data_type": "TYPE_INT64", "dims": [-1]})
    config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [3]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    result = config.as_dict()
    assert result["input"] == [{"name": "A", "data_type": "TYPE_INT64", "dims": [-1]}]
    assert result["output"] == [{"name": "B", "data_type": "TYPE_FP32", "dims": [3]}]
    assert result["max_batch_size"] == 8
    assert result["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
    assert pb_utils.using_decoupled_model_transaction_policy(result)
    # Triton hands the config over as JSON text; that form is accepted too.
    assert pb_utils.ModelConfig(json.dumps(result)).as_dict() == result


STRINGS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
                upper = np.array([t.decode("utf-8").upper() for t in text.flat], dtype=np.object_)
                lengths = np.array([len(t) for t in text.flat], dtype=np.int32)
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("UPPER", upper.reshape(text.shape)),
                    pb_utils.Tensor("LENGTH", lengths),
                ]))
            return responses
"""


def test_string_tensors_are_object_arrays_of_bytes(tmp_path: pathlib.Path) -> None:
    model = load_model(tmp_path, STRINGS)()
    text = np.array([b"hello", "wörld".encode()], dtype=np.object_)
    (response,) = model.execute([request({"TEXT": text}, ["UPPER", "LENGTH"])])
    upper = pb_utils.get_output_tensor_by_name(response, "UPPER")
    assert upper is not None and upper.triton_dtype() == 13
    # The model gave str elements; like Triton, they leave as UTF-8 bytes.
    assert upper.as_numpy().dtype == np.object_
    assert upper.as_numpy().tolist() == [b"HELLO", "WÖRLD".encode()]
    length = pb_utils.get_output_tensor_by_name(response, "LENGTH")
    assert length is not None and length.as_numpy().tolist() == [5, 6]


def test_bytes_and_str_numpy_dtypes() -> None:
    fixed = pb_utils.Tensor("S", np.array([b"ab", b"c"]))
    assert fixed.triton_dtype() == 13 and fixed.as_numpy().tolist() == [b"ab", b"c"]
    assert all(type(e) is bytes for e in fixed.as_numpy().flat)
    with pytest.raises(pb_utils.TritonModelException, match=r"Tensor 'U'.*np.object_"):
        pb_utils.Tensor("U", np.array(["ab"]))
    encoded = pb_utils.serialize_byte_tensor(np.array([b"ab", "c", b""], dtype=np.object_))
    assert encoded == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00"
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"ab", b"c", b""]
    with pytest.raises(pb_utils.TritonModelException, match="runs past the end"):
        pb_utils.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")


def test_type_conversions_follow_tritons_tables() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert np.dtype(pb_utils.triton_string_to_numpy("TYPE_BOOL")) == np.dtype(bool)
    for unknown in ("TYPE_BF16", "FP32", "TYPE_BYTES", "TYPE_NOPE"):
        with pytest.raises(pb_utils.TritonModelException, match=unknown):
            pb_utils.triton_string_to_numpy(unknown)
    assert pb_utils.triton_to_numpy_type(11) is np.float32
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_to_numpy_type(14) is None
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.dtype(np.int8)) == 6
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None


REPEAT = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            import json
            self.model_config = json.loads(args["model_config"])
            if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
                raise pb_utils.TritonModelException(
                    "model can only be used with decoupled transaction policy")

        def execute(self, requests):
            for request in requests:
                values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                sender = request.get_response_sender()
                for value in values:
                    out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                    sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""


class RecordingSender:
    """The worker's side of InferenceResponseSender, recording what the model sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[pb_utils.InferenceResponse | None, int]] = []

    def send(self, response: pb_utils.InferenceResponse | None = None, flags: int = 0) -> None:
        self.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        return False


def test_decoupled_repeat_sends_through_the_attached_sender(tmp_path: pathlib.Path) -> None:
    model_class = load_model(tmp_path, REPEAT)
    config = {"name": "repeat", "model_transaction_policy": {"decoupled": True}}
    model = model_class()
    model.initialize(initialize_args(config))
    senders = [RecordingSender(), RecordingSender()]
    batch = [
        request({"IN": np.array([4, 2, 0], np.int32)}, ["OUT"]),
        request({"IN": np.array([], np.int32)}, []),
    ]
    for each, sender in zip(batch, senders, strict=True):
        each._attach_response_sender(sender)
    assert model.execute(batch) is None
    first = [
        (r.output_tensors()[0].as_numpy().tolist() if r else None, f) for r, f in senders[0].sent
    ]
    assert first == [([4], 0), ([2], 0), ([0], 0), (None, 1)]
    assert senders[1].sent == [(None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]

    with pytest.raises(pb_utils.TritonModelException, match="decoupled transaction policy"):
        model_class().initialize(initialize_args({"name": "repeat"}))


def test_response_sender_only_for_decoupled_models() -> None:
    with pytest.raises(pb_utils.TritonModelException, match=r"get_response_sender.*decoupled"):
        request({}, []).get_response_sender()


BLS = """
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                inference_request = pb_utils.InferenceRequest(
                    model_name="add_sub",
                    requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
                    parameters={"key": "value", "n": 1})
                inference_response = inference_request.exec()
                if inference_response.has_error():
                    raise pb_utils.TritonModelException(inference_response.error().message())
                output0 = pb_utils.get_output_tensor_by_name(inference_response, "OUTPUT0")
                responses.append(pb_utils.InferenceResponse([output0]))
            return responses


    class AsyncModel:
        async def execute(self, requests):
            inference_request = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", np.ones(2, np.float32))])
            infer_response_awaits = []
            for i in range(4):
                infer_response_awaits.append(inference_request.async_exec())
            infer_responses = await asyncio.gather(*infer_response_awaits)
            return [
                pb_utils.InferenceResponse([
                    pb_utils.get_output_tensor_by_name(infer_responses[i], "OUTPUT0")])
                for i, _ in enumerate(requests)
            ]
"""


def doubling_executor(
    calls: list[tuple[pb_utils.InferenceRequest, bool]],
) -> pb_utils.BlsExecutor:
    def execute(
        bls_request: pb_utils.InferenceRequest, decoupled: bool
    ) -> pb_utils.InferenceResponse:
        calls.append((bls_request, decoupled))
        tensor = pb_utils.get_input_tensor_by_name(bls_request, "INPUT0")
        assert tensor is not None
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy() * 2)])

    return execute


def test_bls_exec_goes_through_the_workers_executor(tmp_path: pathlib.Path) -> None:
    model = load_model(tmp_path, BLS)()
    batch = [request({"INPUT0": np.array([1.0, 2.0], np.float32)}, ["OUTPUT0"])]
    with pytest.raises(pb_utils.TritonModelException, match=r"InferenceRequest.exec is not"):
        model.execute(batch)

    calls: list[tuple[pb_utils.InferenceRequest, bool]] = []
    pb_utils.set_bls_executor(doubling_executor(calls))
    (response,) = model.execute(batch)
    out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
    assert out is not None and out.as_numpy().tolist() == [2.0, 4.0]
    ((bls_request, decoupled),) = calls
    assert not decoupled
    assert bls_request.model_name() == "add_sub" and bls_request.model_version() == -1
    assert bls_request.requested_output_names() == ["OUTPUT0"]
    assert json.loads(bls_request.parameters()) == {"key": "value", "n": 1}


def test_bls_async_exec_from_async_execute(tmp_path: pathlib.Path) -> None:
    model = load_module(tmp_path, BLS).AsyncModel()

    with pytest.raises(pb_utils.TritonModelException, match=r"InferenceRequest.async_exec is not"):
        asyncio.run(model.execute([request({}, [])]))

    calls: list[tuple[pb_utils.InferenceRequest, bool]] = []
    pb_utils.set_bls_executor(doubling_executor(calls))
    responses = asyncio.run(model.execute([request({}, []), request({}, [])]))
    assert [r.output_tensors()[0].as_numpy().tolist() for r in responses] == [[2.0, 2.0]] * 2
    assert len(calls) == 4


def test_request_accessors_and_parameters() -> None:
    built = request(
        {"X": np.zeros(1, np.float32)},
        ["Y"],
        model_version=3,
        request_id="r1",
        correlation_id="seq-4",
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
        timeout=5,
        parameters='{"a": 1}',
    )
    assert built.request_id() == "r1" and built.correlation_id() == "seq-4"
    assert built.flags() == 3 and built.timeout() == 5 and built.model_version() == 3
    assert [t.name() for t in built.inputs()] == ["X"]
    assert json.loads(built.parameters()) == {"a": 1}
    assert request({}, []).parameters() == "{}" and request({}, []).correlation_id() == 0
    with pytest.raises(pb_utils.TritonModelException, match="'bad' has a float"):
        request({}, [], parameters={"bad": 1.5})
    with pytest.raises(pb_utils.TritonModelException, match="inputs must be a list of Tensor"):
        pb_utils.InferenceRequest("m", [np.zeros(1)], [])  # type: ignore[list-item]
    built.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)


LOGGING = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            logger = pb_utils.Logger
            logger.log_info("Info Msg!")
            logger.log_warn("Warning Msg!")
            logger.log_error("Error Msg!")
            logger.log_verbose("Verbose Msg!")
            logger.log("Specific Msg!", logger.INFO)
            logger.log("Default Msg!")
            logger.log("Enum Msg!", logger.LogLevel.ERROR)
            return []
"""


def test_logger_writes_through_the_workers_sink(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_model(tmp_path, LOGGING)()
    model.execute([])
    assert capsys.readouterr().err.splitlines()[:2] == ["INFO: Info Msg!", "WARNING: Warning Msg!"]

    records: list[tuple[str, str]] = []
    pb_utils.set_log_sink(lambda level, message: records.append((level, message)))
    model.execute([])
    assert records == [
        ("INFO", "Info Msg!"),
        ("WARNING", "Warning Msg!"),
        ("ERROR", "Error Msg!"),
        ("VERBOSE", "Verbose Msg!"),
        ("INFO", "Specific Msg!"),
        ("INFO", "Default Msg!"),
        ("ERROR", "Enum Msg!"),
    ]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name", sorted(pb_utils.UNSUPPORTED))
def test_each_unsupported_name_raises_naming_itself(name: str) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=f"{name} .*not supported by inferd"):
        getattr(pb_utils, name)
    with pytest.raises(pb_utils.TritonModelException, match=f"{name} .*not supported by inferd"):
        exec(f"from triton_python_backend_utils import {name}", {})


def test_unsupported_methods_raise_naming_themselves() -> None:
    tensor = pb_utils.Tensor("X", np.zeros(2, np.float32))
    with pytest.raises(pb_utils.TritonModelException, match=r"Tensor.to_dlpack is not supported"):
        tensor.to_dlpack()
    with pytest.raises(pb_utils.TritonModelException, match=r"Tensor.from_dlpack is not supported"):
        pb_utils.Tensor.from_dlpack("X", object())


def test_a_request_keeps_its_release_flags_for_the_worker() -> None:
    plain = request({}, [])
    assert plain._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    plain.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert plain._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE  # the loop's
    with pytest.raises(pb_utils.TritonModelException, match="unknown flags 5"):
        plain.set_release_flags(5)


def test_a_name_triton_lacks_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        getattr(pb_utils, "no_such_name")  # noqa: B009 - the name is the point
