"""One python-backend model.py served by inferd and by Triton 2.51, side by side (issue 28):
infer/s, p50, p99 and server CPU per inference at several concurrencies, against the issue's
targets.

    python benchmarks/python_vs_triton.py --triton-venv /tmp/pytriton-venv     # c = 1 16 64, x2
    python benchmarks/python_vs_triton.py --concurrencies 1 --rounds 1 --measurement-interval 1000

The model (``affine``, ``--model-kind affine``, the default): FP32 INPUT0 [batch, 16] -> OUTPUT0 =
INPUT0 * 2 + 1, ``backend: "python"``, ``max_batch_size`` ``--max-batch-size`` (64),
``dynamic_batching { }``, one KIND_CPU instance; its model.py (AFFINE_MODEL_PY below) is written
from Triton's python-backend API: per request ``pb_utils.get_input_tensor_by_name(request,
"INPUT0").as_numpy()``, ``x * 2 + 1`` (float32) and one ``InferenceResponse`` with
``pb_utils.Tensor("OUTPUT0", ...)``. One repository (a temporary folder, config.pbtxt complete as
Triton wants it) is served, unchanged, by both servers. ``--model-kind bls``: the measured
``affine`` is a BLS model instead (BLS_MODEL_PY): each request's INPUT0 goes on to
``affine_step`` (AFFINE_MODEL_PY, configured alike) through
``pb_utils.InferenceRequest(...).exec()``, and its OUTPUT0 is the answer. Decoupled models are
benchmarks/decoupled_vs_triton.py's.

What Triton needs (Triton 2.51.0 as the ``nvidia-pytriton==0.7.0`` wheel bundles it; the script
reads nothing from the wheel but these files):

    python3 -m venv /tmp/pytriton-venv
    /tmp/pytriton-venv/bin/pip install --no-deps nvidia-pytriton==0.7.0
    apt-get install -y python3-numpy     # when /usr/lib/python3/dist-packages/numpy is missing

- ``--tritonserver`` (default ``SITE/pytriton/tritonserver/bin/tritonserver``, SITE = the
  ``--triton-venv``'s ``lib/python3.*/site-packages``);
- ``--backend-directory`` (default ``SITE/pytriton/tritonserver/backends``). The wheel ships
  ``python/libtriton_python.so`` without its stub: pytriton itself copies the folder into a
  workspace and adds ``python_backend_stubs/X.Y/triton_python_backend_stub`` for its Python. So
  does this script, when ``python/triton_python_backend_stub`` is missing from the folder given:
  it copies the folder into its temporary directory and adds ``--stub`` (default
  ``SITE/pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub``;
  ``--stub-python`` picks another X.Y);
- ``LD_LIBRARY_PATH`` with ``--triton-libs`` (default ``SITE/nvidia_pytriton.libs``) in front, set
  by the script for tritonserver (as pytriton sets it): the libraries find their bundled
  dependencies through an ``$ORIGIN``-relative RUNPATH, which the copied backend folder breaks;
- the stub links the system's ``libpython3.11.so.1`` (Debian: libpython3.11) and imports numpy
  through that Python's ``sys.path``: Debian's ``python3-numpy``
  (/usr/lib/python3/dist-packages/numpy). The script checks ``/usr/bin/python3.X -c "import
  numpy"`` first and says so when that fails.

Triton runs as ``tritonserver --model-repository REPOSITORY --backend-directory BACKENDS
--grpc-address 127.0.0.1 --grpc-port PORT --allow-http false --allow-metrics false`` (PORT a free
port picked before the start, plus any ``--triton-arg``) and counts as started once its log says
``Started GRPCInferenceService`` and the model's row in its model table says READY (and
tritonclient's is_model_ready agrees). inferd runs as harness.inferd_command builds it: ``python
-m inferd serve --model-repository REPOSITORY --grpc-port 0 --host 127.0.0.1 --log-format json
--http-port off --metrics-port 0`` (plus any ``--server-arg``), with ``--python``'s interpreter
(default this one). Both listen on loopback TCP only, without HTTP or metrics listeners.

Rounds (``--rounds``, default 2): each runs both servers, one after the other, alternating which
goes first (round 1 inferd first, round 2 Triton first, ...). Each server is started fresh for its
turn of each round and stopped after it, so that only one server is alive while the other is
measured (an idle server's threads do not share the 2 cores with the measured one) and each round
is a full start -> warm-up -> measure of each, an independent sample. After its start, each is
warmed up with ``--warmup`` requests one at a time through tritonclient, every answer checked
against INPUT0 * 2 + 1 (a wrong answer stops the script). Then, for each ``--concurrencies``
value, perf_analyzer (through harness.PerfAnalyzer: inferd's ``inferd-perf-analyzer`` wrapper
beside ``--python``) over gRPC, batch 1, ``--concurrency-range C:C --measurement-interval MS
--percentile 99 --async``, as benchmarks/python_backend.py runs it; a run whose windows do not
settle is run again with each ``--retry-stability`` percentage.

CPU: around each perf_analyzer run, the server process's utime + stime (/proc/PID/stat) and that
of all its live descendant processes (Triton: its ``triton_python_backend_stub`` processes;
inferd: ``python -m inferd.python_backend.worker``), over the inferences answered in between
(ModelStatistics' inference_count, read through tritonclient's get_inference_statistics from
either server: both speak the same protocol). python_backend.py's probe and window are reused, so
the rows carry the same fields (mean batch, cores of the load generator and of other processes:
the machine is shared).

Targets (issue 28), from the medians over the rounds, inferd / Triton:
- throughput >= 1.2 x Triton's at c=16 and at c=64;
- p50 at c=1 <= 0.8 x Triton's;
- server + worker CPU per inference <= Triton's (at every concurrency measured).
A target whose concurrency was not measured reads "not measured".

Writes results.json and results.md (per concurrency, each round's figures of both servers, the
medians and the ratios; the targets; the commands; the machine) into ``--out`` (default
benchmarks/out/python-vs-triton-<timestamp>/, git-ignored), every log under logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import numpy as np

import harness
import python_backend
import server_usage

INFERD = "inferd"
TRITON = "triton"
SERVERS = (INFERD, TRITON)
TITLES = {INFERD: "inferd", TRITON: "Triton"}
MODEL = "affine"
ELEMENTS = 16

AFFINE_MODEL_PY = '''"""OUTPUT0 = INPUT0 * 2 + 1, as Triton's python backend documents a model."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = x * 2 + 1  # float32 in, float32 out (Python int scalars do not widen it)
            output = pb_utils.Tensor("OUTPUT0", y)
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
'''


def affine(x: np.ndarray) -> np.ndarray:
    """What AFFINE_MODEL_PY answers."""
    return x * 2 + 1


# The BLS kind's measured model: each request's INPUT0 sent on to AFFINE_STEP (AFFINE_MODEL_PY
# under that name) with InferenceRequest.exec(), its OUTPUT0 answered.
AFFINE_STEP = "affine_step"
BLS_MODEL_PY = f'''"""OUTPUT0 = {AFFINE_STEP}(INPUT0): a BLS call per request, as Triton shows."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="{AFFINE_STEP}",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x)],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
'''


@dataclass(frozen=True)
class ModelKind:
    """A model to compare: its model.py, what it answers (the warm-up checks it), config lines
    beyond the common ones (e.g. a decoupled model's ``model_transaction_policy``) and
    perf_analyzer flags (e.g. ``--streaming``)."""

    model_py: str
    answer: Callable[[np.ndarray], np.ndarray]
    config_extra: str = ""
    pa_extra: tuple[str, ...] = ()
    # Other python models the measured one calls (BLS): name -> model.py, configured as it is.
    called: tuple[tuple[str, str], ...] = ()


MODEL_KINDS = {
    "affine": ModelKind(AFFINE_MODEL_PY, affine),
    "bls": ModelKind(BLS_MODEL_PY, affine, called=((AFFINE_STEP, AFFINE_MODEL_PY),)),
}


# --- the repository -----------------------------------------------------------------------------


def write_repository(repository: Path, kind: ModelKind, max_batch_size: int) -> str:
    """The model and those it calls, as both servers read them; returns its config.pbtxt."""
    config = ""
    for name, model_py in ((MODEL, kind.model_py), *kind.called):
        text = python_backend.model_config(name, max_batch_size, "python") + kind.config_extra
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(model_py)
        (repository / name / "config.pbtxt").write_text(text)
        config = config or text
    return config


# --- Triton -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Triton:
    """Where Triton's pieces are, and what its process needs (see the docstring)."""

    binary: Path
    backends: Path  # has python/libtriton_python.so and python/triton_python_backend_stub
    libs: Path | None
    prepared: str  # how ``backends`` came to be, for the report

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.libs is not None:
            old = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = str(self.libs) + (f":{old}" if old else "")
        return env


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages/pytriton"))
    if not found:
        raise SystemExit(
            f"no pytriton in {venv}/lib/python3*/site-packages: "
            f"python3 -m venv {venv} && {venv}/bin/pip install --no-deps nvidia-pytriton==0.7.0"
        )
    return found[-1].parent


def check_stub_python(version: str) -> None:
    """The stub embeds the system's libpython X.Y and imports numpy through its sys.path."""
    python = Path(f"/usr/bin/python{version}")
    if not python.exists():
        print(f"note: {python} not found: cannot check that the stub's Python has numpy")
        return
    done = subprocess.run([str(python), "-c", "import numpy"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"{python} cannot import numpy, which Triton's python stub needs "
            "(Debian: apt-get install -y python3-numpy)"
        )


def prepare_triton(args: argparse.Namespace, tmp: Path) -> Triton:
    site = site_packages(args.triton_venv) if args.triton_venv else None

    def default(given: Path | None, relative: str, option: str) -> Path:
        if given is not None:
            return given
        if site is None:
            raise SystemExit(f"give {option} or --triton-venv")
        return site / relative

    binary = default(args.tritonserver, "pytriton/tritonserver/bin/tritonserver", "--tritonserver")
    backends = default(
        args.backend_directory, "pytriton/tritonserver/backends", "--backend-directory"
    )
    libs = args.triton_libs or (site / "nvidia_pytriton.libs" if site else None)
    if libs is not None and not libs.is_dir():
        libs = None
    for path in (binary, backends / "python" / "libtriton_python.so"):
        if not path.exists():
            raise SystemExit(f"{path} not found")
    check_stub_python(args.stub_python)
    if (backends / "python" / "triton_python_backend_stub").exists():
        return Triton(binary, backends, libs, f"used as given: {backends}")
    stub = default(
        args.stub,
        f"pytriton/tritonserver/python_backend_stubs/{args.stub_python}/triton_python_backend_stub",
        "--stub",
    )
    if not stub.exists():
        raise SystemExit(f"{stub} not found (--stub)")
    copy = tmp / "triton-backends"
    shutil.copytree(backends, copy)
    shutil.copy2(stub, copy / "python" / "triton_python_backend_stub")
    prepared = (
        f"{backends} copied to a temporary folder, with {stub} added as "
        "python/triton_python_backend_stub (as pytriton prepares its workspace)"
    )
    return Triton(binary, copy, libs, prepared)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def triton_command(triton: Triton, repository: Path, port: int, extra: list[str]) -> list[str]:
    return [
        str(triton.binary), "--model-repository", str(repository),
        "--backend-directory", str(triton.backends), "--grpc-address", "127.0.0.1",
        "--grpc-port", str(port), "--allow-http", "false", "--allow-metrics", "false", *extra,
    ]  # fmt: skip


def start_triton(
    triton: Triton,
    repository: Path,
    extra: list[str],
    log: Path,
    timeout: float = 180,
    models: tuple[str, ...] = (MODEL,),
) -> tuple[harness.Server, str]:
    """Starts tritonserver and waits for its gRPC service and each of ``models``' READY rows;
    its log goes on being read into ``log``. Returns the server and the version its log names."""
    port = free_port()
    command = triton_command(triton, repository, port, extra)
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # Triton logs to stderr; its tables too
        text=True,
        env=triton.env(),
    )
    assert process.stdout is not None
    sink = log.open("w")
    seen: list[str] = []
    ready: dict[str, bool] = {}
    started = False
    version = ""
    timer = threading.Timer(timeout, process.kill)  # a server that never starts must not hang us
    timer.start()
    try:
        for line in process.stdout:
            sink.write(line)
            seen.append(line)
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] in models and len(cells) == 3:
                ready[cells[0]] = cells[2] == "READY"
            if cells[:1] == ["server_version"] and len(cells) == 2:
                version = cells[1]
            if "Started GRPCInferenceService" in line:
                started = True
                break
    finally:
        timer.cancel()
    all_ready = all(ready.get(model, False) for model in models)
    if not (started and all_ready):
        process.kill()
        process.wait()
        sink.close()
        tail = "".join(seen[-30:])
        raise RuntimeError(
            f"Triton did not start (gRPC started: {started}, READY: {ready}): "
            f"{shlex.join(command)}\n{tail}"
        )

    def drain(stream: IO[str]) -> None:
        for line in stream:
            sink.write(line)
        sink.close()

    thread = threading.Thread(target=drain, args=(process.stdout,), daemon=True)
    thread.start()
    return harness.Server(process, port, command, thread), version


# --- both servers -------------------------------------------------------------------------------


def start(
    name: str,
    args: argparse.Namespace,
    triton: Triton,
    repository: Path,
    log: Path,
) -> tuple[harness.Server, str]:
    """Starts one server; returns it and its version ("" for inferd: the commit names it)."""
    if name == TRITON:
        models = (MODEL, *(called for called, _ in MODEL_KINDS[args.model_kind].called))
        return start_triton(triton, repository, args.triton_arg, log, models=models)
    command = harness.inferd_command(
        args.python, repository, ["--metrics-port", "0", *args.server_arg]
    )
    return harness.start_server(command, log), ""


def shown_command(server: harness.Server, args: argparse.Namespace, repository: Path) -> str:
    text = shlex.join(server.command).replace(str(repository), "REPOSITORY")
    text = text.replace(f"--grpc-port {server.port}", "--grpc-port PORT")
    return text.replace(args.python, harness.relative(args.python))


def warm_up(server: harness.Server, kind: ModelKind, count: int) -> None:
    """``count`` requests one at a time, every answer checked."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        if not client.is_model_ready(MODEL):
            raise RuntimeError(f"{MODEL} is not ready")
        rng = np.random.default_rng(0)
        for _ in range(count):
            x = rng.standard_normal((1, ELEMENTS), dtype=np.float32)
            given = grpcclient.InferInput("INPUT0", [1, ELEMENTS], "FP32")
            given.set_data_from_numpy(x)
            result = client.infer(MODEL, [given], client_timeout=60)
            got = result.as_numpy("OUTPUT0")
            want = kind.answer(x)
            if got is None or got.dtype != np.float32 or not np.array_equal(got, want):
                raise RuntimeError(f"wrong answer: {got!r} for {x!r}, want {want!r}")
    finally:
        client.close()


# --- the server's processes ---------------------------------------------------------------------


def descendants(pid: int) -> dict[int, dict[str, Any]]:
    """Every live descendant of ``pid`` (python_backend.children, level by level)."""
    found: dict[int, dict[str, Any]] = {}
    level = python_backend.children(pid)
    while level:
        found.update(level)
        below: dict[int, dict[str, Any]] = {}
        for child in level:
            below.update(python_backend.children(child))
        level = {k: v for k, v in below.items() if k not in found}
    return found


class Probe(python_backend.Probe):
    """python_backend's probe, with every descendant process in place of the children."""

    def __init__(self, pid: int, statistics: server_usage.StatisticsClient, model: str) -> None:
        super().__init__(pid, statistics, model)
        self.children = descendants(pid)


def run_pa(
    args: argparse.Namespace,
    pa: harness.PerfAnalyzer,
    server: harness.Server,
    statistics: server_usage.StatisticsClient,
    kind: ModelKind,
    label: str,
    concurrency: int,
    out: Path,
) -> dict[str, Any]:
    attempt, stability = 0, None
    while True:
        extra = [
            "--async",
            *kind.pa_extra,
            *args.pa_arg,
            *([] if stability is None else ["--stability-percentage", str(stability)]),
        ]
        log = out / "logs" / f"pa-{label}-c{concurrency}-{attempt}.log"
        before = Probe(server.pid, statistics, MODEL)
        result = pa.measure(MODEL, server.port, concurrency, args.measurement_interval, extra, log)
        after = Probe(server.pid, statistics, MODEL)
        if result.error is None or attempt >= len(args.retry_stability):
            break
        stability = args.retry_stability[attempt]
        attempt += 1
        print(f"    retrying with --stability-percentage {stability}", flush=True)
    summary = result.summary()
    row = {
        "concurrency": concurrency,
        "stability_percentage": stability,
        **{k: summary[k] for k in ("infer_per_s", "p50_us", "p99_us", "avg_us", "error")},
        "command": summary["command"],
        "seconds": summary["seconds"],
        **python_backend.window(server.pid, before, after),
    }
    if row["error"] is None and not row["inferences"]:
        row["error"] = f"no inferences counted by ModelStatistics ({row['usage_error']})"
    return row


def failed(
    name: str, round_: int, turn: int, concurrencies: list[int], error: str
) -> list[dict[str, Any]]:
    """The rows of a server that did not start or warm up."""
    return [
        {"server": name, "round": round_, "turn": turn, "concurrency": c, "error": error,
         "command": ""}
        for c in concurrencies
    ]  # fmt: skip


# --- the figures --------------------------------------------------------------------------------

FIGURES = ("infer_per_s", "p50_us", "p99_us", "server_cpu_us_per_infer")


def medians(rows: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, float | None]]]:
    """server -> concurrency -> figure -> the median over the rounds that did not fail."""
    out: dict[str, dict[int, dict[str, float | None]]] = {}
    for r in rows:
        out.setdefault(r["server"], {}).setdefault(r["concurrency"], {})
    for name, by_c in out.items():
        for c in by_c:
            good = [r for r in rows if r["server"] == name and r["concurrency"] == c]
            good = [r for r in good if not r["error"]]
            for figure in (*FIGURES, "server_process_us_per_infer", "children_us_per_infer"):
                values = [r[figure] for r in good if r[figure] is not None]
                by_c[c][figure] = statistics.median(values) if values else None
            by_c[c]["rounds"] = len(good)
    return out


def ratios(
    middle: dict[str, dict[int, dict[str, float | None]]],
) -> dict[int, dict[str, float | None]]:
    """concurrency -> figure -> inferd's median / Triton's."""
    out: dict[int, dict[str, float | None]] = {}
    for c in sorted(set(middle.get(INFERD, {})) & set(middle.get(TRITON, {}))):
        ours, theirs = middle[INFERD][c], middle[TRITON][c]
        out[c] = {f: python_backend._ratio(ours[f], theirs[f]) for f in FIGURES}
    return out


def targets(by_c: dict[int, dict[str, float | None]]) -> list[dict[str, Any]]:
    """Issue 28's targets, each with its ratios and "met", "not met" or "not measured"."""

    def verdict(checks: list[tuple[int, float | None, bool]]) -> str:
        if any(value is None for _, value, _ in checks):
            return "not measured"
        return "met" if all(ok for _, _, ok in checks) else "not met"

    def check(c: int, figure: str, ok: Callable[[float], bool]) -> tuple[int, float | None, bool]:
        value = by_c.get(c, {}).get(figure)
        return c, value, value is not None and ok(value)

    throughput = [check(c, "infer_per_s", lambda v: v >= 1.2) for c in (16, 64)]
    latency = [check(1, "p50_us", lambda v: v <= 0.8)]
    cpu = [check(c, "server_cpu_us_per_infer", lambda v: v <= 1.0) for c in sorted(by_c)]
    cpu = cpu or [(1, None, False)]  # nothing measured
    table = [
        ("throughput >= 1.2 x Triton's at c=16 and at c=64", "infer/s", throughput),
        ("c=1 p50 <= 0.8 x Triton's", "p50", latency),
        ("server + worker CPU per inference <= Triton's", "CPU µs/infer", cpu),
    ]
    return [
        {
            "target": text,
            "figure": figure,
            "ratios": {str(c): value for c, value, _ in checks},
            "status": verdict(checks),
        }
        for text, figure, checks in table
    ]


# --- the report ---------------------------------------------------------------------------------

n = python_backend.n


def markdown(report: dict[str, Any]) -> str:
    rows: list[dict[str, Any]] = report["rows"]
    middle: dict[str, dict[str, dict[str, float | None]]] = report["medians"]
    by_c: dict[str, dict[str, float | None]] = report["ratios"]
    versions = ", ".join(f"{TITLES[k]} {v}" for k, v in report["server_versions"].items() if v)
    lines = [
        f"Machine: {harness.describe_machine(report['machine'])}.",
        "",
        f"Run: `{report['invocation']}` ({report['minutes']:.1f} min); {versions}.",
        "",
        "Servers (each started fresh for its turn of each round, alone on the machine; "
        "REPOSITORY = the temporary repository, PORT = a free port):",
        "",
        *[f"- {TITLES[k]}: `{v}`" for k, v in report["server_commands"].items()],
        f"- Triton's backend directory: {report['triton']['prepared']}; LD_LIBRARY_PATH="
        f"{report['triton']['libs']} in front",
        "",
        "Config (served by both; model.py is AFFINE_MODEL_PY in the script):",
        "",
        "```",
        report["config"].rstrip(),
        "```",
        "",
        "perf_analyzer (gRPC, TCP loopback, batch 1, [1, 16] FP32, --async); `*N%` = accepted "
        "at --stability-percentage N. CPU = the server process + its descendant processes (the "
        "python workers / stubs), µs per inference (ModelStatistics); mean batch = inferences / "
        "executions; other cores = the machine's busy cores less the server's, its workers' and "
        "perf_analyzer's:",
    ]
    head = (
        "| server | round | turn | infer/s | p50 µs | p99 µs | CPU µs/infer | of it server "
        "process | of it workers | mean batch | other cores |"
    )
    for c in sorted({r["concurrency"] for r in rows}):
        lines += ["", f"c = {c}:", "", head, "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["concurrency"] != c:
                continue
            cells = f"| {TITLES[r['server']]} | {r['round']} | {r['turn']} "
            if r["error"]:
                lines.append(cells + f"| FAILED: {r['error'].splitlines()[-1]} |||||||")
                continue
            mark = f"*{r['stability_percentage']}%" if r["stability_percentage"] else ""
            lines.append(
                cells + f"| {n(r['infer_per_s'])}{mark} | {n(r['p50_us'])} | {n(r['p99_us'])} "
                f"| {n(r['server_cpu_us_per_infer'])} | {n(r['server_process_us_per_infer'])} "
                f"| {n(r['children_us_per_infer'])} | {n(r['mean_batch'], 1)} "
                f"| {r['other_cores']:.2f} |"
            )
        for name in SERVERS:
            m = middle.get(name, {}).get(str(c))
            if m:
                lines.append(
                    f"| {TITLES[name]} median | {m['rounds']} rounds | | {n(m['infer_per_s'])} "
                    f"| {n(m['p50_us'])} | {n(m['p99_us'])} | {n(m['server_cpu_us_per_infer'])} "
                    f"| {n(m['server_process_us_per_infer'])} | {n(m['children_us_per_infer'])} "
                    "| | |"
                )
        q = by_c.get(str(c))
        if q:
            lines.append(
                f"| inferd / Triton | | | {n(q['infer_per_s'], 2)} | {n(q['p50_us'], 2)} "
                f"| {n(q['p99_us'], 2)} | {n(q['server_cpu_us_per_infer'], 2)} | | | | |"
            )
    lines += [
        "",
        "Targets (issue 28; medians over the rounds, inferd / Triton):",
        "",
        "| target | ratio | status |",
        "|---|---|---|",
    ]
    for t in report["targets"]:
        shown = ", ".join(f"c={c}: {n(v, 2)}" for c, v in t["ratios"].items())
        lines.append(f"| {t['target']} | {t['figure']} {shown} | {t['status']} |")
    lines += ["", "perf_analyzer commands:", ""]
    lines += [f"    {c}" for c in sorted({r["command"] for r in rows if r["command"]})]
    return "\n".join(lines) + "\n"


def describe(row: dict[str, Any]) -> str:
    if row["error"]:
        return f"FAILED: {row['error']}"
    return (
        f"{row['infer_per_s']:.0f} infer/s, p50 {row['p50_us']:.0f} µs, p99 {row['p99_us']:.0f} "
        f"µs, CPU {n(row['server_cpu_us_per_infer'])} µs/infer (server process "
        f"{n(row['server_process_us_per_infer'])}, workers {n(row['children_us_per_infer'])}), "
        f"mean batch {n(row['mean_batch'], 1)}"
    )


# --- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument(
        "--triton-venv",
        type=Path,
        default=Path("/tmp/pytriton-venv"),
        help="virtualenv with nvidia-pytriton==0.7.0: the defaults of the next four options",
    )
    parser.add_argument("--tritonserver", type=Path, help="the tritonserver binary")
    parser.add_argument("--backend-directory", type=Path, help="Triton's --backend-directory")
    parser.add_argument("--stub", type=Path, help="triton_python_backend_stub to add, if missing")
    parser.add_argument("--triton-libs", type=Path, help="put in front of LD_LIBRARY_PATH")
    parser.add_argument(
        "--stub-python", default="3.11", help="the stub's Python X.Y (the system's libpython)"
    )
    parser.add_argument("--model-kind", choices=sorted(MODEL_KINDS), default="affine")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--concurrencies", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=200, help="checked requests after a start")
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    parser.add_argument("--triton-arg", action="append", default=[], help="extra Triton flag")
    parser.add_argument("--measurement-interval", type=int, default=4000, help="ms per window")
    parser.add_argument(
        "--pa-arg", action="append", default=[], help="extra perf_analyzer flag, e.g. --pa-arg=-r6"
    )
    parser.add_argument(
        "--retry-stability",
        type=int,
        nargs="*",
        default=[25, 50],
        help="--stability-percentage values for the retries of a run that did not stabilise",
    )
    parser.add_argument("--out", type=Path, help="default benchmarks/out/python-vs-triton-<time>/")
    return parser.parse_args()


def main() -> int:
    # Started in the background by a non-interactive shell, SIGINT arrives ignored: restore
    # Python's handler so that an interrupt still stops the server.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parse_args()
    args.python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    kind = MODEL_KINDS[args.model_kind]
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime(
        "python-vs-triton-%Y%m%d-%H%M%S"
    )
    (out / "logs").mkdir(parents=True, exist_ok=True)
    machine = harness.machine_info(args.python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    clock = time.monotonic()
    rows: list[dict[str, Any]] = []
    commands: dict[str, str] = {}
    versions: dict[str, str] = {}
    pa = harness.PerfAnalyzer.find(args.python)
    with tempfile.TemporaryDirectory(prefix="inferd-vs-triton-") as tmp:
        repository = Path(tmp) / "repository"
        config = write_repository(repository, kind, args.max_batch_size)
        triton = prepare_triton(args, Path(tmp))
        for round_ in range(1, args.rounds + 1):
            order = list(SERVERS) if round_ % 2 else list(reversed(SERVERS))
            order = [s for s in order if s in args.servers]
            for turn, name in enumerate(order, start=1):
                label = f"{name}-r{round_}"
                print(f"round {round_}, {TITLES[name]}:", flush=True)
                try:
                    server, version = start(
                        name, args, triton, repository, out / "logs" / f"server-{label}.log"
                    )
                except RuntimeError as e:  # the other server is still measured
                    print(f"  FAILED to start: {e}", flush=True)
                    rows += failed(name, round_, turn, args.concurrencies, f"start: {e}")
                    continue
                commands[name] = shown_command(server, args, repository)
                versions[name] = version
                statistics_client = server_usage.StatisticsClient(server.port)
                try:
                    try:
                        warm_up(server, kind, args.warmup)
                    except Exception as e:  # tritonclient's errors, a wrong answer
                        print(f"  FAILED the warm-up: {e}", flush=True)
                        rows += failed(name, round_, turn, args.concurrencies, f"warm-up: {e}")
                        continue
                    for clients in args.concurrencies:
                        row = run_pa(args, pa, server, statistics_client, kind, label, clients, out)
                        row = {"server": name, "round": round_, "turn": turn, **row}
                        rows.append(row)
                        print(f"  c={clients}: {describe(row)}", flush=True)
                finally:
                    statistics_client.close()
                    server.stop()
    middle = medians(rows)
    by_c = ratios(middle)
    goals = targets(by_c)
    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - clock) / 60,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "machine": machine,
        "load_average_at_end": list(os.getloadavg()),
        "server_commands": commands,
        "server_versions": versions,
        "triton": {
            "binary": str(triton.binary),
            "prepared": triton.prepared,
            "libs": str(triton.libs) if triton.libs else None,
            "stub_python": args.stub_python,
        },
        "model_kind": args.model_kind,
        "config": config,
        "model_py": kind.model_py,
        "rows": rows,
        # JSON keys are strings: the concurrencies too.
        "medians": {s: {str(c): m for c, m in by.items()} for s, by in middle.items()},
        "ratios": {str(c): q for c, q in by_c.items()},
        "targets": goals,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "results.md").write_text(text)
    print("\n" + text)
    print(f"written: {out / 'results.md'}, {out / 'results.json'}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
