"""What ``inferd tune`` sends: requests built from the model's inputs, with generated or given
sample values, serialized once as ModelInferRequests for the load generator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferd._proto.grpc_service_pb2 import ModelInferRequest
from inferd._proto.model_config_pb2 import ModelConfig
from inferd.datatypes import BY_CONFIG_TYPE
from inferd.errors import InvalidArgument

SAMPLES = 64  # distinct requests the generated workload cycles through


@dataclass(frozen=True)
class Workload:
    """One request per sample: every input's values (without the batch dim), by input name."""

    samples: tuple[Mapping[str, np.ndarray], ...]
    batched: bool  # the model batches: each request carries a batch dim of 1

    def requests(self, model: str, config: ModelConfig) -> list[bytes]:
        """The samples as serialized ModelInferRequests to ``model``, inputs raw."""
        out = []
        for sample in self.samples:
            request = ModelInferRequest(model_name=model)
            for spec in config.input:
                values = sample[spec.name]
                shape = [1, *values.shape] if self.batched else list(values.shape)
                datatype = BY_CONFIG_TYPE[spec.data_type]
                request.inputs.add(name=spec.name, datatype=datatype.name, shape=shape)
                request.raw_input_contents.append(_raw(values, datatype.is_bytes))
            out.append(request.SerializeToString())
        return out

    def batch(self) -> dict[str, np.ndarray]:
        """Every sample stacked: the inputs of one in-process run, for precision checks."""
        names = self.samples[0].keys()
        return {name: np.stack([s[name] for s in self.samples]) for name in names}


def _raw(values: np.ndarray, is_bytes: bool) -> bytes:
    if not is_bytes:
        return np.ascontiguousarray(values).tobytes()
    out = bytearray()
    for item in values.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        out += len(data).to_bytes(4, "little") + data
    return bytes(out)


def workload(
    config: ModelConfig, shapes: Mapping[str, list[int]], samples_file: Path | None, seed: int = 30
) -> Workload:
    """Sample requests for ``config`` (a completed config): from ``samples_file`` (an .npz whose
    arrays, by input name, hold one sample per row), or generated (values of each input's type,
    a dim of -1 taken from ``shapes`` or 1)."""
    batched = config.max_batch_size > 0
    if samples_file is not None:
        with np.load(samples_file, allow_pickle=False) as data:
            arrays = {spec.name: data[spec.name] for spec in config.input if spec.name in data}
        missing = [spec.name for spec in config.input if spec.name not in arrays]
        if missing:
            raise InvalidArgument(f"{samples_file}: no samples for input {missing[0]!r}")
        count = min(len(a) for a in arrays.values())
        rows = tuple({name: a[i] for name, a in arrays.items()} for i in range(count))
        return Workload(rows, batched)
    rng = np.random.default_rng(seed)
    generated: list[dict[str, np.ndarray]] = [{} for _ in range(SAMPLES)]
    for spec in config.input:
        dims = shapes.get(spec.name) or [1 if d < 0 else int(d) for d in spec.dims]
        datatype = BY_CONFIG_TYPE[spec.data_type]
        for sample in generated:
            sample[spec.name] = _values(rng, datatype.numpy, dims, datatype.is_bytes)
    return Workload(tuple(generated), batched)


def _values(
    rng: np.random.Generator, dtype: np.dtype[np.generic], dims: list[int], is_bytes: bool
) -> np.ndarray:
    if is_bytes:
        return np.array(
            [b"sample %d" % rng.integers(1000) for _ in range(int(np.prod(dims)))], dtype=object
        ).reshape(dims)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(dims).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, dims).astype(dtype)
    return rng.integers(0, 100, dims).astype(dtype)
