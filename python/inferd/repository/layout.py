"""Where models and versions live.

``<root>/<model>/[config.pbtxt]`` and ``<root>/<model>/<N>/model.onnx``.

Names that reach the file system are checked here, so that no model name or version can point
outside the repository (Triton's CVE-2023-31036 was a path traversal through a model name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from inferd.errors import InvalidArgument, NotFound

_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_VERSION = re.compile(r"^[1-9][0-9]{0,18}$")  # Triton ignores folders that start with 0
CONFIG_FILE = "config.pbtxt"
DEFAULT_ONNX_FILE = "model.onnx"


def check_model_name(name: str) -> str:
    """The name, if it is a safe folder name; InvalidArgument otherwise."""
    if not _MODEL_NAME.match(name) or name in {".", ".."}:
        raise InvalidArgument(f"invalid model name {name!r}: use letters, digits, '_', '.' and '-'")
    return name


@dataclass(frozen=True)
class ModelRepository:
    """A folder of models in the Triton layout. Reads only; never writes."""

    root: Path

    def model_names(self) -> list[str]:
        """Folders under the root that are valid model names, sorted."""
        if not self.root.is_dir():
            raise NotFound(f"model repository {self.root} is not a directory")
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and _MODEL_NAME.match(p.name)
        )

    def model_dir(self, name: str) -> Path:
        """The model's folder, confined to the repository even through symbolic links."""
        path = (self.root / check_model_name(name)).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise InvalidArgument(f"model {name!r} resolves outside the model repository")
        if not path.is_dir():
            raise NotFound(f"model {name!r} is not in the model repository")
        return path

    def versions(self, name: str) -> list[int]:
        """The model's numeric version folders, ascending."""
        model_dir = self.model_dir(name)
        return sorted(
            int(p.name) for p in model_dir.iterdir() if p.is_dir() and _VERSION.match(p.name)
        )

    def config_path(self, name: str) -> Path | None:
        path = self.model_dir(name) / CONFIG_FILE
        return path if path.is_file() else None

    def model_file(self, name: str, version: int, filename: str = "") -> Path:
        """The version's model file (``model.onnx`` unless the config names another)."""
        model_dir = self.model_dir(name)
        filename = filename or DEFAULT_ONNX_FILE
        if "/" in filename or filename in {"", ".", ".."}:
            raise InvalidArgument(f"model {name!r}: invalid default_model_filename {filename!r}")
        path = (model_dir / str(version) / filename).resolve()
        if not path.is_relative_to(model_dir):
            raise InvalidArgument(
                f"model {name!r} version {version}: file resolves outside the model"
            )
        if not path.is_file():
            raise NotFound(f"model {name!r} version {version} has no {filename}")
        return path
