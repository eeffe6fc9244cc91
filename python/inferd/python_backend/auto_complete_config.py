"""``pb_utils.ModelConfig``: the argument of a python model's ``auto_complete_config``, the
model's configuration in Triton's JSON field names, which the model completes and the worker
reads back (``as_dict()``). Model code reaches it as ``triton_python_backend_utils.ModelConfig``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


def tensor_config(model_config: dict[str, Any], field: str, name: str) -> dict[str, Any] | None:
    """The config's ``field`` (input or output) entry named ``name``, or None."""
    tensors: list[dict[str, Any]] = model_config.get(field, [])
    return next((t for t in tensors if t.get("name") == name), None)


class ModelConfig:
    """The model's configuration (Triton's config JSON field names) for auto_complete_config.

    ``as_dict()`` is what the worker reads back after ``auto_complete_config`` returns. The
    setters refuse, with ValueError as Triton documents, a value that contradicts what the
    configuration already states.
    """

    _INPUT_PROPERTIES: ClassVar[frozenset[str]] = frozenset(
        {"name", "data_type", "dims", "optional"}
    )
    _OUTPUT_PROPERTIES: ClassVar[frozenset[str]] = frozenset({"name", "data_type", "dims"})

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        text = model_config if isinstance(model_config, str) else json.dumps(model_config)
        self._config: dict[str, Any] = json.loads(text)  # a copy the setters may change
        self._config.setdefault("name", "")
        self._config.setdefault("max_batch_size", 0)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _model(self) -> str:
        return f"model '{self._config['name']}'"

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config["max_batch_size"])
        if configured > max_batch_size:
            raise ValueError(
                f"{self._model()}: the configuration specifies max_batch_size {configured}, "
                f"auto_complete_config sets {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._config:
                raise ValueError(
                    f"{self._model()}: the configuration's scheduler is {scheduler}, "
                    "auto_complete_config sets dynamic_batching"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # `input`: Triton's parameter name
        self._add_tensor("input", input, self._INPUT_PROPERTIES)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, self._OUTPUT_PROPERTIES)

    def _add_tensor(self, field: str, tensor: dict[str, Any], allowed: frozenset[str]) -> None:
        label = f"{field} '{tensor.get('name', '')}' of {self._model()}"
        extra = sorted(set(tensor) - allowed)
        if extra:
            raise ValueError(
                f"{label} has properties {extra}: auto_complete_config accepts only "
                f"{sorted(allowed)}"
            )
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{label} is missing '{required}'")
        existing = tensor_config(self._config, field, tensor["name"])
        if existing is None:
            self._config[field].append(dict(tensor))
            return
        configured_type = existing.get("data_type", "TYPE_INVALID")
        if configured_type != "TYPE_INVALID" and configured_type != tensor["data_type"]:
            raise ValueError(
                f"{label}: the configuration specifies data_type {configured_type}, "
                f"auto_complete_config sets {tensor['data_type']}"
            )
        configured_dims = existing.get("dims", [])
        if configured_dims and list(configured_dims) != list(tensor["dims"]):
            raise ValueError(
                f"{label}: the configuration specifies dims {list(configured_dims)}, "
                f"auto_complete_config sets {list(tensor['dims'])}"
            )
        if (
            "optional" in existing
            and "optional" in tensor
            and existing["optional"] != tensor["optional"]
        ):
            raise ValueError(
                f"{label}: the configuration specifies optional {existing['optional']}, "
                f"auto_complete_config sets {tensor['optional']}"
            )
        existing.update(tensor)

    def set_model_transaction_policy(self, transaction_policy: dict[str, Any]) -> None:
        extra = sorted(set(transaction_policy) - {"decoupled"})
        if extra:
            raise ValueError(
                f"{self._model()}: model_transaction_policy has properties {extra}: "
                "auto_complete_config accepts only 'decoupled'"
            )
        policy: dict[str, Any] = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy:
            return
        decoupled = transaction_policy["decoupled"]
        if "decoupled" in policy and policy["decoupled"] != decoupled:
            raise ValueError(
                f"{self._model()}: the configuration specifies decoupled {policy['decoupled']}, "
                f"auto_complete_config sets {decoupled}"
            )
        policy["decoupled"] = decoupled
