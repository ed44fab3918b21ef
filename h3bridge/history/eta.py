"""Time left for a job, and how much of it is done, from past runs of the same shape on this machine.

Every engine reports an overall fraction weighed by the upstream cost model (upstream_costs.py):
seconds on the reference Mac, right in proportion for h3 there, but not for another engine (h3-sim
spends its time starting Python and encoding with FFmpeg, not denoising) nor for another
machine. Past runs here give this engine's own seconds per phase, the time before its first
progress record and after its last; a ProgressTracker (progress.py) weighed by them turns the
same progress records into the seconds still to go and the fraction done, which then replace the
engine's (history/recorder.py). Without past runs there is no estimate (`ProgressEvent.eta`
stays None, the fraction the engine's) rather than a guess in another Mac's seconds.
"""
from __future__ import annotations

from typing import Mapping

from ..progress import WAITING_PHASE, ProgressEvent, ProgressTracker


class EtaEstimator:
    """Feed it a job's ProgressEvents; it says the seconds left (None while waiting for the
    engine, whose length no history knows, and always None without `expected` seconds).

    expected: seconds per upstream phase (stats.expected_phase_seconds);
    finishing: seconds after the last phase (stats.FINISHING: publishing, reading back);
    starting: seconds before the first phase (stats.expected_starting_seconds: the engine
    starting), already behind when the first progress record comes."""

    def __init__(self, expected: Mapping[str, float], started: float, *, finishing: float = 0.0,
                 starting: float = 0.0) -> None:
        self.tracker = ProgressTracker(expected, started)
        self.available = bool(self.tracker.phases)
        self.finishing = finishing
        self.starting = starting

    def estimate(self, event: ProgressEvent, now: float) -> float | None:
        self.tracker.update(event.phase, event.done, event.total, now)
        if not self.available or event.phase == WAITING_PHASE:
            return None
        return self.tracker.remaining_weight() + self.finishing

    def fraction(self) -> float | None:
        """The job's overall fraction done in past runs' seconds (starting, the phases, finishing),
        as of the last event `estimate` was given; None without past runs."""
        if not self.available:
            return None
        phases = self.tracker.total_weight
        whole = self.starting + phases + self.finishing
        if whole <= 0:
            return None
        return min(1.0, (self.starting + phases - self.tracker.remaining_weight()) / whole)


def format_eta(seconds: float) -> str:
    """`ETA 1:05`, `ETA 1:02:03`: the same for the CLI's bars and the ComfyUI node."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"ETA {hours}:{minutes:02d}:{secs:02d}" if hours else f"ETA {minutes}:{secs:02d}"


def eta_suffix(event: ProgressEvent) -> str:
    """`, ETA 1:05` for an event with an estimate, else nothing."""
    return "" if event.eta is None else f", {format_eta(event.eta)}"


__all__ = ["EtaEstimator", "format_eta", "eta_suffix"]
