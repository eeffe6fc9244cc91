"""model_warmup: samples built from the config, run on every instance before it is ready."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd.errors import ModelLoadError
from inferd.examples import make_examples, write_identity_model
from inferd.executors import OnnxRuntimeExecutor, OnnxRuntimeOptions
from inferd.models.warmup import WarmupSample, warm_up, warmup_samples
from inferd.repository import load_model_config

FILE_INPUT = (
    'inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [2] input_data_file: "%s" } }'
)
OPTIONS = OnnxRuntimeOptions(intra_op_thread_count=1, inter_op_thread_count=1)


def configured(model_dir: Path, warmup: str) -> object:
    config_path = model_dir / "config.pbtxt"
    config_path.write_text(config_path.read_text() + warmup)
    return load_model_config(
        model_dir.name, config_path, model_dir / "1" / "model.onnx", default_max_batch_size=4
    )


class Counting:
    def __init__(self) -> None:
        self.batches: list[list[np.ndarray]] = []

    def execute(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.batches.append(inputs)
        return []

    def close(self) -> None:
        pass


def test_samples_run_count_times_on_every_instance(tmp_path: Path) -> None:
    make_examples(tmp_path)
    config = configured(
        tmp_path / "simple",
        """model_warmup [{
             name: "zeros" batch_size: 2 count: 3
             inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [16] zero_data: true } }
             inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [16] random_data: true } }
           }]""",
    )
    samples = warmup_samples(config, tmp_path / "simple")
    assert [s.name for s in samples] == ["zeros"]
    assert samples[0].inputs[0].shape == (2, 16) and not samples[0].inputs[0].any()
    assert samples[0].inputs[1].dtype == np.int32
    instances = [Counting(), Counting()]
    warm_up(list(instances), samples, "simple")  # type: ignore[arg-type]
    assert [len(i.batches) for i in instances] == [3, 3]
    # And for real, through ONNX Runtime:
    executor = OnnxRuntimeExecutor(
        tmp_path / "simple" / "1" / "model.onnx",
        ["INPUT0", "INPUT1"],
        ["OUTPUT0", "OUTPUT1"],
        OPTIONS,
    )
    warm_up([executor], samples, "simple")


def test_input_data_file_is_read_from_the_warmup_folder(tmp_path: Path) -> None:
    write_identity_model(tmp_path / "m", "FP32")
    (tmp_path / "m" / "warmup").mkdir()
    values = np.arange(6, dtype=np.float32)
    (tmp_path / "m" / "warmup" / "x.bin").write_bytes(values.tobytes())
    config = configured(
        tmp_path / "m",
        """model_warmup [{ name: "file" batch_size: 1
             inputs { key: "INPUT0"
                      value: { data_type: TYPE_FP32 dims: [6] input_data_file: "x.bin" } }
           }]""",
    )
    samples = warmup_samples(config, tmp_path / "m")
    np.testing.assert_array_equal(samples[0].inputs[0], values.reshape(1, 6))


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (
            'inputs { key: "NOPE" value: { data_type: TYPE_FP32 dims: [2] zero_data: true } }',
            "no input",
        ),
        (
            'inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [2] zero_data: true } }',
            "TYPE_FP32",
        ),
        (
            FILE_INPUT % "../../etc",
            "warmup/",
        ),
        (
            FILE_INPUT % "short.bin",
            "needs 8",
        ),
    ],
)
def test_bad_samples_fail_the_load_with_a_reason(tmp_path: Path, sample: str, message: str) -> None:
    write_identity_model(tmp_path / "m", "FP32")
    (tmp_path / "m" / "warmup").mkdir()
    (tmp_path / "m" / "warmup" / "short.bin").write_bytes(b"\0" * 4)
    config = configured(tmp_path / "m", f'model_warmup [{{ name: "w" batch_size: 1 {sample} }}]')
    with pytest.raises(ModelLoadError, match=message):
        warmup_samples(config, tmp_path / "m")


class _FailingExecutor:
    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        raise RuntimeError("the library's own error type")

    def close(self) -> None:
        pass


def test_an_executor_error_during_warm_up_is_a_failed_load_not_a_crash(tmp_path: Path) -> None:
    samples = [WarmupSample("s", 1, [np.zeros((1, 4), dtype=np.float32)])]
    with pytest.raises(ModelLoadError, match="warm-up sample 's': the library's own error"):
        warm_up([_FailingExecutor()], samples, "m")
