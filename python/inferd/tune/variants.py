"""Lower-precision variants of an ONNX model for ``inferd tune``: FP16 (weights and compute, the
inputs and outputs kept FP32 so that clients and the config stay as they are) and INT8 (ONNX
Runtime's dynamic quantization). A variant is kept only if its outputs on the workload's samples
stay within the tolerance of the FP32 model's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

PRECISIONS = ("fp16", "int8")


@dataclass(frozen=True)
class Variant:
    precision: str
    model_file: Path | None  # None: refused
    max_error: float  # the largest absolute difference from FP32's outputs on the samples
    reason: str = ""  # why it was refused


def make_variant(model_file: Path, precision: str, out_dir: Path) -> Path:
    """Writes the ``precision`` variant of ``model_file`` into ``out_dir``; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / model_file.name
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(model_file, target, weight_type=QuantType.QInt8)
    elif precision == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(model_file), keep_io_types=True)
        onnx.save(model, target)
    else:
        raise ValueError(f"unknown precision {precision!r} (one of {', '.join(PRECISIONS)})")
    return target


def _outputs(model_file: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(model_file), options, providers=["CPUExecutionProvider"]
    )
    return [np.asarray(o) for o in session.run(None, inputs)]


def checked_variant(
    model_file: Path,
    precision: str,
    out_dir: Path,
    samples: dict[str, np.ndarray],
    tolerance: float,
) -> Variant:
    """The variant, if its outputs on ``samples`` are within ``tolerance`` (absolute) of FP32's."""
    try:
        target = make_variant(model_file, precision, out_dir)
        reference = _outputs(model_file, samples)
        candidate = _outputs(target, samples)
    except Exception as e:  # a model the converter or the runtime cannot take: not a variant
        return Variant(precision, None, float("inf"), f"{type(e).__name__}: {e}")
    error = max(
        (float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0)
        for a, b in zip(reference, candidate, strict=True)
    )
    if not error <= tolerance:
        return Variant(
            precision, None, error, f"outputs differ from FP32's by {error:.3g} > {tolerance:g}"
        )
    return Variant(precision, target, error)
