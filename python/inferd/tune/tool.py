"""``inferd tune``'s run: the model and its workload, the precision variants the user allows, a
measurement per candidate, the search, and what it writes."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.repository import ModelRepository, load_model_config, model_filename, stated_config
from inferd.tune import report
from inferd.tune.candidates import Candidate, stated_candidate
from inferd.tune.measure import (
    LoadPoint,
    Measurement,
    measure_child,
    measure_remote,
    write_repository,
)
from inferd.tune.search import Objective, TuneResult, search
from inferd.tune.variants import Variant, checked_variant
from inferd.tune.workload import workload


def tune(
    model_dir: Path,
    objective: Objective,
    loads: list[LoadPoint],
    out: Path,
    *,
    budget_s: float = 600.0,
    window_s: float = 2.0,
    precisions: tuple[str, ...] = (),
    tolerance: float = 1e-2,
    shapes: Mapping[str, list[int]] | None = None,
    samples_file: Path | None = None,
    url: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> TuneResult:
    """Searches ``model_dir``'s config (measured on a child inferd, or on the server at ``url``,
    which must serve the model in explicit control mode) and writes tune.md, tune.json, tune.png
    and config.pbtxt into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    name, model_file = stated_model(model_dir)
    stated, completed = stated_and_completed(model_dir, model_file)
    load = workload(completed, shapes or {}, samples_file)
    requests = load.requests(name, completed)
    variants: list[Variant] = []
    files: dict[str, Path] = {"fp32": model_file}
    for precision in precisions:
        progress(f"checking the {precision} variant against FP32's outputs")
        variant = checked_variant(
            model_file, precision, out / "variants" / precision, load.batch(), tolerance
        )
        variants.append(variant)
        if variant.model_file is not None:
            files[precision] = variant.model_file
    if url is not None:
        variants = [_unreachable(v) if v.model_file is not None else v for v in variants]

    def measure(candidate: Candidate, index: int) -> Measurement:
        config = candidate.config(stated)
        if url is not None:
            return measure_remote(url, name, config, requests, loads, window_s)
        repository = write_repository(
            out / "candidates" / f"{index:02d}", name, config, files[candidate.precision]
        )
        return measure_child(repository, name, requests, loads, window_s, repository / "server.log")

    estimate_s = 4.0 + len(loads) * (window_s + min(1.0, window_s / 2) + 0.2)
    result = search(
        stated_candidate(stated, completed),
        objective,
        loads,
        measure,
        budget_s,
        estimate_s,
        variants,
        progress,
    )
    command = (
        shlex.join(["inferd", "tune", *sys.argv[2:]])
        if sys.argv[1:2] == ["tune"]
        else "inferd tune"
    )
    (out / "tune.md").write_text(report.summary(result, command) + "\n" + report.table(result))
    report.write_json(result, out / "tune.json")
    why_no_plot = report.plot(result, out / "tune.png")
    if why_no_plot:
        progress(why_no_plot)
    (out / "config.pbtxt").write_text(report.best_config(result, stated, command))
    return result


def _unreachable(variant: Variant) -> Variant:
    """An accepted variant that a server at --url cannot load: it reads model files from its own
    repository only (a load's "file:" parameters are refused), so the report says why it is not
    measured."""
    return Variant(
        variant.precision,
        None,
        variant.max_error,
        f"within tolerance (outputs differ from FP32's by at most {variant.max_error:.3g}), but "
        "not measured: the server at --url loads model files from its own repository only",
    )


def stated_model(model_dir: Path) -> tuple[str, Path]:
    """A model folder's name and its newest version's model file."""
    repository = ModelRepository(model_dir.parent)
    name = model_dir.name
    versions = repository.versions(name)
    if not versions:
        raise FileNotFoundError(f"{model_dir}: no numeric version folder")
    config_path = repository.config_path(name)
    stated = stated_config(config_path, None, name=name)
    return name, repository.model_file(name, versions[-1], model_filename(stated))


def stated_and_completed(model_dir: Path, model_file: Path) -> tuple[ModelConfig, ModelConfig]:
    """The model's config as written (the starting point tune changes) and as the server completes
    it (its inputs, and the batching it serves with)."""
    repository = ModelRepository(model_dir.parent)
    config_path = repository.config_path(model_dir.name)
    stated = stated_config(config_path, None, name=model_dir.name)
    stated.name = model_dir.name
    completed = load_model_config(model_dir.name, config_path, model_file, default_max_batch_size=4)
    return stated, completed
