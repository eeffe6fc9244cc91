"""``inferd tune`` end to end on the example mlp (issue 30): a child inferd per config, driven by
the C++ load generator, within its budget; the best config it writes loads; an INT8 variant outside
the tolerance is refused and never measured; at --url each config is loaded on that server. And
the load generator itself against a live server: answers counted, errors counted with the
server's message."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inferd._proto.grpc_service_pb2 import ModelInferRequest
from inferd.core.load_generator import LoadResult, generate_load
from inferd.examples import MLP_SIZES, make_examples
from inferd.repository import load_model_config
from inferd.tune.variants import checked_variant
from tests.integration.conftest import ServerProcess, running_server

BUDGET_MINUTES = 1.0


@pytest.fixture(scope="module")
def mlp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tune_models")
    make_examples(root)
    return root / "mlp"


def test_tune_finds_a_config_within_its_budget_and_writes_what_it_measured(
    mlp_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable, "-m", "inferd", "tune", str(mlp_dir), "--p99-ms", "50",
            "--cost-per-hour", "0.5", "--concurrency", "1", "8", "--window-s", "0.6",
            "--budget-minutes", str(BUDGET_MINUTES), "--precision", "int8",
            "--tolerance", "1e-9", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    # Within the budget, plus what no measurement can shorten (checking the variant, writing).
    assert elapsed < BUDGET_MINUTES * 60 + 45, elapsed
    report = json.loads((out / "tune.json").read_text())
    trials = report["trials"]
    assert trials[0]["stage"] == "stated config"
    assert len(trials) >= 3
    for trial in trials:
        measurement = trial["measurement"]
        assert not measurement["failure"], measurement["failure"]
        assert [p["load"]["concurrency"] for p in measurement["points"]] == [1, 8]
        assert all(p["requests"] > 0 and p["errors"] == 0 for p in measurement["points"])
        assert measurement["cold_start_s"] > 0
        assert measurement["cpu_us_per_inference"] > 0
        assert measurement["memory_mib"] > 0
    # The INT8 variant's outputs differ from FP32's by far more than 1e-9: refused, not tried.
    assert [v["precision"] for v in report["refused_variants"]] == ["int8"]
    assert all(t["candidate"]["precision"] == "fp32" for t in trials)
    assert "int8 refused: outputs differ from FP32's" in (out / "tune.md").read_text()
    table = (out / "tune.md").read_text()
    assert table.count("\n| ") >= len(trials)  # one row per config tried, plus the header
    assert (out / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = out / "config.pbtxt"
    assert written.read_text().startswith("# Written by inferd tune:")
    # The best config loads as a model's config (the repository's own checks).
    model = mlp_dir / "1" / "model.onnx"
    config = load_model_config("mlp", written, model, default_max_batch_size=4)
    assert config.max_batch_size > 0


def test_tune_at_a_url_loads_each_config_there_and_says_why_a_variant_is_not_measured(
    mlp_dir: Path, tmp_path: Path
) -> None:
    # The server at --url loads mlp from its own repository, config by config (a load with a
    # config override); an INT8 variant within a loose tolerance is a file on this machine, which
    # that server cannot be handed: the report says so instead of dropping it.
    with running_server(mlp_dir.parent, [], tmp_path, "--model-control-mode", "explicit") as server:
        out = tmp_path / "out"
        done = subprocess.run(
            [
                sys.executable, "-m", "inferd", "tune", str(mlp_dir), "--url", server.url,
                "--p99-ms", "50", "--concurrency", "4", "--window-s", "0.5",
                "--budget-minutes", "0.25", "--precision", "int8", "--tolerance", "1.0",
                "--out", str(out),
            ],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "tune.json").read_text())
    trials = report["trials"]
    assert trials and trials[0]["stage"] == "stated config"
    for trial in trials:
        measurement = trial["measurement"]
        assert not measurement["failure"], measurement["failure"]
        assert all(p["requests"] > 0 and p["errors"] == 0 for p in measurement["points"])
    assert all(t["candidate"]["precision"] == "fp32" for t in trials)
    assert [v["precision"] for v in report["refused_variants"]] == ["int8"]
    assert "not measured: the server at --url" in (out / "tune.md").read_text()


def test_a_variant_within_the_tolerance_is_kept(mlp_dir: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    samples = {"INPUT0": rng.standard_normal((8, MLP_SIZES[0])).astype(np.float32)}
    model = mlp_dir / "1" / "model.onnx"
    kept = checked_variant(model, "int8", tmp_path / "int8", samples, tolerance=1.0)
    assert kept.model_file is not None and kept.model_file.is_file()
    assert 0 < kept.max_error <= 1.0
    refused = checked_variant(model, "int8", tmp_path / "int8b", samples, tolerance=1e-9)
    assert refused.model_file is None and "differ from FP32's" in refused.reason


def _requests(model: str) -> list[bytes]:
    request = ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.extend([np.arange(16, dtype=np.int32).tobytes()] * 2)
    return [request.SerializeToString()]


@pytest.mark.parametrize("rate", [0.0, 200.0])
def test_the_load_generator_counts_answers_and_errors(server: ServerProcess, rate: float) -> None:
    def run(model: str) -> LoadResult:
        return generate_load(
            server.url, _requests(model), concurrency=4, rate=rate, warmup_s=0.2, measure_s=1.0
        )

    result = run("simple")
    assert result.errors == 0, result.first_error
    assert len(result.latencies_ns) > (100 if rate else 10)
    assert all(0 < latency < 5e9 for latency in result.latencies_ns)
    failed = run("no_such_model")
    assert not failed.latencies_ns
    assert failed.errors > 0
    assert "no_such_model" in failed.first_error
