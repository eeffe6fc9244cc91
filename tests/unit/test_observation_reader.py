"""ObservationReader: the records of the inferences the core ran while Python observes them reach
the telemetry in order, on the loop, and dropped ones are told (never more than once a window)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from types import SimpleNamespace
from typing import Any

import structlog

from inferd.transport.core_server import ObservationReader


class FakeQueue:
    """The core's ObservationQueue as the reader uses it: a readable fd while records wait."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)  # as the core's eventfd (EFD_NONBLOCK)
        self.waiting: list[Any] = []
        self.drops = 0

    def push(self, *records: Any) -> None:
        self.waiting.extend(records)
        os.write(self._write, b"x")

    def fileno(self) -> int:
        return self._read

    def drain(self) -> list[Any]:
        with contextlib.suppress(BlockingIOError):  # not signalled: nothing waits
            os.read(self._read, 4096)
        out, self.waiting = self.waiting, []
        return out

    def dropped(self) -> int:
        return self.drops


class Recorder:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def observed(self, record: Any) -> None:
        if record.model == "broken":
            raise RuntimeError("a telemetry bug")
        self.seen.append(record.id)


def record(model: str, request_id: str) -> Any:
    return SimpleNamespace(model=model, id=request_id)


def test_records_reach_the_telemetry_in_order_and_drops_are_told_once_a_window() -> None:
    async def run() -> tuple[Recorder, list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        queue, telemetry = FakeQueue(), Recorder()
        with structlog.testing.capture_logs() as logs:
            reader = ObservationReader(queue, telemetry, loop, drops_every_s=3600)  # type: ignore[arg-type]
            queue.push(record("m", "a"), record("broken", "b"), record("m", "c"))
            await asyncio.sleep(0.05)  # the loop's reader runs
            queue.drops = 5
            queue.push(record("m", "d"))
            await asyncio.sleep(0.05)
            queue.drops = 9  # within the window: not told yet
            queue.push(record("m", "e"))
            await asyncio.sleep(0.05)
            queue.push(record("m", "f"))  # drained by close, not by the loop
            reader.close()
        return telemetry, logs

    telemetry, logs = asyncio.run(run())
    assert telemetry.seen == ["a", "c", "d", "e", "f"]  # the broken one did not stop the others
    [failed] = [r for r in logs if r["event"] == "cannot report an observed inference"]
    assert failed["model"] == "broken" and failed["log_level"] == "error"
    told = [r for r in logs if r["event"].startswith("observed inferences dropped")]
    assert [(r["dropped"], r["dropped_since_start"], r["log_level"]) for r in told] == [
        (5, 5, "warning")
    ]


def test_drops_are_told_again_once_the_window_has_passed() -> None:
    async def run() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        queue = FakeQueue()
        with structlog.testing.capture_logs() as logs:
            reader = ObservationReader(queue, Recorder(), loop, drops_every_s=0)  # type: ignore[arg-type]
            for drops in (2, 2, 7):
                queue.drops = drops
                queue.push(record("m", "x"))
                await asyncio.sleep(0.05)
            reader.close()
        return logs

    told = [r for r in asyncio.run(run()) if r["event"].startswith("observed inferences dropped")]
    assert [(r["dropped"], r["dropped_since_start"]) for r in told] == [(2, 2), (5, 7)]
