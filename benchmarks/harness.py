"""Shared pieces of the benchmark scripts (not a script itself).

Starting and stopping servers (inferd, the transport floors, building the C++ one), finding and
running perf_analyzer, copying a repository with ``dynamic_batching`` switched on, loading a
model's completed config and describing the machine. The scripts in this folder import it as
``harness`` (the folder of the script being run is on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent


def relative(path: str | Path) -> str:
    """A path as reports show it: relative to the repository root when inside it."""
    try:
        return str(Path(path).absolute().relative_to(ROOT))
    except ValueError:
        return str(path)


# --- models -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFiles:
    """A model's completed config (inferd's own completion) and the ONNX file it serves."""

    name: str
    version: int
    config: Any  # inference.ModelConfig
    onnx_path: Path


def load_model(repository: Path, name: str, default_max_batch_size: int = 4) -> ModelFiles:
    """The highest version of ``name`` with its config completed as inferd completes it."""
    from inferd.repository import ModelRepository, load_model_config

    repo = ModelRepository(repository)
    versions = repo.versions(name)
    if not versions:
        raise SystemExit(f"model {name!r} has no numeric version folder in {repository}")
    config_path = repo.config_path(name)
    # Read default_model_filename first, as inferd does: the newest version's file completes.
    newest = repo.model_file(name, versions[-1])
    config = load_model_config(
        name, config_path, newest, default_max_batch_size=default_max_batch_size
    )
    onnx_path = repo.model_file(name, versions[-1], config.default_model_filename)
    return ModelFiles(name, versions[-1], config, onnx_path)


def datatype_name(config_type: int) -> str:
    """Config enum value (TYPE_FP32 = 11) -> protocol name ("FP32")."""
    from inferd.datatypes import BY_CONFIG_TYPE

    return BY_CONFIG_TYPE[config_type].name


def default_threads() -> int:
    """inferd's default intra-op thread count: one per core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


def session_threads(config: Any, intra: int, inter: int) -> tuple[int, int]:
    """ONNX Runtime threads as inferd picks them: the model's parameters, else the defaults
    (intra 0 = one per core)."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    intra = int(params.get("intra_op_thread_count", intra)) or default_threads()
    inter = int(params.get("inter_op_thread_count", inter))
    return intra, inter


def ort_session(onnx_path: Path, intra: int, inter: int, spinning: bool = True) -> Any:
    """A CPU InferenceSession with these thread counts; ``spinning=False`` as inferd's sessions
    (ONNX Runtime's pool threads do not spin after a run)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra
    options.inter_op_num_threads = inter
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(
        str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
    )


def batching_block(max_queue_delay_us: int | None) -> str:
    return (
        "dynamic_batching { }"
        if max_queue_delay_us is None
        else f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}"
    )


def batching_repository(
    source: Path,
    destination: Path,
    models: list[str],
    max_queue_delay_us: int | dict[str, int] | None,
) -> str:
    """Copies ``source`` to ``destination`` and appends a ``dynamic_batching`` block to each
    model's config.pbtxt (creating the file where there is none). ``max_queue_delay_us``: one
    delay for every model, or a delay per model (models not named get ``dynamic_batching { }``).
    Returns the appended text (per model, ``model: block; ...``, when the blocks differ)."""
    delays = (
        max_queue_delay_us
        if isinstance(max_queue_delay_us, dict)
        else dict.fromkeys(models, max_queue_delay_us)
    )
    shutil.copytree(source, destination)
    blocks: dict[str, str] = {}
    for model in models:
        blocks[model] = batching_block(delays.get(model))
        config = destination / model / "config.pbtxt"
        text = config.read_text() if config.exists() else ""
        if text and not text.endswith("\n"):
            text += "\n"
        config.write_text(text + blocks[model] + "\n")
    if len(set(blocks.values())) <= 1:
        return next(iter(blocks.values()), batching_block(None))
    return "; ".join(f"{model}: {block}" for model, block in blocks.items())


# --- servers ----------------------------------------------------------------------------------


@dataclass
class Server:
    """A server process that logged ``{"event": "server started", "port": N}`` on stderr."""

    process: subprocess.Popen[str]
    port: int
    command: list[str]
    _drain: threading.Thread | None = None
    http_port: int | None = None  # inferd's HTTP listener, when the record names one

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 60) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._drain is not None:
            self._drain.join(timeout=5)


def start_server(
    command: list[str],
    log: Path | None,
    timeout: float = 180,
    env: dict[str, str] | None = None,
) -> Server:
    """Starts ``command`` (in ``env``, default this process's environment) and waits for its
    "server started" line. Its stderr goes on being read (into ``log``, or nowhere) so that a full
    pipe never blocks the server."""
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    sink: IO[str] | None = log.open("w") if log else None
    seen: list[str] = []
    port: int | None = None
    http_port: int | None = None
    deadline = time.monotonic() + timeout
    timer = threading.Timer(timeout, process.kill)  # a server that never logs must not hang us
    timer.start()
    try:
        for line in process.stderr:
            if sink:
                sink.write(line)
            seen.append(line)
            with contextlib.suppress(json.JSONDecodeError, AttributeError):
                event = json.loads(line)
                if event.get("event") == "server started":
                    port = int(event["port"])
                    if event.get("http_port") is not None:
                        http_port = int(event["http_port"])
                    break
            if time.monotonic() > deadline:
                break
    finally:
        timer.cancel()
    if port is None:
        process.kill()
        process.wait()
        if sink:
            sink.close()
        tail = "".join(seen[-20:])
        raise RuntimeError(f"server did not start: {shlex.join(command)}\n{tail}")

    def drain(stream: IO[str]) -> None:
        for line in stream:
            if sink:
                sink.write(line)
        if sink:
            sink.close()

    thread = threading.Thread(target=drain, args=(process.stderr,), daemon=True)
    thread.start()
    return Server(process, port, command, thread, http_port)


def inferd_command(python: str, repository: Path, extra: list[str]) -> list[str]:
    return [
        python, "-m", "inferd", "serve", "--model-repository", str(repository),
        "--grpc-port", "0", "--host", "127.0.0.1", "--log-format", "json",
        "--http-port", "off", *extra,  # HTTP off unless `extra` asks (the last flag wins)
    ]  # fmt: skip


def floor_command(python: str, repository: Path, model: str, inline: bool) -> list[str]:
    # The naive server runs ONNX Runtime with 1 intra-op thread, as inferd does on 2 cores (issue
    # 10's measurement: "1 intra-op thread everywhere"); more would spin against the load.
    return [
        python, str(BENCHMARKS / "transport_floor.py"), "--model-repository", str(repository),
        "--model", model, "--port", "0", "--intra-op-thread-count", "1",
        *(["--inline"] if inline else []),
    ]  # fmt: skip


FLOOR_CPP_SOURCE = BENCHMARKS / "floor_cpp"
FLOOR_CPP_BUILD = ROOT / "build" / "floor_cpp"


def floor_cpp_binary() -> Path:
    """The C++ floor (benchmarks/floor_cpp, grpc++ from pkg-config), configured on first use and
    built: ``cmake --build`` does nothing when nothing changed."""
    steps = [
        ["cmake", "-S", str(FLOOR_CPP_SOURCE), "-B", str(FLOOR_CPP_BUILD),
         "-DCMAKE_BUILD_TYPE=Release"],
        ["cmake", "--build", str(FLOOR_CPP_BUILD)],
    ]  # fmt: skip
    if (FLOOR_CPP_BUILD / "CMakeCache.txt").exists():
        steps = steps[1:]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise SystemExit(f"building the C++ floor failed: {shlex.join(step)}\n{tail}")
    return FLOOR_CPP_BUILD / "floor_server"


def write_floor_responses(python: str, repository: Path, model: str, directory: Path) -> list[str]:
    """Writes the C++ floor's answers for ``model`` into ``directory`` (transport_floor.py
    ``--write-responses``: the Python floor's own answers, serialized). Returns the command."""
    cmd = [
        python, str(BENCHMARKS / "transport_floor.py"), "--model-repository", str(repository),
        "--model", model, "--intra-op-thread-count", "1", "--write-responses", str(directory),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{done.stderr.strip()[-2000:]}")
    return cmd


def floor_cpp_command(binary: Path, responses: Path) -> list[str]:
    """The C++ floor answering from ``responses`` (write_floor_responses) on a free port."""
    return [str(binary), "--responses", str(responses), "--port", "0"]


def proc_stat(pid: int) -> tuple[int, int, int, int]:
    """(ppid, utime ticks, stime ticks, minor faults) of a process, from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3 (state)
    return int(fields[1]), int(fields[11]), int(fields[12]), int(fields[7])


def process_ticks(pid: int) -> tuple[int, int]:
    """utime + stime of ``pid`` and of its live children (a python worker, a stub), in clock
    ticks: (its own, its children's)."""
    own = children = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid, utime, stime, _ = proc_stat(int(entry.name))
        except OSError:
            continue  # it ended while we read
        if int(entry.name) == pid:
            own += utime + stime
        elif ppid == pid:
            children += utime + stime
    return own, children


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


# --- perf_analyzer ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfAnalyzer:
    """tritonclient's perf_analyzer, run through inferd's wrapper beside ``python``
    (``inferd-perf-analyzer``, python/inferd/perf_analyzer.py), which puts the CUDA runtime
    library perf_analyzer loads on its library path and then becomes perf_analyzer (same pid,
    its signals and exit status)."""

    binary: str
    env: dict[str, str]

    @classmethod
    def find(cls, python: str) -> PerfAnalyzer:
        wrapper = Path(python).parent / "inferd-perf-analyzer"
        if not wrapper.is_file():
            raise SystemExit(
                f"{wrapper} not found: install inferd with its dev extra into that environment "
                "(make build)"
            )
        return cls(str(wrapper), dict(os.environ))

    def command(
        self,
        model: str,
        port: int,
        concurrency: int,
        interval_ms: int,
        csv_path: str,
        extra: list[str] | None = None,
    ) -> list[str]:
        return [
            self.binary, "-m", model, "-i", "grpc", "-u", f"127.0.0.1:{port}",
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-interval", str(interval_ms), "--percentile", "99",
            "-f", csv_path, *(extra or []),
        ]  # fmt: skip

    def measure(
        self,
        model: str,
        port: int,
        concurrency: int,
        interval_ms: int,
        extra: list[str] | None = None,
        log: Path | None = None,
    ) -> PerfResult:
        """One perf_analyzer run at one concurrency. A run that fails (perf_analyzer gives up
        when no 3 consecutive windows agree within --stability-percentage) is returned with
        ``error`` set and, when perf_analyzer wrote one anyway, no row."""
        with tempfile.TemporaryDirectory() as tmp:
            csv_path = os.path.join(tmp, "out.csv")
            cmd = self.command(model, port, concurrency, interval_ms, csv_path, extra)
            started = time.monotonic()
            done = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
            elapsed = time.monotonic() - started
            rows: list[dict[str, str]] = []
            if os.path.exists(csv_path):
                with open(csv_path) as f:
                    rows = list(csv.DictReader(f))
        output = done.stdout + done.stderr
        if log:
            log.write_text(f"$ {shlex.join(cmd)}\n# exit {done.returncode}\n{output}")
        error = None
        if done.returncode != 0 or not rows:
            tail = "\n".join(output.strip().splitlines()[-5:])
            error = f"perf_analyzer exit {done.returncode}: {tail}"
        shown = shlex.join(cmd).replace(f"127.0.0.1:{port}", "127.0.0.1:PORT")
        shown = shown.replace(csv_path, "OUT.csv").replace(self.binary, relative(self.binary))
        return PerfResult(
            concurrency=concurrency,
            row=rows[0] if rows and done.returncode == 0 else {},
            command=shown,
            seconds=elapsed,
            error=error,
        )


@dataclass
class PerfResult:
    concurrency: int
    row: dict[str, str]
    command: str
    seconds: float
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def number(self, column: str) -> float | None:
        value = self.row.get(column)
        if value is None or value == "":
            return None
        return float(value)

    def summary(self) -> dict[str, Any]:
        """The figures the reports use, in µs (perf_analyzer's CSV unit) and infer/s."""
        columns = {
            "infer_per_s": "Inferences/Second",
            "p50_us": "p50 latency",
            "p90_us": "p90 latency",
            "p99_us": "p99 latency",
            "avg_us": "Avg latency",
            "client_send_us": "Client Send",
            "network_server_us": "Network+Server Send/Recv",
            "server_queue_us": "Server Queue",
            "server_compute_input_us": "Server Compute Input",
            "server_compute_infer_us": "Server Compute Infer",
            "server_compute_output_us": "Server Compute Output",
            "client_recv_us": "Client Recv",
        }
        out: dict[str, Any] = {k: self.number(v) for k, v in columns.items()}
        out["concurrency"] = self.concurrency
        out["command"] = self.command
        out["seconds"] = round(self.seconds, 1)
        out["error"] = self.error
        out["csv_row"] = self.row
        return out


# --- the machine ------------------------------------------------------------------------------


def _run_text(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd).stdout.strip()
    except OSError:
        return ""


def machine_info(python: str) -> dict[str, Any]:
    """What a figure must name: the machine, the software and the commit."""
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = _run_text(
        [
            python,
            "-c",
            "import onnxruntime, grpc, numpy, platform; "
            "print(onnxruntime.__version__, grpc.__version__, numpy.__version__, "
            "platform.python_version())",
        ]
    ).split()
    dirty = bool(_run_text(["git", "status", "--porcelain", "--untracked-files=no"], ROOT))
    return {
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": default_threads(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "platform": platform.platform(),
        "python": versions[3] if len(versions) == 4 else platform.python_version(),
        "onnxruntime": versions[0] if versions else "",
        "grpcio": versions[1] if len(versions) > 1 else "",
        "numpy": versions[2] if len(versions) > 2 else "",
        "commit": _run_text(["git", "rev-parse", "--short", "HEAD"], ROOT),
        "tracked_changes": dirty,
        "load_average": list(os.getloadavg()),
    }


def describe_machine(info: dict[str, Any]) -> str:
    return (
        f"{info['machine']}, {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, "
        f"{info['platform']}; Python {info['python']}, onnxruntime {info['onnxruntime']}, "
        f"grpcio {info['grpcio']}; commit {info['commit']}"
        f"{' + uncommitted changes' if info['tracked_changes'] else ''}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in info['load_average'])}"
    )


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()
