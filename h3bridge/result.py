"""What a finished generation hands back, whichever engine produced it."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .request import GenerationRequest
from .geometry import FPS, SAMPLE_RATE


@dataclass
class GenerationResult:
    request: GenerationRequest
    video_path: Path | None          # the MP4 (None when the caller asked for no MP4)
    frames: np.ndarray | None        # uint8 [F, H, W, 3], None when not requested
    audio: np.ndarray | None         # float32 [channels, samples] at `sample_rate`, None when not requested
    width: int
    height: int
    frame_count: int
    seed: int
    fps: int = FPS
    sample_rate: int = SAMPLE_RATE
    timings: dict[str, float] = field(default_factory=dict)   # seconds per upstream phase, plus "total"
    command: list[str] = field(default_factory=list)          # the exact argv (one-shot) or session commands
    engine_log: str = ""                                       # the engine's full stderr for this job
    # The upstream H3_* variables the engine ran with (engine.engine_variables): they can change the clip.
    engine_variables: dict[str, str] = field(default_factory=dict)
