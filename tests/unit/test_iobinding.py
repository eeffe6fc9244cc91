"""The GPU executor's IOBinding path, run here on the core's host stand-ins (no CUDA): the same
copies, bindings and stream calls as on a GPU, binding CPU memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from inferd.core import CudaStream, DeviceBufferPool, HostBufferPool, pinned_array
from inferd.errors import InvalidArgument
from inferd.examples import make_examples
from inferd.executors.iobinding import IoBindingRunner


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    make_examples(root)
    return root


def runner(model: Path, outputs: list[str]) -> tuple[IoBindingRunner, ort.InferenceSession]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    stream = CudaStream(-1)
    assert not stream.on_device and stream.handle == 0
    return (
        IoBindingRunner(
            ort, session, stream, DeviceBufferPool(-1, 1 << 24), HostBufferPool(1 << 24), outputs
        ),
        session,
    )


def test_iobinding_matches_a_plain_run(repository: Path) -> None:
    run, session = runner(repository / "mlp" / "1" / "model.onnx", ["OUTPUT0"])
    rng = np.random.default_rng(1)
    for rows in (1, 5, 8):
        x = rng.standard_normal((rows, 512)).astype(np.float32)
        (got,) = run.run([("INPUT0", x)])
        (want,) = session.run(["OUTPUT0"], {"INPUT0": x})
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_two_outputs_and_integer_types(repository: Path) -> None:
    run, _ = runner(repository / "simple" / "1" / "model.onnx", ["OUTPUT0", "OUTPUT1"])
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    total, difference = run.run([("INPUT0", a), ("INPUT1", b)])
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(difference, a - b)


def test_bytes_inputs_are_refused(repository: Path) -> None:
    run, _ = runner(repository / "identity_bytes" / "1" / "model.onnx", ["OUTPUT0"])
    with pytest.raises(InvalidArgument, match="BYTES tensors cannot run on a GPU instance"):
        run.run([("INPUT0", np.array([[b"x"]], dtype=object))])


def test_pinned_arrays_and_stand_in_copies() -> None:
    pool = HostBufferPool(1 << 20)
    host = pinned_array(pool, 64)
    assert host.flags.writeable and host.nbytes == 64
    device = DeviceBufferPool(-1, 1 << 20)
    buffer = device.lease(64)
    stream = CudaStream(-1)
    source = np.arange(64, dtype=np.uint8)
    stream.copy_to_device(buffer.ptr, source)
    stream.copy_to_host(host, buffer.ptr)
    stream.synchronize()
    np.testing.assert_array_equal(host, source)
    assert device.stats()["allocations"] == 1 and not device.stats()["on_device"]


def test_a_staged_batch_is_the_one_executed_next(repository: Path) -> None:
    run, session = runner(repository / "mlp" / "1" / "model.onnx", ["OUTPUT0"])
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal((rows, 512)).astype(np.float32) for rows in (2, 3)]
    for x in batches:  # the core's stager runs one batch ahead of execute
        run.stage([("INPUT0", x)])
    assert run._stager.pending() == 2
    for x in batches:
        (got,) = run.run([("INPUT0", x)])
        np.testing.assert_array_equal(got, session.run(["OUTPUT0"], {"INPUT0": x})[0])
    assert run._stager.pending() == 0
