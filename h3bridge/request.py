"""The generation request: every h3 option as a typed field, and its validation.

Limits mirror upstream h3.c at 8974cc0 (h3.h, h3_host.h, h3.c `h3_valid_params`,
main.c); messages are written for a user and name the nearest valid value.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from pathlib import Path

# h3.h / h3_host.h constants.
FPS = 24
SAMPLE_RATE = 32000
CANVAS_MULTIPLE = 32
MAX_PIXELS = 768 * 1344
MIN_FRAMES = 22          # h3.c: "generation requires at least one trained 22-frame decoder chunk"
MAX_FRAMES = 362         # h3.c: "frames must align within the released 5..362 range"
MAX_STEPS = 1000
MIN_LAYERS, MAX_LAYERS = 35, 50
DEFAULT_WIDTH, DEFAULT_HEIGHT, DEFAULT_FRAMES, DEFAULT_STEPS, DEFAULT_SEED = 864, 480, 56, 20, 42


def align_frame_count(requested: int) -> int:
    """Upstream `h3_align_frame_count`: round up to the next 5 + 17n (minimum 5)."""
    value = max(requested, 5)
    remainder = (value - 5) % 17
    return value if remainder == 0 else value + 17 - remainder


def frames_from_seconds(seconds: float) -> int:
    """main.c `frames_from_seconds`: llround(seconds * 24) (half away from zero)."""
    scaled = seconds * FPS
    return int(scaled + 0.5) if scaled >= 0 else -int(-scaled + 0.5)


class ReferenceKind(str, enum.Enum):
    """The five ways main.c appends a Ref2VA reference, in its flag names."""

    IMAGE = "image"                 # --ref-image PATH
    VIDEO = "video"                 # --ref-video PATH (with its embedded soundtrack)
    SILENT_VIDEO = "silent_video"   # --ref-silent-video PATH
    VIDEO_AUDIO = "video_audio"     # --ref-video-audio VIDEO AUDIO
    AUDIO = "audio"                 # --ref-audio PATH


@dataclass(frozen=True)
class Reference:
    kind: ReferenceKind
    path: Path
    audio_path: Path | None = None  # only for VIDEO_AUDIO


class ReferenceImageSize(str, enum.Enum):
    MATCH = "match"
    MAX = "max"


class SlowerPath(str, enum.Enum):
    """The `--use-slower-*` close-reference kernels (main.c), value = flag suffix."""

    BF16_MLP = "bf16-mlp"
    BF16_QKV = "bf16-qkv"
    BF16_ATTENTION_OUTPUT = "bf16-attention-output"
    ROW_MAJOR_ATTENTION_OUTPUT = "row-major-attention-output"
    UNFUSED_INT8_INPUTS = "unfused-int8-inputs"
    UNFUSED_QKV_ROPE = "unfused-qkv-rope"
    SCALAR_QKV_RMS = "scalar-qkv-rms"
    UNCACHED_INT8_SCALES = "uncached-int8-scales"
    DYNAMIC_FC1_K = "dynamic-fc1-k"
    GROUPED_QUANTIZER = "grouped-quantizer"


@dataclass(frozen=True)
class Preset:
    steps: int
    layers: int
    reuse: int


PRESETS: dict[str, Preset] = {
    "preview": Preset(steps=4, layers=50, reuse=1),
    "balanced": Preset(steps=20, layers=45, reuse=2),
    "quality": Preset(steps=20, layers=50, reuse=1),
    "reference": Preset(steps=50, layers=50, reuse=1),
}


@dataclass(frozen=True)
class GenerationRequest:
    """One clip. Defaults are upstream's (`H3_PARAMS_DEFAULT`, main.c)."""

    prompt: str
    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT
    # At most one of frames/seconds; neither means upstream's 56 frames.
    frames: int | None = None
    seconds: float | None = None
    steps: int = DEFAULT_STEPS
    seed: int = DEFAULT_SEED
    reuse: int = 1
    layers: int = MAX_LAYERS
    core_reuse: int = 1
    token_reduction: bool = False
    ssd_streaming: bool = False
    int8_row_fc2: bool = False
    reference_rope: bool = False
    render_width: int | None = None
    render_height: int | None = None
    first_frame: Path | None = None
    last_frame: Path | None = None
    references: tuple[Reference, ...] = ()
    reference_image_size: ReferenceImageSize = ReferenceImageSize.MATCH
    slower_paths: frozenset[SlowerPath] = field(default_factory=frozenset)

    @classmethod
    def from_preset(cls, preset: str, prompt: str, **overrides: object) -> "GenerationRequest":
        try:
            chosen = PRESETS[preset]
        except KeyError:
            from .errors import RequestError
            raise RequestError(f"unknown preset {preset!r}", field="preset",
                               hint=f"use one of: {', '.join(PRESETS)}") from None
        values: dict[str, object] = {"steps": chosen.steps, "layers": chosen.layers, "reuse": chosen.reuse}
        values.update(overrides)
        return cls(prompt=prompt, **values)  # type: ignore[arg-type]

    def with_changes(self, **changes: object) -> "GenerationRequest":
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def requested_frames(self) -> int:
        if self.seconds is not None:
            return frames_from_seconds(self.seconds)
        return DEFAULT_FRAMES if self.frames is None else self.frames

    @property
    def frame_count(self) -> int:
        """Frames the engine will actually produce."""
        return align_frame_count(self.requested_frames)
