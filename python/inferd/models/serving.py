"""What serves now and how a request finds its version: the installed versions of every model,
their states (the repository index), their traffic weights, what holds a loaded model back, and
the rules by which the models make the server ready.

``inferd.models.registry`` changes it (loads, reloads, unloads); the data plane, the transport
and the health service read it through the registry.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import choose_weighted_version
from inferd.errors import NotFound, Unavailable
from inferd.models.loaded import LoadedModel
from inferd.repository import readiness_required
from inferd.repository.version_weights import version_weights


class ModelState(enum.Enum):
    """A version's place in its lifecycle, with the protocol's RepositoryIndex names."""

    LOADING = "LOADING"  # being read and its executors created; not served yet
    READY = "READY"  # serving requests
    UNLOADING = "UNLOADING"  # admits nothing new; draining what it has queued
    UNAVAILABLE = "UNAVAILABLE"  # failed to load (reason says why) or unloaded


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: str  # "" when the failure came before any version was known
    state: ModelState
    reason: str = ""


@dataclass(frozen=True)
class ReadinessRules:
    """When the models make the server ready (ServerReady; health ``""`` and
    ``inference.GRPCInferenceService``), the server also accepting calls.

    ``strict`` (Triton's ``--strict-readiness``): every model that should serve and is required
    serves; a model whose config sets ``inferd.readiness`` to ``optional`` never holds it back.
    Otherwise the models' states do not matter. Either way a server with no model serving is not
    ready unless ``without_models``: a fleet replica with nothing to serve must get no traffic.
    """

    strict: bool = True
    without_models: bool = False


StatusKey = tuple[str, str]  # (model, version as the index writes it; "" for the model itself)


class ServedModels:
    """The installed versions of every model, by name, with their states, weights and
    readiness. Used from the event loop's thread, except ``published`` (any thread); changed
    only by the registry, which calls ``refresh`` after every change."""

    def __init__(self, readiness: ReadinessRules | None = None) -> None:
        self.readiness = readiness or ReadinessRules()
        self._models: dict[str, dict[int, LoadedModel]] = {}
        # Each served model's positive version weights (inferd.version_weights; none: no entry).
        self._weights: dict[str, dict[int, int]] = {}
        self._statuses: dict[StatusKey, ModelStatus] = {}
        # Loaded models that cannot serve, with why: an ensemble's composing model is not
        # served, or a python model's instance restarts its worker (the registry's faults).
        self._blocked: dict[str, str] = {}
        self._wanted: set[str] = set()  # models that should be serving (strict readiness)
        self._optional: set[str] = set()  # of those, the ones that never hold readiness back
        # What other threads (the metrics endpoint) may read: replaced whole, never mutated.
        self._published: tuple[LoadedModel, ...] = ()

    # Changes (the registry's).

    def install(self, name: str, built: dict[int, LoadedModel]) -> list[LoadedModel]:
        """Makes ``built`` the served versions of ``name``, each READY; returns the versions it
        replaced. Synchronous, so no request sees a half-installed model."""
        old = list(self._models.get(name, {}).values())
        self._models[name] = built
        # Every version shares the model's config; the builder has checked its weights.
        weights = version_weights(next(iter(built.values())).config, sorted(built)) if built else {}
        if weights:
            self._weights[name] = weights
        else:
            self._weights.pop(name, None)
        self.replace_statuses(
            name,
            {(name, str(v)): ModelStatus(name, str(v), ModelState.READY) for v in sorted(built)},
        )
        return old

    def remove(self, name: str) -> dict[int, LoadedModel]:
        """Takes ``name``'s versions out of service (their states stay); returns them."""
        self._weights.pop(name, None)
        return self._models.pop(name, {})

    def clear(self) -> None:
        """Takes every version out of service (their states stay)."""
        self._models.clear()
        self._weights.clear()

    def set_status(self, name: str, version: str, state: ModelState, reason: str = "") -> None:
        self._statuses[(name, version)] = ModelStatus(name, version, state, reason)

    def drop_status(self, name: str, version: str) -> None:
        self._statuses.pop((name, version), None)

    def statuses_of(self, name: str) -> dict[StatusKey, ModelStatus]:
        """A copy of ``name``'s states, which ``replace_statuses`` puts back."""
        return {k: s for k, s in self._statuses.items() if k[0] == name}

    def replace_statuses(self, name: str, statuses: dict[StatusKey, ModelStatus]) -> None:
        for key in [k for k in self._statuses if k[0] == name]:
            del self._statuses[key]
        self._statuses.update(statuses)

    def want(self, name: str, required: bool) -> None:
        """``name`` should be serving (strict readiness); ``required``: it holds readiness."""
        self._wanted.add(name)
        if required:
            self._optional.discard(name)
        else:
            self._optional.add(name)

    def unwant(self, name: str) -> None:
        self._wanted.discard(name)
        self._optional.discard(name)

    def wanted(self, name: str) -> bool:
        return name in self._wanted

    def refresh(self, faults: dict[tuple[str, int], str]) -> None:
        """Recomputes what holds each loaded model back (``faults``: (model, instance key) ->
        why that instance cannot serve; and an ensemble's composing model not served), and
        publishes the loaded versions to other threads."""
        self._blocked = {
            name: reason for (name, _), reason in faults.items() if name in self._models
        }
        for name, versions in self._models.items():
            missing = (
                [
                    (model, version)
                    for model, version in next(iter(versions.values())).composing
                    if not self._serves(model, version)
                ]
                if versions
                else []
            )
            if missing:
                model, version = missing[0]
                which = "its latest version" if version < 0 else f"version {version}"
                self._blocked[name] = f"composing model {model!r} ({which}) is not ready"
        self._published = tuple(self.loaded())

    def _serves(self, model: str, version: int) -> bool:
        """Whether a composing step's model version (-1: any) is loaded and not itself blocked."""
        versions = self._models.get(model)
        if not versions or model in self._blocked:
            return False
        return version < 0 or version in versions

    # What is loaded.

    def installed(self, name: str) -> bool:
        """Whether ``name`` has versions installed (ready or held back)."""
        return name in self._models

    def known(self, name: str) -> bool:
        """Whether ``name`` has versions installed or any state (loading, failed, unloaded)."""
        return name in self._models or any(k[0] == name for k in self._statuses)

    def composing_configs(self) -> dict[str, dict[int, ModelConfig]]:
        """The served versions' completed configs, which an ensemble is checked against."""
        return {
            name: {v: m.config for v, m in versions.items()}
            for name, versions in self._models.items()
            if versions
        }

    def published(self) -> tuple[LoadedModel, ...]:
        """The loaded versions, as last published; safe to call from any thread."""
        return self._published

    def loaded(self) -> list[LoadedModel]:
        return [m for versions in self._models.values() for m in versions.values()]

    def known_models(self) -> list[str]:
        """Every model with a state: loaded, loading, failed or unloaded."""
        return sorted({*self._models, *(name for name, _ in self._statuses)})

    def index(self, repository_models: list[str]) -> list[ModelStatus]:
        """Every model (of the repository's ``repository_models`` too) with its versions'
        states; one never loaded is UNAVAILABLE, "not loaded"."""
        known = {s.name for s in self._statuses.values()}
        never = [
            ModelStatus(name, "", ModelState.UNAVAILABLE, "not loaded")
            for name in repository_models
            if name not in known
        ]
        statuses = [
            ModelStatus(s.name, s.version, ModelState.UNAVAILABLE, self._blocked[s.name])
            if s.name in self._blocked and s.state is ModelState.READY
            else s
            for s in self._statuses.values()
        ]
        return sorted([*statuses, *never], key=lambda s: (s.name, s.version))

    # How a request finds its version.

    def get(self, name: str, version: str = "") -> LoadedModel:
        """The ready version asked for, or the highest ready one when ``version`` is empty."""
        versions = self._models.get(name)
        if not versions:
            failed = self._statuses.get((name, ""))
            if failed is not None or any(k[0] == name for k in self._statuses):
                raise Unavailable(f"model {name!r} is not ready: {self._reason(name)}")
            raise NotFound(f"unknown model {name!r}")
        if name in self._blocked:
            kind = "ensemble" if next(iter(versions.values())).composing else "model"
            raise Unavailable(f"{kind} {name!r} is not ready: {self._blocked[name]}")
        if not version:
            return versions[max(versions)]
        return self._numbered(name, versions, version)

    def route(self, name: str, version: str, routing_key: str | None) -> LoadedModel:
        """The version an inference runs on: the one it names; else, for a model with version
        weights, a weighted choice among its ready weighted versions (by ``routing_key``'s hash
        when given, at random otherwise: the transport's own choice); else the highest ready."""
        weights = self.ready_weights(name)
        if version or name not in self._weights:
            return self.get(name, version)
        if not weights:
            raise Unavailable(
                f"model {name!r} is not ready: none of its weighted versions is ready"
            )
        chosen = list(weights)[choose_weighted_version(list(weights.values()), routing_key)]
        return self._models[name][chosen]

    def ready_weights(self, name: str) -> dict[int, int]:
        """The weights of ``name``'s ready weighted versions, by ascending version (empty: the
        model has no weights, or none of its weighted versions is ready)."""
        ready = {} if name in self._blocked else self._models.get(name, {})
        return {v: w for v, w in sorted(self._weights.get(name, {}).items()) if v in ready}

    def weighted(self, name: str) -> bool:
        """Whether ``name``'s config gives its versions traffic weights."""
        return name in self._weights

    def _numbered(self, name: str, versions: dict[int, LoadedModel], version: str) -> LoadedModel:
        number = version_number(version)
        if number is None:
            raise NotFound(f"model {name!r} has no version {version!r}")
        if number in versions:
            return versions[number]
        status = self._statuses.get((name, version))
        if status is not None:
            raise Unavailable(f"model {name!r} version {version} is not ready: {status.reason}")
        raise NotFound(f"model {name!r} has no version {version!r}")

    def _reason(self, name: str) -> str:
        reasons = [s.reason for k, s in self._statuses.items() if k[0] == name and s.reason]
        return "; ".join(reasons) or "not loaded"

    # Readiness.

    def ready_versions(self, name: str) -> list[int]:
        return [] if name in self._blocked else sorted(self._models.get(name, {}))

    def ready_models(self) -> list[str]:
        """Names of the models with at least one ready version."""
        return [
            name
            for name, versions in self._models.items()
            if versions and name not in self._blocked
        ]

    def all_ready(self) -> bool:
        """True when every required model that should be serving is (strict readiness)."""
        return all(
            name in self._models and name not in self._blocked
            for name in self._wanted - self._optional
        )

    def server_ready(self) -> bool:
        """Whether the models make the server ready, by the readiness rules."""
        if self.readiness.strict and not self.all_ready():
            return False
        return self.readiness.without_models or bool(self.ready_models())


def required(built: dict[int, LoadedModel]) -> bool:
    """Whether a model just built holds readiness (every version shares the model's config)."""
    return readiness_required(next(iter(built.values())).config)


def version_number(text: str) -> int | None:
    """The version a request names, written as the server writes it (a canonical decimal: no
    sign, spaces, underscores, leading zeros or non-ASCII digits, all of which ``int`` takes);
    None otherwise, so that " 1" or "0_1" is no name of version 1."""
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    if len(text) > 19:  # more than any version folder (and int() refuses 4,300 digits and more)
        return None
    return int(text)
