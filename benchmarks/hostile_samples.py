"""What the hostile soak samples of the server (benchmarks/hostile_soak.py; not a script itself):
its VmRSS and its python workers', its descriptors, the CPU other processes take, and the medians
and percentiles the report gives."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness


@dataclass(frozen=True)
class Sample:
    seconds: float
    rss_kib: int | None
    workers_rss_kib: int
    workers: int
    fds: int | None
    health_p99_ms: float | None  # of the checks since the previous sample
    others_cores: float | None = None  # CPU of processes not the soak's, since the previous one
    load_average: float | None = None  # 1 min


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (the python workers and what they started)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = harness.proc_stat(int(entry))[0]
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def soft_fd_limit(pid: int) -> int | None:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return None


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def sample(pid: int, seconds: float, health_since: list[float], others: float | None) -> Sample:
    workers = descendants(pid)
    return Sample(
        seconds=round(seconds, 2),
        rss_kib=harness.rss_kib(pid),
        workers_rss_kib=sum(harness.rss_kib(w) or 0 for w in workers),
        workers=len(workers),
        fds=open_fds(pid),
        health_p99_ms=percentile(health_since, 0.99),
        others_cores=others,
        load_average=float(Path("/proc/loadavg").read_text().split()[0]),
    )


@dataclass
class OtherCpu:
    """The cores used by processes that are not the soak's (other engineers' tests share the
    machine), between two calls: the machine's busy time less the soak's processes'."""

    _last: tuple[float, int, int] | None = None

    def cores(self, ours: list[int]) -> float | None:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        busy = sum(fields) - fields[3] - fields[4]  # not idle, not iowait
        mine = 0
        for pid in ours:
            try:
                _, utime, stime, _ = harness.proc_stat(pid)
            except (OSError, ValueError, IndexError):
                continue
            mine += utime + stime
        now = (time.monotonic(), busy, mine)
        last, self._last = self._last, now
        if last is None or now[0] <= last[0]:
            return None
        ticks = os.sysconf("SC_CLK_TCK") * (now[0] - last[0])
        return max(0.0, ((busy - last[1]) - (mine - last[2])) / ticks)


def window(
    samples: list[Sample], low: float, high: float, value: Callable[[Sample], int | None]
) -> tuple[int | None, int | None]:
    """(median, minimum) of ``value`` over the samples taken from ``low`` to ``high`` seconds."""
    values = [v for s in samples if low <= s.seconds <= high and (v := value(s)) is not None]
    return (int(statistics.median(values)), min(values)) if values else (None, None)


def growth(before: int | None, after: int | None) -> float | None:
    return (after - before) / before * 100 if before and after else None


def memory(
    samples: list[Sample], start: Sample, after: Sample, at: float, half: float
) -> dict[str, dict[str, Any]]:
    """RSS figures of the server and of its workers: at the start (before the load); the median
    and the floor (minimum) of the samples ``at`` +- ``half`` seconds and of the last 2 * ``half``
    seconds of load; after the clients left; the peak. ``growth_percent`` compares the floors:
    the silent readers' backlogs (up to 64 MiB a stream, by design) swing single samples and
    even 20 s medians by 20%, while what a leak would keep raises the floor too."""
    end_at = samples[-1].seconds
    figures = {}
    values: list[tuple[str, Callable[[Sample], int | None]]] = [
        ("server", lambda s: s.rss_kib),
        ("workers", lambda s: s.workers_rss_kib),
    ]
    for what, value in values:
        base, base_floor = window(samples, at - half, at + half, value)
        end, end_floor = window(samples, end_at - 2 * half, end_at, value)
        figures[what] = {
            "start_kib": value(start),
            "baseline_kib": base,
            "baseline_floor_kib": base_floor,
            "end_kib": end,
            "end_floor_kib": end_floor,
            "after_clients_left_kib": value(after),
            "peak_kib": max(value(s) or 0 for s in samples),
            "growth_percent": growth(base_floor, end_floor),
            "median_growth_percent": growth(base, end),
        }
    return figures
