"""What a server spent while perf_analyzer measured it (not a script; run.py uses it).

Read at the start and at the end of each perf_analyzer run:

- the server process's CPU time, utime + stime of /proc/PID/stat (every thread, those that have
  exited included);
- each live thread's, /proc/PID/task/TID/stat, grouped by thread name (below);
- the inferences the server answered, ModelStatistics' inference_count (inferd, and
  benchmarks/transport_floor.py, which counts its ModelInfer calls), and inferd's batch_stats;
- the CPU of this process's reaped children: the perf_analyzer run (the load generator).

``usage(start, end)`` divides the deltas by the inferences answered in between: µs of server CPU
per inference, per process and per thread group.

Thread groups: ``loop`` is the main thread (the asyncio event loop: gRPC's completion handling,
the Python handlers and, in inferd, the core's request parse and response write, which it runs on
that thread); ``worker`` / ``stager`` are the core's threads (``inferd-worker`` takes, assembles
and executes batches; with intra-op 1, ONNX Runtime runs on it); ``grpc`` is grpc's own threads
(``grpc_global_tim``, ``event_engine``, ``lifeguard``, ...); ``ort`` threads whose name says
ONNX Runtime; ``other`` the rest (threads named like the main one: Python threads, ONNX Runtime
pool threads, which inherit their creator's name); ``exited`` the CPU of threads that ended
within the interval (process delta less the live threads' deltas). Front end = loop + grpc +
other; core = worker + stager + ort.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
GROUPS = ("loop", "grpc", "other", "worker", "stager", "ort", "exited")
FRONT_END = ("loop", "grpc", "other")
CORE = ("worker", "stager", "ort")
GRPC_THREAD_PREFIXES = (
    "grpc",
    "nexting_thread",  # grpc++'s callback API (the core's transport)
    "timer_manager",
    "event_engine",
    "lifeguard",
    "default-executo",
    "resolver-execut",
    "global_timer",
)


def _stat(path: Path) -> tuple[str, int]:
    """(comm, utime + stime in ticks) from a /proc stat file."""
    text = path.read_text()
    close = text.rindex(")")  # comm may hold spaces or parentheses
    comm = text[text.index("(") + 1 : close]
    fields = text[close + 2 :].split()  # fields[0] is field 3 (state): utime is 14, stime 15
    return comm, int(fields[11]) + int(fields[12])


def thread_group(tid: int, pid: int, comm: str) -> str:
    if tid == pid:
        return "loop"
    if comm.startswith("inferd-worker"):
        return "worker"
    if comm.startswith("inferd-stager"):
        return "stager"
    if comm.startswith(GRPC_THREAD_PREFIXES):
        return "grpc"
    lowered = comm.lower()
    if "onnx" in lowered or lowered.startswith("ort"):
        return "ort"
    return "other"


@dataclass(frozen=True)
class ModelCounts:
    """A model's cumulative ModelStatistics: inferences, executions, and per batch size the
    executions and their compute durations in ns."""

    inference_count: int
    execution_count: int
    batches: dict[int, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    wall: float
    process_ticks: int
    threads: dict[int, tuple[str, int]]  # tid -> (name, ticks)
    children_s: float  # CPU of this process's reaped children (perf_analyzer)
    counts: ModelCounts | None
    error: str | None = None


class StatisticsClient:
    """ModelStatistics through tritonclient's gRPC client, as any Triton client would ask."""

    def __init__(self, port: int) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

    def counts(self, model: str) -> ModelCounts:
        response = self._client.get_inference_statistics(model_name=model, client_timeout=30)
        inferences = executions = 0
        batches: dict[int, dict[str, int]] = {}
        for stats in response.model_stats:
            if stats.name != model:
                continue
            inferences += stats.inference_count
            executions += stats.execution_count
            for batch in stats.batch_stats:
                entry = batches.setdefault(
                    int(batch.batch_size),
                    {"count": 0, "input_ns": 0, "infer_ns": 0, "output_ns": 0},
                )
                entry["count"] += batch.compute_infer.count
                entry["input_ns"] += batch.compute_input.ns
                entry["infer_ns"] += batch.compute_infer.ns
                entry["output_ns"] += batch.compute_output.ns
        return ModelCounts(inferences, executions, batches)

    def close(self) -> None:
        self._client.close()


def sample(pid: int, statistics: StatisticsClient | None, model: str) -> Sample:
    """The server's CPU (process, threads), its counts for ``model`` and the children's CPU."""
    counts, error = None, None
    if statistics is not None:
        try:
            counts = statistics.counts(model)
        except Exception as e:  # a failed read leaves the per-inference figures out, not the run
            error = f"ModelStatistics failed: {e}"
    threads: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            threads[int(task.name)] = _stat(task / "stat")
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # the thread ended while we read
    _, process_ticks = _stat(Path(f"/proc/{pid}/stat"))
    times = os.times()
    return Sample(
        wall=time.monotonic(),
        process_ticks=process_ticks,
        threads=threads,
        children_s=times.children_user + times.children_system,
        counts=counts,
        error=error,
    )


def usage(pid: int, start: Sample, end: Sample) -> dict[str, Any]:
    """Deltas between two samples: cores used, and µs of CPU per inference answered."""
    seconds = end.wall - start.wall
    cpu_s = (end.process_ticks - start.process_ticks) / CLK_TCK
    group_s = dict.fromkeys(GROUPS, 0.0)
    names: dict[str, set[str]] = {g: set() for g in GROUPS}
    live_s = 0.0
    for tid, (name, ticks) in end.threads.items():
        before = start.threads.get(tid)
        delta = (ticks - (before[1] if before else 0)) / CLK_TCK  # new threads from 0
        group = thread_group(tid, pid, name)
        group_s[group] += delta
        live_s += delta
        if delta > 0:
            names[group].add(name)
    group_s["exited"] = max(0.0, cpu_s - live_s)
    out: dict[str, Any] = {
        "seconds": round(seconds, 3),
        "server_cpu_s": cpu_s,
        "server_cores": cpu_s / seconds if seconds > 0 else None,
        "load_generator_cores": (end.children_s - start.children_s) / seconds
        if seconds > 0
        else None,
        "thread_cores": {g: s / seconds for g, s in group_s.items()} if seconds > 0 else {},
        "thread_names": {g: sorted(n) for g, n in names.items() if n},
        "inferences": None,
        "executions": None,
        "server_cpu_us_per_infer": None,
        "thread_us_per_infer": {},
        "batches": {},
        "error": start.error or end.error,
    }
    if start.counts is None or end.counts is None:
        return out
    inferences = end.counts.inference_count - start.counts.inference_count
    out["inferences"] = inferences
    out["executions"] = end.counts.execution_count - start.counts.execution_count
    if inferences > 0:
        out["server_cpu_us_per_infer"] = cpu_s * 1e6 / inferences
        out["thread_us_per_infer"] = {g: s * 1e6 / inferences for g, s in group_s.items()}
        out["front_end_us_per_infer"] = sum(group_s[g] for g in FRONT_END) * 1e6 / inferences
        out["core_us_per_infer"] = sum(group_s[g] for g in CORE) * 1e6 / inferences
    batches: dict[int, dict[str, int]] = {}
    for size, entry in end.counts.batches.items():
        before = start.counts.batches.get(size, {})
        delta = {k: v - before.get(k, 0) for k, v in entry.items()}
        if delta["count"] > 0:
            batches[size] = delta
    out["batches"] = batches
    return out
