"""Weighted version routing (inferd's, beyond Triton): the config parameter that shares the
inferences naming no version among a model's served versions, for canaries and A/B tests.

``parameters { key: "inferd.version_weights" value: { string_value: "3:90,4:10" } }`` gives
version 3 weight 90 and version 4 weight 10: comma-separated ``VERSION:WEIGHT`` pairs, each
version a served one, each weight an integer from 0 to 1,000,000, at least one weight positive. A
version with weight 0, or none, gets none of the traffic that names no version."""

from __future__ import annotations

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.errors import ModelLoadError

VERSION_WEIGHTS = "inferd.version_weights"
# The largest weight: their sum must stay far inside the core's 64-bit arithmetic, and no split of
# traffic needs a finer grain than a millionth.
MAX_WEIGHT = 1_000_000


def version_weights(config: ModelConfig, served: list[int]) -> dict[int, int]:
    """The config's positive version weights by version (empty: none given). Raises
    ModelLoadError, naming the key, for a malformed entry, a negative weight, all weights zero, a
    version given twice or one the version policy does not serve (``served``)."""
    if VERSION_WEIGHTS not in config.parameters:
        return {}
    text = config.parameters[VERSION_WEIGHTS].string_value
    where = f"model {config.name!r}: parameter {VERSION_WEIGHTS} {text!r}"
    weights: dict[int, int] = {}
    for entry in text.split(","):
        version_text, colon, weight_text = entry.strip().partition(":")
        try:
            if not colon:
                raise ValueError
            version, weight = int(version_text.strip()), int(weight_text.strip())
        except ValueError:
            raise ModelLoadError(
                f"{where}: {entry.strip()!r} is not VERSION:WEIGHT (integers)"
            ) from None
        if weight < 0:
            raise ModelLoadError(f"{where}: version {version} has a negative weight")
        if weight > MAX_WEIGHT:
            raise ModelLoadError(
                f"{where}: version {version}'s weight is above the largest, {MAX_WEIGHT}"
            )
        if version in weights:
            raise ModelLoadError(f"{where}: version {version} is given twice")
        if version not in served:
            raise ModelLoadError(
                f"{where}: version {version} is not served (the version policy serves {served})"
            )
        weights[version] = weight
    if not any(weights.values()):
        raise ModelLoadError(f"{where}: every weight is zero")
    return {v: w for v, w in weights.items() if w > 0}
