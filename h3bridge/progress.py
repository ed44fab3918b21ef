"""Typed progress events and denoise previews, shared by every engine and the CLI/ComfyUI progress bars."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

if TYPE_CHECKING:
    import numpy as np

# Shown while a job waits for the machine-wide engine lock.
WAITING_PHASE = "waiting for the engine"
# Shown while the caller paused the job (cancel.PauseControl): the engine's process group is
# stopped; `done`/`total`/`fraction` stay those of the last report, `detail` says in which phase.
# The job's last real event comes again on resume.
PAUSED_PHASE = "paused"


@dataclass(frozen=True)
class ProgressEvent:
    phase: str          # upstream phase name, e.g. "denoise", or WAITING_PHASE / PAUSED_PHASE
    done: int
    total: int
    # Overall job fraction 0..1, phase-weighted: by this engine's past runs of the shape on this
    # machine when there are some (history/eta.py), else by upstream's costs (upstream_costs.py).
    fraction: float
    elapsed: float      # seconds since the job started
    # Seconds left, estimated from past runs of the same shape on this machine (history/eta.py);
    # None when there are none (the upstream cost model's seconds are another machine's).
    eta: float | None = None
    # WAITING_PHASE: who holds the engine (engines/lock.py describe_engine_holder); PAUSED_PHASE: where it paused
    detail: str | None = None


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass(frozen=True)
class PreviewFrame:
    """One representative frame of the denoised estimate after an Euler step (h3.h `h3_frame`
    with `denoise_step` >= 0), at the output canvas."""

    step: int               # 0-based Euler step just finished
    total_steps: int
    frame_index: int        # which frame of the clip the preview shows
    image: "np.ndarray"     # uint8 [H, W, 3], RGB


PreviewCallback = Callable[[PreviewFrame], None]


# ----------------------------------------------------------------------------- parsing h3's stderr

# main.c cli_progress: fprintf(stderr, "\r%-25s %4d/%-4d", phase, completed, total). The phase is
# left-justified in 25 columns, `done` right-justified in 4, `total` left-justified in 4.
_PROGRESS = re.compile(r"^(?P<phase>\S.*?) +(?P<done>\d+)/(?P<total>\d+)(?P<pad> *)$")


def parse_progress(text: str) -> tuple[str, int, int] | None:
    """(phase, done, total) for one `\\r`/`\\n`-delimited piece of h3's stderr, else None.

    `h3: ...` message lines are never progress.
    """
    if text.startswith("h3:") or text.startswith("h3 profile:"):
        return None
    match = _PROGRESS.match(text)
    if not match:
        return None
    return match["phase"], int(match["done"]), int(match["total"])


def is_complete_progress(text: str) -> bool:
    """True when an unterminated piece is a whole progress record, not a torn read.

    `%-4d` pads the total to at least 4 columns, so a piece whose total field is
    shorter than that may still be growing.
    """
    match = _PROGRESS.match(text)
    return bool(match) and len(match["total"]) + len(match["pad"]) >= 4


# Upstream's phases in h3.c h3_generate order. A job's weights are the seconds the upstream cost
# model (h3bridge/upstream_costs.py, the one table h3-sim's time model also sleeps by) expects
# each phase to take for that job (engine.expected_phases), so the overall fraction follows
# elapsed time. "denoise enqueue" and "denoise" share one cost, the sampling loop's: which of the
# two reports the loop depends on the sampler h3 picks (GPU on an M5 device, or as
# H3_GPU_SAMPLER/H3_CPU_SAMPLER say), which only h3 knows, so ProgressTracker learns it from the
# first of the two it sees.
PHASE_ORDER: tuple[str, ...] = (
    "tokenizer", "audio VAE encoder", "video VAE encoder", "Qwen vision", "text encoder",
    "refine text", "precompute AdaLN", "load transformer core", "preview VAE load",
    "denoise enqueue", "denoise", "audio VAE", "video VAE load", "FFmpeg")
DENOISE_LOOP_PHASES = ("denoise enqueue", "denoise")


class ProgressTracker:
    """Turns (phase, done, total) records into ProgressEvents and per-phase timings.

    `phases` are the phases this job is expected to run, in upstream order, each with its
    weight (expected seconds; a plain sequence weighs them equally); a phase
    that never shows up counts as done once a later phase starts. The denoise loop is
    weighed once: under "denoise enqueue" when h3 takes the GPU sampler (it reports that
    first, then one final "denoise"), under "denoise" otherwise. The overall fraction never
    goes backwards (reference encoders interleave per reference).
    """

    def __init__(self, phases: Mapping[str, float] | Sequence[str], started: float) -> None:
        self.phases = [p for p in PHASE_ORDER if p in phases]
        self.weights = {p: float(phases[p]) if isinstance(phases, Mapping) else 1.0 for p in self.phases}
        self.started = started
        self.timings: dict[str, float] = {}
        self._last: tuple[str, int, int] | None = None
        self._phase: str | None = None
        self._phase_started = started
        self._fraction = 0.0
        # Which of DENOISE_LOOP_PHASES reports the loop; "denoise" until "denoise enqueue" shows.
        self._loop_phase = "denoise"
        self.total_weight = sum(self._weight(p) for p in self.phases) or 1.0

    def _weight(self, phase: str) -> float:
        """The phase's share; of the two loop phases only the one reporting the loop has one."""
        expected_loop_phases = [p for p in DENOISE_LOOP_PHASES if p in self.phases]
        if phase in DENOISE_LOOP_PHASES and len(expected_loop_phases) > 1 and phase != self._loop_phase:
            return 0.0
        return self.weights[phase]

    def update(self, phase: str, done: int, total: int, now: float) -> ProgressEvent | None:
        """Record one progress record; None when it repeats the previous one."""
        record = (phase, done, total)
        if record == self._last:
            return None
        self._last = record
        if phase != self._phase:
            self._close_phase(now)
            self._phase, self._phase_started = phase, now
        if phase == "denoise enqueue" and phase in self.phases:
            self._loop_phase = phase        # the GPU sampler: the loop is reported as enqueue
        if phase in self.phases:
            index = self.phases.index(phase)
            before = sum(self._weight(p) for p in self.phases[:index])
            within = self._weight(phase) * (min(done, total) / total if total > 0 else 1.0)
            self._fraction = max(self._fraction, min(1.0, (before + within) / self.total_weight))
        return ProgressEvent(phase=phase, done=done, total=total, fraction=self._fraction,
                             elapsed=now - self.started)

    def feed(self, text: str, complete: bool, now: float) -> ProgressEvent | None:
        """One `\r`/`\n`-delimited piece of h3's stderr (engine_process.StderrPiece): the event it
        makes, or None when it is not a progress record, repeats the last one, or is a torn read
        (an unterminated tail that may still grow)."""
        record = parse_progress(text)
        if record is None or not (complete or is_complete_progress(text)):
            return None
        return self.update(*record, now=now)

    def remaining_weight(self) -> float:
        """The weight (expected seconds, when the weights are seconds) not yet done."""
        return max(0.0, self.total_weight * (1.0 - self._fraction))

    def finish(self, now: float) -> dict[str, float]:
        """Close the running phase; return seconds per phase plus "total"."""
        self._close_phase(now)
        self._phase = None
        self.timings["total"] = now - self.started
        return dict(self.timings)

    def _close_phase(self, now: float) -> None:
        if self._phase is not None:
            self.timings[self._phase] = self.timings.get(self._phase, 0.0) + (now - self._phase_started)
