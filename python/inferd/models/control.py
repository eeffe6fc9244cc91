"""Model control modes, as Triton's ``--model-control-mode``: which models load at start, and
whether RepositoryModelLoad / RepositoryModelUnload may change that while serving.

- ``none`` (default): every model of the repository loads at start; the control RPCs are refused.
- ``explicit``: only ``--load-model`` names (``*`` = all) load at start; then the RPCs decide.
- ``poll``: every model loads at start; every ``--repository-poll-secs`` the repository is scanned
  and what appeared is loaded, what changed (any file's size or time) reloaded, what went away
  unloaded. As in Triton, a model still being copied may fail a load; it is retried once its files
  change again. The control RPCs are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
from typing import Any

import structlog

from inferd.errors import FailedPrecondition, InferdError, InvalidArgument
from inferd.models.registry import ModelRegistry, ModelStatus
from inferd.repository import ModelRepository, parse_config_json

log = structlog.get_logger(__name__)

# Load-request parameters inferd understands (Triton's names).
CONFIG_OVERRIDE = "config"  # a ModelConfig as JSON, used instead of config.pbtxt


class ControlMode(enum.Enum):
    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"


Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(repository: ModelRepository, name: str) -> Fingerprint:
    """(path, size, mtime) of every file of the model: changes when any file does."""
    root = repository.model_dir(name)
    entries: list[tuple[str, int, int]] = []
    for folder, _, files in os.walk(root):
        for file in files:
            path = os.path.join(folder, file)
            try:
                stat = os.stat(path)
            except OSError:
                continue  # removed while we looked: the next scan sees the rest
            entries.append((os.path.relpath(path, root), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


class ModelControl:
    """Applies the control mode to the registry. Used from the event loop's thread."""

    def __init__(
        self,
        registry: ModelRegistry,
        repository: ModelRepository,
        mode: ControlMode,
        *,
        max_config_override_bytes: int | None = None,
    ) -> None:
        self._max_override_bytes = max_config_override_bytes
        self.registry = registry
        self.repository = repository
        self.mode = mode
        self._seen: dict[str, Fingerprint] = {}  # poll mode: what each model looked like

    def remember_repository(self) -> None:
        """Poll mode: records the repository as loaded at start (blocking; before serving)."""
        self._seen = {n: fingerprint(self.repository, n) for n in self.repository.model_names()}

    async def poll_forever(self, interval_s: float) -> None:
        """Poll mode: rescans the repository every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.poll_once()
            except Exception:
                log.exception("repository poll failed")

    async def poll_once(self) -> None:
        loop = asyncio.get_running_loop()
        names = await loop.run_in_executor(None, self.repository.model_names)
        for name in names:
            try:
                now = await loop.run_in_executor(None, fingerprint, self.repository, name)
            except InferdError:
                continue  # vanished or unsafe (a link out of the repository): not ours to load
            if self._seen.get(name) == now:
                continue
            self._seen[name] = now
            # A failure is logged by the registry; it is retried when the files change again.
            with contextlib.suppress(InferdError):
                await self.registry.load(name)
        for name in sorted(set(self._seen) - set(names)):
            del self._seen[name]
            with contextlib.suppress(InferdError):
                await self.registry.unload(name)

    def startup_models(self, load_model: list[str]) -> list[str] | None:
        """The models to load before serving (None = every model of the repository)."""
        if self.mode is not ControlMode.EXPLICIT or "*" in load_model:
            return None
        return load_model

    def index(self) -> list[ModelStatus]:
        """Every model of the repository with its versions' states."""
        return self.registry.index()

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        self._allowed("load")
        override = None
        for key, value in parameters.items():
            if key == CONFIG_OVERRIDE:
                if not isinstance(value, str):
                    raise InvalidArgument(f"load parameter {key!r} must be a JSON string")
                limit = self._max_override_bytes
                # Characters first: never fewer than the bytes, and no copy of a huge value.
                if limit is not None and (len(value) > limit or len(value.encode()) > limit):
                    raise InvalidArgument(
                        f"load parameter {key!r} has more than the server's limit of {limit} "
                        "bytes (--max-config-override-bytes)"
                    )
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
