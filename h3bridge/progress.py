"""Typed progress events, shared by every engine and the CLI/ComfyUI progress bars."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Shown while a job waits for the machine-wide engine lock.
WAITING_PHASE = "waiting for the engine"


@dataclass(frozen=True)
class ProgressEvent:
    phase: str          # upstream phase name, e.g. "denoise", or WAITING_PHASE
    done: int
    total: int
    fraction: float     # overall job fraction 0..1, phase-weighted
    elapsed: float      # seconds since the job started


ProgressCallback = Callable[[ProgressEvent], None]
