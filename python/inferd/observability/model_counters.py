"""What the metrics read of each loaded version at scrape time: its core statistics and queue
depth, and an ensemble's steps' (``server.py`` builds them, ``core_metrics.py`` writes them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd._core import EnsembleStepStatistics, StatisticsSnapshot


@dataclass(frozen=True)
class EnsembleStepCounters:
    """One step of an ensemble version: its index in the config's steps, the composing model
    it runs, and its core statistics (``EnsembleScheduler.step_statistics``)."""

    step: int
    model: str
    statistics: EnsembleStepStatistics


@dataclass(frozen=True)
class ModelCounters:
    """One loaded version's core statistics, as ``ModelScheduler.statistics`` gives them, and
    its queue depth; an ensemble's version also has its steps'."""

    name: str
    version: str
    statistics: StatisticsSnapshot
    pending: int
    steps: tuple[EnsembleStepCounters, ...] = ()
    # A stateful model's sequences: (active, in the backlog, ended for being idle so far).
    sequences: tuple[int, int, int] | None = None
