"""Model warm-up (config ``model_warmup``): samples run on every executor instance before a
version is marked ready, so the first real request does not pay ONNX Runtime's first-run cost."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from inferd._proto.model_config_pb2 import ModelConfig, ModelInput, ModelWarmup
from inferd.core import Executor
from inferd.datatypes import BY_CONFIG_TYPE, Datatype
from inferd.errors import Cancelled, ModelLoadError

log = structlog.get_logger(__name__)

WARMUP_FOLDER = "warmup"  # input_data_file names a file in <model>/warmup/, as in Triton


@dataclass(frozen=True)
class WarmupLimits:
    """What one version's warm-up may cost: a config (or a load request's override) asking for
    more is refused before anything is allocated or run. ``None``: no limit."""

    max_count: int | None = None  # runs of one sample (--max-warmup-count)
    max_bytes: int | None = None  # input bytes of all samples together (--max-warmup-bytes)
    timeout_s: float | None = None  # all runs on every instance, seconds (--warmup-timeout-secs)


# BYTES elements made up (zero or random data) are this many bytes each.
_MADE_UP_BYTES_ELEMENT = 8


@dataclass(frozen=True)
class WarmupSample:
    name: str
    count: int
    inputs: list[np.ndarray | None]  # the config's input order; None: optional, left out


def _array(
    datatype: Datatype,
    shape: tuple[int, ...],
    source: ModelWarmup.Input,
    model_dir: Path,
    where: str,
) -> np.ndarray:
    choice = source.WhichOneof("input_data_type")
    count = math.prod(shape)
    if choice == "input_data_file":
        path = _data_file(source, model_dir, where)
        raw = path.read_bytes()
        if datatype.is_bytes:
            # One element per file, as Triton does for STRING warm-up data.
            return np.full(shape, raw, dtype=object)
        if len(raw) != count * datatype.itemsize:
            raise ModelLoadError(
                f"{where}: {path.name} has {len(raw)} bytes, shape {list(shape)} of "
                f"{datatype.name} needs {count * datatype.itemsize}"
            )
        return np.frombuffer(raw, dtype=datatype.numpy).reshape(shape)
    if datatype.is_bytes:
        return np.full(shape, b"" if choice != "random_data" else b"warmup", dtype=object)
    if choice == "random_data":
        rng = np.random.default_rng(0)
        if datatype.numpy.kind == "f" and datatype.name != "BF16":
            return rng.standard_normal(shape).astype(datatype.numpy)
        if datatype.numpy.kind == "b":
            return rng.integers(0, 2, size=shape).astype(bool)
        return rng.integers(0, 8, size=shape).astype(datatype.numpy)
    return np.zeros(shape, dtype=datatype.numpy)


def _data_file(source: ModelWarmup.Input, model_dir: Path, where: str) -> Path:
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / source.input_data_file).resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        raise ModelLoadError(f"{where}: input_data_file must name a file in {WARMUP_FOLDER}/")
    return path


def _input_bytes(
    datatype: Datatype,
    shape: tuple[int, ...],
    source: ModelWarmup.Input,
    model_dir: Path,
    where: str,
) -> int:
    """The bytes ``_array`` would allocate for this input, known before it allocates them."""
    count = math.prod(shape)
    if datatype.is_bytes:
        if source.WhichOneof("input_data_type") == "input_data_file":
            return count * _data_file(source, model_dir, where).stat().st_size
        return count * _MADE_UP_BYTES_ELEMENT
    return count * datatype.itemsize


def warmup_samples(
    config: ModelConfig, model_dir: Path, limits: WarmupLimits | None = None
) -> list[WarmupSample]:
    """The config's warm-up samples as arrays, checked against its inputs and ``limits`` (every
    sample's count and size are checked before the first array is made)."""
    limits = limits or WarmupLimits()
    samples: list[WarmupSample] = []
    batched = config.max_batch_size > 0
    total_bytes = 0
    for sample in config.model_warmup:
        where = f"model {config.name!r} warm-up sample {sample.name!r}"
        rows = max(1, int(sample.batch_size))
        if batched and rows > config.max_batch_size:
            raise ModelLoadError(f"{where}: batch_size {rows} exceeds max_batch_size")
        if limits.max_count is not None and sample.count > limits.max_count:
            raise ModelLoadError(
                f"{where}: count {sample.count} exceeds the server's limit of {limits.max_count} "
                "(--max-warmup-count)"
            )
        unknown = sorted(set(sample.inputs) - {t.name for t in config.input})
        if unknown:
            raise ModelLoadError(f"{where}: the model has no input(s) {unknown}")
        arrays: list[np.ndarray | None] = []
        for tensor in config.input:
            if tensor.name not in sample.inputs and tensor.optional:
                arrays.append(None)
                continue
            if tensor.name not in sample.inputs:
                raise ModelLoadError(f"{where}: no data for input {tensor.name!r}")
            source = sample.inputs[tensor.name]
            datatype = BY_CONFIG_TYPE[tensor.data_type]
            if source.data_type != tensor.data_type:
                said = BY_CONFIG_TYPE.get(source.data_type)
                raise ModelLoadError(
                    f"{where}: input {tensor.name!r} is {datatype.config_name}, the sample says "
                    f"{said.config_name if said else source.data_type}"
                )
            dims = tuple(int(d) for d in source.dims)
            if (
                len(dims) != len(tensor.dims)
                or any(c != -1 and c != d for c, d in zip(tensor.dims, dims, strict=True))
                or any(d < 0 for d in dims)
            ):
                raise ModelLoadError(
                    f"{where}: input {tensor.name!r} dims {list(dims)} "
                    f"do not fit {list(tensor.dims)}"
                )
            shape = ((rows,) if batched else ()) + dims
            total_bytes += _input_bytes(
                datatype, shape, source, model_dir, f"{where} input {tensor.name!r}"
            )
            if limits.max_bytes is not None and total_bytes > limits.max_bytes:
                raise ModelLoadError(
                    f"{where}: the warm-up inputs need more than the server's limit of "
                    f"{limits.max_bytes} bytes (--max-warmup-bytes)"
                )
            array = _array(datatype, shape, source, model_dir, f"{where} input {tensor.name!r}")
            if tensor.HasField("reshape"):
                # The model sees reshape.shape (its -1, if any, takes what dims leave).
                array = array.reshape(shape[: len(shape) - len(dims)] + _model_dims(tensor, dims))
            arrays.append(array)
        samples.append(WarmupSample(sample.name, max(1, int(sample.count)), arrays))
    return samples


def _model_dims(tensor: ModelInput, dims: tuple[int, ...]) -> tuple[int, ...]:
    count = int(np.prod(dims, dtype=np.int64))
    known = int(np.prod([d for d in tensor.reshape.shape if d != -1], dtype=np.int64))
    return tuple(count // known if d == -1 else int(d) for d in tensor.reshape.shape)


def warm_up(
    executors: list[Executor],
    samples: list[WarmupSample],
    model: str,
    *,
    timeout_s: float | None = None,
    abandon: threading.Event | None = None,
) -> None:
    """Runs every sample ``count`` times on every instance; a failure fails the load. Between
    runs it stops when ``abandon`` is set (the load was cancelled, or the server is stopping:
    Cancelled) or ``timeout_s`` has passed (a failed load)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    for executor in executors:
        for sample in samples:
            for run in range(sample.count):
                if abandon is not None and abandon.is_set():
                    raise Cancelled(f"model {model!r}: the load was abandoned during warm-up")
                if deadline is not None and time.monotonic() > deadline:
                    raise ModelLoadError(
                        f"model {model!r} warm-up took longer than the server's limit of "
                        f"{timeout_s:g} s (--warmup-timeout-secs)"
                    )
                # At debug level: which run a slow start is in.
                log.debug("warm-up run", model=model, sample=sample.name, run=run + 1)
                try:
                    executor.execute(list(sample.inputs))
                except Exception as e:  # the executor's own errors too: a failed load, no crash
                    raise ModelLoadError(
                        f"model {model!r} warm-up sample {sample.name!r}: {e}"
                    ) from e
