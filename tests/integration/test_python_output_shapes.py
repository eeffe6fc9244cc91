"""A python model's outputs are checked against its config (issue 25, item 9): the dtype always
was, the shape was not, so a model answering [1, 7] or [3, 4] for a one-row request of dims [4]
reached the client as if its config allowed it. The core now fails that request alone, naming the
output, its shape and the config's."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server

# MODE picks the shape of OUT: 0 the config's, 1 a wrong fixed dim, 2 a wrong batch dim, 3 a
# wrong rank.
SHAPER = """
import numpy as np
import triton_python_backend_utils as pb_utils

SHAPES = {0: (1, 4), 1: (1, 7), 2: (3, 4), 3: (1, 2, 2)}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().flat[0])
            out = pb_utils.Tensor("OUT", np.zeros(SHAPES[mode], np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def expected_error(record: dict[str, object]) -> bool:
    return "answered output 'OUT' with shape" in str(record)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("python-shapes")
    model = root / "models" / "shaper"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SHAPER)
    (model / "config.pbtxt").write_text(
        'name: "shaper"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    with running_server(
        root / "models", ["shaper"], root, expected_errors=expected_error
    ) as running:
        yield running


def infer(client: grpcclient.InferenceServerClient, mode: int) -> np.ndarray:
    tensor = grpcclient.InferInput("MODE", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[mode]], np.int32))
    result: np.ndarray = client.infer("shaper", [tensor]).as_numpy("OUT")
    return result


@pytest.mark.parametrize(("mode", "shape"), [(1, "[1, 7]"), (2, "[3, 4]"), (3, "[1, 2, 2]")])
def test_an_output_shape_its_config_does_not_allow_fails_the_request(
    server: ServerProcess, mode: int, shape: str
) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            infer(client, mode)
        assert refused.value.status() == "StatusCode.INTERNAL", refused.value
        assert (
            f"model 'shaper' answered output 'OUT' with shape {shape}, not its config's [4] "
            "after a batch dim of 1" in refused.value.message()
        ), refused.value.message()
        assert infer(client, 0).shape == (1, 4)  # the next request is served
    finally:
        client.close()
