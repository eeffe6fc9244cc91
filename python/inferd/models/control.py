"""Model control modes, as Triton's ``--model-control-mode``: which models load at start, and
whether RepositoryModelLoad / RepositoryModelUnload may change that while serving.

- ``none`` (default): every model of the repository loads at start; the control RPCs are refused.
- ``explicit``: only ``--load-model`` names (``*`` = all) load at start; then the RPCs decide.
"""

from __future__ import annotations

import enum
from typing import Any

from inferd.errors import FailedPrecondition, InvalidArgument
from inferd.models.registry import ModelRegistry
from inferd.repository import parse_config_json

# Load-request parameters inferd understands (Triton's names).
CONFIG_OVERRIDE = "config"  # a ModelConfig as JSON, used instead of config.pbtxt


class ControlMode(enum.Enum):
    NONE = "none"
    EXPLICIT = "explicit"


class ModelControl:
    """Applies the control mode to the registry. Used from the event loop's thread."""

    def __init__(self, registry: ModelRegistry, mode: ControlMode) -> None:
        self.registry = registry
        self.mode = mode

    def startup_models(self, load_model: list[str]) -> list[str] | None:
        """The models to load before serving (None = every model of the repository)."""
        if self.mode is ControlMode.NONE or "*" in load_model:
            return None
        return load_model

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        self._allowed("load")
        override = None
        for key, value in parameters.items():
            if key == CONFIG_OVERRIDE:
                if not isinstance(value, str):
                    raise InvalidArgument(f"load parameter {key!r} must be a JSON string")
                override = parse_config_json(value, f"load request for {name!r}")
            else:
                # Triton's "file:<path>" parameters would write into the repository: refused.
                raise InvalidArgument(f"load parameter {key!r} is not supported")
        await self.registry.load(name, override)

    async def unload(self, name: str) -> None:
        self._allowed("unload")
        await self.registry.unload(name)

    def _allowed(self, what: str) -> None:
        if self.mode is not ControlMode.EXPLICIT:
            raise FailedPrecondition(
                f"model {what} is not allowed in --model-control-mode {self.mode.value} "
                "(use explicit)"
            )
