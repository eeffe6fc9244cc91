"""A python model's config as its code sees it: Triton's JSON form (``args["model_config"]``),
its Python environment (``EXECUTION_ENV_PATH``) and ``auto_complete_config``.

A model whose ``TritonPythonModel`` defines ``auto_complete_config`` has it run at load, as
Triton does, before the config is checked: in a process of its own (the model's code never runs
in the server), with the model's environment. It may add the inputs, outputs, max_batch_size,
dynamic batching and transaction policy the config leaves out; pb_utils.ModelConfig refuses a
value that contradicts what the config states.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

from google.protobuf import json_format

import inferd
from inferd._proto.model_config_pb2 import ModelConfig
from inferd.errors import ModelLoadError

# Config parameter (Triton's): a python model's own Python environment. inferd takes a
# virtualenv directory (its bin/python runs the worker); $$TRITON_MODEL_DIRECTORY stands for the
# model's folder. Triton's conda-pack archives (.tar.gz) are not unpacked.
EXECUTION_ENV_PATH: Final = "EXECUTION_ENV_PATH"
_AUTO_COMPLETE_TIMEOUT_S: Final = 60.0


def config_json(config: ModelConfig) -> str:
    """The config as Triton gives it to model code: JSON with the proto's field names."""
    as_dict = json_format.MessageToDict(config, preserving_proto_field_name=True)
    for tensor in [*as_dict.get("input", []), *as_dict.get("output", [])]:
        tensor["dims"] = [int(d) for d in tensor.get("dims", [])]  # int64 travels as text in JSON
    return json.dumps(as_dict)


def execution_env(config: ModelConfig, model_dir: Path) -> Path | None:
    """The virtualenv directory the config's EXECUTION_ENV_PATH names, if any."""
    if EXECUTION_ENV_PATH not in config.parameters:
        return None
    text = config.parameters[EXECUTION_ENV_PATH].string_value
    return Path(text.replace("$$TRITON_MODEL_DIRECTORY", str(model_dir)))


def python_of(env: Path | None, where: str) -> str:
    """The interpreter that runs a model's code: the environment's, or the server's own."""
    if env is None:
        return sys.executable
    python = env / "bin" / "python"
    if not python.exists():
        raise ModelLoadError(
            f"{where}: EXECUTION_ENV_PATH {env} is not a virtualenv directory "
            f"({python} does not exist)"
        )
    return str(python)


def worker_environment() -> dict[str, str]:
    """The environment a model's process runs in: the server's, with inferd importable from
    where this server's copy lives (also from a virtualenv of the model's own)."""
    env = dict(os.environ)
    package_root = str(Path(inferd.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def defines_auto_complete(model_file: Path) -> bool:
    """Whether model.py's TritonPythonModel defines auto_complete_config (read, not imported: a
    file that does not parse fails later, in the worker, with Python's own message)."""
    try:
        tree = ast.parse(model_file.read_bytes(), filename=str(model_file))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.ClassDef)
        and node.name == "TritonPythonModel"
        and any(
            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            and item.name == "auto_complete_config"
            for item in node.body
        )
        for node in tree.body
    )


def auto_complete(config: ModelConfig, model_file: Path) -> ModelConfig:
    """``config`` as the model's ``auto_complete_config`` completes it, run in a process of its
    own; ModelLoadError with the model's message when it fails."""
    where = f"model {config.name!r}"
    python = python_of(execution_env(config, model_file.parent.parent), where)
    command = [
        python,
        "-m",
        "inferd.python_backend.worker",
        "--auto-complete-config",
        "--model",
        config.name,
        "--model-file",
        str(model_file),
    ]
    try:
        done = subprocess.run(
            command,
            input=config_json(config).encode(),
            capture_output=True,
            timeout=_AUTO_COMPLETE_TIMEOUT_S,
            env=worker_environment(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ModelLoadError(
            f"{where}: auto_complete_config did not finish within {_AUTO_COMPLETE_TIMEOUT_S:g} s"
        ) from None
    except OSError as error:
        raise ModelLoadError(f"{where}: cannot run {python}: {error}") from error
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise ModelLoadError(f"{where}: auto_complete_config failed: {reason}")
    completed = ModelConfig()
    try:
        json_format.Parse(done.stdout, completed)
    except json_format.ParseError as error:
        raise ModelLoadError(
            f"{where}: auto_complete_config gave a config that is not a model config: {error}"
        ) from None
    return completed
