"""Issue 25's lesser items, each as a hostile client would find it, through tritonclient against
a real server: config fields out of the core's range, the "server started" record in explicit
mode, the generate example asked for 2^31-1 tokens and cancelled, and a Unix socket flag written
as ``unix:PATH``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server

# In the repository but broken: one the server is asked to load, one it is not.
REQUESTED_BROKEN = "requested_broken"
UNREQUESTED_BROKEN = "unrequested_broken"
STARTUP_MODELS = ["simple", "generate", REQUESTED_BROKEN]


def is_requested_broken_failure(record: dict[str, object]) -> bool:
    return REQUESTED_BROKEN in json.dumps(record)


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("lesser")
    repository = root / "models"
    names = make_examples(repository)
    for broken in (REQUESTED_BROKEN, UNREQUESTED_BROKEN):
        (repository / broken / "1").mkdir(parents=True)
        (repository / broken / "config.pbtxt").write_text("not a config {\n")
    with running_server(
        repository,
        names,
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        ",".join(STARTUP_MODELS),
        expected_errors=is_requested_broken_failure,
    ) as server:
        yield server


@pytest.fixture
def client(explicit_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(explicit_server.url)
    try:
        yield triton
    finally:
        triton.close()


def assert_simple_serves(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("simple", inputs, client_timeout=10)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def simple_override(**fields: object) -> str:
    return json.dumps({"max_batch_size": 8, **fields})


# Each crossed into the core as a narrower C++ integer (pybind11's TypeError text reached the
# client) or overflowed the core's clock arithmetic (loaded as is).
OUT_OF_RANGE = {
    "priority_levels": (
        simple_override(dynamic_batching={"priority_levels": 2**40, "default_priority_level": 1}),
        f"dynamic_batching.priority_levels {2**40} is outside 0..1024",
    ),
    "max_queue_delay": (
        simple_override(dynamic_batching={"max_queue_delay_microseconds": str(2**64 - 1)}),
        f"dynamic_batching.max_queue_delay_microseconds {2**64 - 1} is outside 0..86400000000",
    ),
    "threads": (
        simple_override(parameters={"intra_op_thread_count": {"string_value": str(2**40)}}),
        f"parameter 'intra_op_thread_count' {2**40} is outside 0..1024",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_a_config_field_out_of_the_cores_range_is_refused_in_our_words(
    client: grpcclient.InferenceServerClient, case: str
) -> None:
    override, message = OUT_OF_RANGE[case]
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("simple", config=override)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message in refused.value.message(), refused.value.message()
    assert "TypeError" not in refused.value.message()
    assert_simple_serves(client)  # the failed reload left the old version serving


def test_a_default_priority_level_without_levels_is_ignored_as_in_triton(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Before: 2^40 crossed into the core's uint32 and failed the load with a TypeError."""
    override = simple_override(dynamic_batching={"default_priority_level": str(2**40)})
    try:
        client.load_model("simple", config=override)
        assert_simple_serves(client)
    finally:
        client.load_model("simple")


def test_models_failed_names_only_the_models_asked_for(explicit_server: ServerProcess) -> None:
    """Before: every model of the repository not loaded at start, asked for or not."""
    (started,) = [r for r in explicit_server.records() if r.get("event") == "server started"]
    assert started["models_loaded"] == ["generate", "simple"], started
    assert started["models_failed"] == [REQUESTED_BROKEN], started
