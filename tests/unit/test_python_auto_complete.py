"""Issue 17 item 1: a python model's ``auto_complete_config`` runs at load, in a process of its
own, as Triton runs it: the config it completes is the one the model is served with."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.errors import ModelLoadError
from inferd.python_backend.model_config import defines_auto_complete
from inferd.repository.config import load_model_config

# Written from Triton's python_backend README (auto_complete_config).
COMPLETES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        output_names = [o["name"] for o in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        print("prints go to the log, not into the config")
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""

DECOUPLES = COMPLETES.replace(
    "        return auto_complete_model_config\n",
    "        auto_complete_model_config.set_model_transaction_policy({'decoupled': True})\n"
    "        return auto_complete_model_config\n",
)

CONTRADICTS = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [5]}
        )
        return auto_complete_model_config
"""

RETURNS_NOTHING = COMPLETES.replace(
    "        return auto_complete_model_config\n", "        return None\n"
)


def _model(tmp_path: Path, source: str, config: str) -> tuple[Path, Path]:
    model_dir = tmp_path / "completed"
    (model_dir / "1").mkdir(parents=True)
    model_file = model_dir / "1" / "model.py"
    model_file.write_text(textwrap.dedent(source))
    config_path = model_dir / "config.pbtxt"
    config_path.write_text(config)
    return config_path, model_file


def _load(tmp_path: Path, source: str, config: str = 'backend: "python"\n') -> ModelConfig:
    config_path, model_file = _model(tmp_path, source, config)
    return load_model_config("completed", config_path, model_file, default_max_batch_size=4)


def test_auto_complete_config_adds_the_inputs_outputs_and_batching_at_load(tmp_path: Path) -> None:
    config = _load(tmp_path, COMPLETES)
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [4])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("OUTPUT0", [4])]
    assert config.max_batch_size == 8
    assert config.HasField("dynamic_batching")


def test_auto_complete_config_may_make_the_model_decoupled(tmp_path: Path) -> None:
    config = _load(tmp_path, DECOUPLES)
    assert config.model_transaction_policy.decoupled


def test_a_stated_config_it_contradicts_fails_the_load_with_the_models_message(
    tmp_path: Path,
) -> None:
    stated = 'backend: "python"\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
    with pytest.raises(ModelLoadError, match=r"auto_complete_config failed: .*INPUT0.*dims"):
        _load(tmp_path, CONTRADICTS, stated)


def test_auto_complete_config_must_return_its_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="must return the ModelConfig it was given"):
        _load(tmp_path, RETURNS_NOTHING)


def test_without_auto_complete_config_a_python_config_must_state_its_tensors(
    tmp_path: Path,
) -> None:
    source = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    config_path, model_file = _model(tmp_path, source, 'backend: "python"\n')
    assert not defines_auto_complete(model_file)
    with pytest.raises(ModelLoadError, match="must list its inputs and outputs"):
        load_model_config("completed", config_path, model_file, default_max_batch_size=4)
