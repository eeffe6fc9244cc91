"""Where models and versions live.

``<root>/<model>/[config.pbtxt]`` and ``<root>/<model>/<N>/model.onnx``.

Names that reach the file system are checked here, so that no model name or version can point
outside the repository (Triton's CVE-2023-31036 was a path traversal through a model name).

Messages to clients name a model's files relative to the model's folder (``1/model.onnx``) and
never by the server's absolute path, which only the server log shows: ``shown_file``,
``model_file_label`` and ``without_model_dir`` write them so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import structlog

from inferd.errors import InvalidArgument, ModelLoadError, NotFound

log = structlog.get_logger(__name__)

_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_VERSION = re.compile(r"^[1-9][0-9]{0,18}$")  # Triton ignores folders that start with 0
CONFIG_FILE = "config.pbtxt"
DEFAULT_ONNX_FILE = "model.onnx"


def check_model_name(name: str) -> str:
    """The name, if it is a safe folder name; InvalidArgument otherwise."""
    if not _MODEL_NAME.match(name) or name in {".", ".."}:
        raise InvalidArgument(f"invalid model name {name!r}: use letters, digits, '_', '.' and '-'")
    return name


def shown_file(path: Path) -> str:
    """A version's file as messages to clients name it: relative to the model's folder
    (``1/model.onnx``)."""
    return f"{path.parent.name}/{path.name}"


def model_file_label(model: str, path: Path) -> str:
    """How messages to clients name ``path``, a file in a version folder of ``model``: the model,
    the version and the file's name (``model 'mlp' version 1 (model.onnx)``)."""
    version = path.parent.name
    if _VERSION.match(version):
        return f"model {model!r} version {version} ({path.name})"
    return f"model {model!r} ({shown_file(path)})"


def without_model_dir(message: str, path: Path) -> str:
    """``message`` (a library's, which names files by the path it was given) with ``path``, a
    file in a version folder, and any other file of its model named relative to the model's
    folder instead of by their absolute paths."""
    message = message.replace(str(path), shown_file(path))
    return message.replace(str(path.parent.parent) + os.sep, "")


def _resolved(path: Path, what: str) -> Path:
    """``path`` with its links resolved; a loop is the load's failure, named without the path."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symbolic link loop (Python < 3.13)
        log.warning("cannot resolve a repository path", path=str(path), error=str(e))
        raise ModelLoadError(f"{what}: its path cannot be resolved (a symbolic link loop?)") from e


@dataclass(frozen=True)
class ModelRepository:
    """A folder of models in the Triton layout. Reads only; never writes."""

    root: Path

    def model_names(self) -> list[str]:
        """Folders under the root that are valid model names, sorted. The repository's path is
        logged, not told: clients may ask for the index."""
        try:
            entries = [p for p in self.root.iterdir() if p.is_dir()]
        except OSError as e:
            log.error("cannot read the model repository", path=str(self.root), error=str(e))
            raise NotFound(
                "the model repository is not a readable directory (the server log names it)"
            ) from e
        return sorted(p.name for p in entries if _MODEL_NAME.match(p.name))

    def model_dir(self, name: str) -> Path:
        """The model's folder, confined to the repository even through symbolic links."""
        path = _resolved(self.root / check_model_name(name), f"model {name!r}")
        if not path.is_relative_to(self.root.resolve()):
            raise InvalidArgument(f"model {name!r} resolves outside the model repository")
        if not path.is_dir():
            raise NotFound(f"model {name!r} is not in the model repository")
        return path

    def versions(self, name: str) -> list[int]:
        """The model's numeric version folders, ascending."""
        model_dir = self.model_dir(name)
        try:
            entries = list(model_dir.iterdir())
        except OSError as e:
            log.warning("cannot list a model's folder", path=str(model_dir), error=str(e))
            raise ModelLoadError(
                f"model {name!r}: its folder cannot be read ({e.strerror or type(e).__name__})"
            ) from e
        return sorted(int(p.name) for p in entries if p.is_dir() and _VERSION.match(p.name))

    def config_path(self, name: str) -> Path | None:
        """The model's config.pbtxt, if it has one, confined to the model's folder like its
        other files (a link out of it is refused, not read)."""
        model_dir = self.model_dir(name)
        path = model_dir / CONFIG_FILE
        if not path.is_file() and not path.is_symlink():
            return None
        resolved = _resolved(path, f"model {name!r} {CONFIG_FILE}")
        if not resolved.is_relative_to(model_dir):
            raise InvalidArgument(f"model {name!r}: {CONFIG_FILE} resolves outside the model")
        return path if resolved.is_file() else None

    def model_file(self, name: str, version: int, filename: str = "") -> Path:
        """The version's model file (``model.onnx`` unless the config names another)."""
        model_dir = self.model_dir(name)
        filename = filename or DEFAULT_ONNX_FILE
        if "/" in filename or filename in {"", ".", ".."}:
            raise InvalidArgument(f"model {name!r}: invalid default_model_filename {filename!r}")
        where = f"model {name!r} version {version}"
        path = _resolved(model_dir / str(version) / filename, where)
        if not path.is_relative_to(model_dir):
            raise InvalidArgument(f"{where}: file resolves outside the model")
        if not path.is_file():
            raise NotFound(f"{where} has no {filename}")
        return path
