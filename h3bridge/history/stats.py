"""Phase timings over past jobs: per device and shape, the median and the range of each phase.

Only completed jobs count (a failed or cancelled job's last phase was cut short). A job's
"total" is its run time: the whole generate call less the time it waited for the engine.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..progress import DENOISE_LOOP_PHASES, PHASE_ORDER
from .job import Device
from .store import COMPLETED, JobRow

TOTAL = "total"
# Not an upstream phase: from the engine's last progress record to `generate` returning (the
# MP4 published, frames and audio read back). The recorder adds it to completed jobs.
FINISHING = "finishing"


@dataclass(frozen=True)
class Spread:
    """Seconds over `runs` jobs."""

    runs: int
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        return cls(runs=len(values), median=float(statistics.median(values)), low=float(min(values)),
                   high=float(max(values)))


@dataclass
class ShapeStats:
    device: Device
    shape: str
    runs: int
    phases: dict[str, Spread] = field(default_factory=dict)   # upstream order, then others as first seen
    total: Spread | None = None

    def as_json(self) -> dict[str, object]:
        return {"device": self.device.name, "memory_bytes": self.device.memory_bytes, "shape": self.shape,
                "runs": self.runs, "phases": {p: vars(s) for p, s in self.phases.items()},
                "total": None if self.total is None else vars(self.total)}


def run_seconds(row: JobRow) -> float | None:
    if row.total_seconds is None:
        return None
    return max(0.0, row.total_seconds - (row.waited_seconds or 0.0))


def phase_spreads(rows: Iterable[JobRow]) -> dict[str, Spread]:
    """Each phase's spread over the jobs that ran it."""
    seconds: dict[str, list[float]] = {}
    for row in rows:
        for phase, value in row.phases.items():
            seconds.setdefault(phase, []).append(value)
    ordered = [p for p in PHASE_ORDER if p in seconds] + [p for p in seconds if p not in PHASE_ORDER]
    return {phase: Spread.of(seconds[phase]) for phase in ordered}


def shape_stats(rows: Iterable[JobRow]) -> list[ShapeStats]:
    """Completed jobs grouped by device (name and memory) and shape, most runs first."""
    groups: dict[tuple[str, int | None, str], list[JobRow]] = {}
    for row in rows:
        if row.outcome == COMPLETED:
            groups.setdefault((row.device.name, row.device.memory_bytes, row.shape), []).append(row)
    result = []
    for (name, memory, shape), members in groups.items():
        totals = [t for t in (run_seconds(row) for row in members) if t is not None]
        result.append(ShapeStats(device=Device(name, memory), shape=shape, runs=len(members),
                                 phases=phase_spreads(members), total=Spread.of(totals) if totals else None))
    result.sort(key=lambda s: (s.device.name, -(s.device.memory_bytes or 0), -s.runs, s.shape))
    return result


def expected_phase_seconds(rows: Sequence[JobRow]) -> dict[str, float]:
    """ProgressTracker weights from past jobs: each upstream phase's median seconds.

    The sampling loop is weighed once, under the phase that reported it: with the GPU sampler
    "denoise enqueue" reports the loop and a last "denoise" record follows it (progress.py), so
    both are weighed as one "denoise enqueue"."""
    medians = {phase: spread.median for phase, spread in phase_spreads(rows).items() if phase in PHASE_ORDER}
    enqueue, loop = DENOISE_LOOP_PHASES
    if enqueue in medians and loop in medians:
        medians[enqueue] += medians.pop(loop)
    return medians


def expected_starting_seconds(rows: Sequence[JobRow]) -> float:
    """The median time past jobs took before the engine's first progress record (starting the
    engine process and what it does before it reports anything): each run less its phases and
    its finishing (0 without any)."""
    values = [max(0.0, run - sum(row.phases.values())) for row in rows
              if row.phases and (run := run_seconds(row)) is not None]
    return float(statistics.median(values)) if values else 0.0


def expected_finishing_seconds(rows: Sequence[JobRow]) -> float:
    """The median FINISHING time of past jobs (0 without any)."""
    values = [row.phases[FINISHING] for row in rows if FINISHING in row.phases]
    return float(statistics.median(values)) if values else 0.0


__all__ = ["Spread", "ShapeStats", "shape_stats", "phase_spreads", "expected_phase_seconds", "run_seconds", "TOTAL",
           "FINISHING", "expected_finishing_seconds", "expected_starting_seconds"]
