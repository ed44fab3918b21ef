"""The generation request: every h3 option as a typed field, and its validation.

Limits mirror upstream h3.c at 8974cc0 (h3.h, h3_host.h, h3.c `h3_valid_params`,
main.c); messages are written for a user and name the nearest valid value.
"""
from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Sequence

from .errors import RequestError, shown_value
from .fixes import Change, Fix, changes, given, literal
from .geometry import (
    CANVAS_MULTIPLE,
    FPS,
    MAX_FRAMES,
    MAX_PIXELS,
    MIN_FRAMES,
    SAMPLE_RATE,
    align_frame_count,
    frames_from_seconds,
    canvas_for,
    largest_canvas_like,
    legal_frame_counts,
    reference_video_frames,
)

MAX_STEPS = 1000
MIN_LAYERS, MAX_LAYERS = 35, 50
MIN_STEPS = 2                 # h3.c h3_valid_params: "denoising steps must be in [2, 1000]"
MAX_REUSE = 3                 # h3.c h3_valid_params: "denoise reuse must be in [1, 3]"
MAX_CORE_REUSE = 6            # h3.c h3_valid_params: "core reuse must be in [1, 6]"
MAX_SEED = 2**64 - 1          # main.c parse_u64: the seed is a uint64_t
# Ref2VA limits: main.c append_reference (12, parse time) and h3.c h3_valid_params (9/3/3).
MAX_REFERENCES, MAX_REFERENCE_IMAGES, MAX_REFERENCE_VIDEOS, MAX_REFERENCE_AUDIO = 12, 9, 3, 3
# Reference audio (h3.c h3_generate reference loop, h3_ffmpeg.c h3_ffmpeg_read_audio_f32):
MIN_AUDIO_SAMPLES = SAMPLE_RATE * 2      # "reference audio requires at least 2 seconds at 32 kHz"
MAX_AUDIO_SAMPLES = SAMPLE_RATE * 15     # "... exceeds 15 seconds in total" / the per-file cap
MIN_SOUNDTRACK_FRAMES = 56               # "video soundtrack N requires at least 2 seconds; request at least 56 output frames"
MIN_REFERENCE_VIDEO_FRAMES = 5           # h3_ffmpeg.c: "reference videos require at least 5 decoded frames"
DEFAULT_WIDTH, DEFAULT_HEIGHT, DEFAULT_FRAMES, DEFAULT_STEPS, DEFAULT_SEED = 864, 480, 56, 20, 42
# The longest prompt h3 is sure to take, in UTF-8 bytes. h3's Qwen text encoder refuses more than
# UINT32_MAX // TEXT_INTERMEDIATE = (2**32 - 1) // 25600 = 167,772 tokens (h3_text_encoder.c
# text_encode_bf16_impl: "invalid Qwen text encoder arguments", after the model has loaded), and
# its byte-level BPE tokenizer (h3_tokenizer.m h3_tokenizer_encode) makes at most one token per
# byte, so no prompt of at most this many bytes can reach that limit.
QWEN_TEXT_INTERMEDIATE = 25600
MAX_PROMPT_BYTES = (2**32 - 1) // QWEN_TEXT_INTERMEDIATE


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
    # A model with a step-distillation LoRA folded in (`h3bridge lora fold`, h3.c PR #14): 5-6 steps,
    # no --reuse/--core-reuse (core_reuse stays at its default 1), every layer.
    "turbo": Preset(steps=6, layers=50, reuse=1),
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
        chosen = PRESETS.get(preset) if isinstance(preset, str) else None
        if chosen is None:
            raise RequestError(f"unknown preset {shown_value(preset)}", field="preset",
                               hint=f"use one of: {', '.join(PRESETS)}")
        _require_field_names(overrides, prompt=False)
        values: dict[str, object] = {"steps": chosen.steps, "layers": chosen.layers, "reuse": chosen.reuse}
        values.update(overrides)
        return cls(prompt=prompt, **values)  # type: ignore[arg-type]

    def with_changes(self, **changes: object) -> "GenerationRequest":
        _require_field_names(changes)
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

    @property
    def is_ref2va(self) -> bool:
        return bool(self.references)

    def validate(self, *, check_files: bool = True,
                 reference_names: "Sequence[str] | None" = None) -> "GenerationRequest":
        """Check every upstream rule before any engine starts; return self.

        Raises RequestError(field=...) naming the bad value and the nearest valid
        one. With `check_files`, anchors and references must exist, be readable
        media of the right kind, and reference audio durations (read with PyAV)
        must fit upstream's limits. `reference_names`: what the caller's user calls each
        reference, in order (a storyboard's tail shot, a ComfyUI kind); by default
        `reference 1 (image)`.
        """
        _validate_values(self, reference_names)
        if check_files:
            _validate_files(self, reference_names)
        return self


# ----------------------------------------------------------------------------- validation

def _require_field_names(values: dict[str, object], *, prompt: bool = True) -> None:
    """Settings given by name (from_preset's overrides, with_changes) must be the request's fields
    (from_preset takes the prompt as its own argument)."""
    known = [f.name for f in fields(GenerationRequest) if prompt or f.name != "prompt"]
    for name in values:
        if name not in known:
            settable = ", ".join(known)
            raise RequestError(f"{shown_value(name)} is not a setting of a GenerationRequest", field=name,
                               hint=f"the settings are: {settable}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(value: object, name: str) -> int:
    if not _is_int(value):
        raise RequestError(Fix("{} must be a whole number", (given(name, shown_value(value)),)), field=name)
    return value  # type: ignore[return-value]


def _require_range(value: object, name: str, low: int, high: int, meaning: str) -> None:
    number = _require_int(value, name)
    if not low <= number <= high:
        nearest = low if number < low else high
        raise RequestError(Fix(f"{{}} is out of range: {meaning} must be in [{low}, {high}]; "
                               f"the nearest valid value is {nearest}", (given(name, shown_value(number)),)), field=name,
                           hint=Fix("use {}", ((Change(name, nearest),),)))


def _multiples_around(value: int, multiple: int, low: int, high: int) -> list[int]:
    below = min(high, max(low, (value // multiple) * multiple))
    above = min(high, max(low, -(-value // multiple) * multiple))
    return sorted({below, above})


def _finite(number: int | float) -> bool:
    """math.isfinite, for any int too (a huge int overflows a float rather than being infinite)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _validate_frames(request: GenerationRequest) -> None:
    if request.frames is not None and request.seconds is not None:
        # main.c: "--seconds and --frames are mutually exclusive" (exit 2)
        raise RequestError(Fix("{} and {} are mutually exclusive; set only one of them", (given("frames"), given("seconds"))),
                           field="seconds", hint=Fix("drop {}, or drop {}", (given("seconds"), given("frames"))))
    legal = legal_frame_counts()
    if request.seconds is not None:
        seconds = request.seconds
        # main.c frames_from_seconds: finite, > 0, llround(seconds * 24) >= 1.
        if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                or seconds != seconds or seconds <= 0):
            raise RequestError(Fix("{} must be a positive number of seconds", (given("seconds", shown_value(seconds)),)),
                               field="seconds", hint=Fix(f"e.g. {{}} ({legal[2]} frames)", (given("seconds", f"{legal[2] / FPS:g}"),)))
        if not _finite(seconds) or seconds > 2 * MAX_FRAMES / FPS:
            shown = f"{float(seconds):g}" if isinstance(seconds, float) or _finite(seconds) else shown_value(seconds)
            raise RequestError(Fix(f"{{}} is far longer than h3's longest clip of {MAX_FRAMES} frames "
                                   f"({MAX_FRAMES / FPS:.3f} s)", (given("seconds", shown),)), field="seconds",
                               hint=Fix(f"use {{}} up to {MAX_FRAMES / FPS:.3f} or {{}}",
                                        (given("seconds"), changes(frames=MAX_FRAMES))))
        aligned = align_frame_count(frames_from_seconds(seconds))
        if aligned < MIN_FRAMES:
            raise RequestError(Fix(f"{{}} is {frames_from_seconds(seconds)} frames, shorter than "
                                   f"h3's shortest clip of {MIN_FRAMES} frames ({MIN_FRAMES / FPS:.3f} s); "
                                   f"the nearest valid duration is {MIN_FRAMES / FPS:.3f} s", (given("seconds", f"{seconds:g}"),)),
                               field="seconds", hint=Fix(f"use {{}} of at least {MIN_FRAMES / FPS:.3f} or {{}}",
                                                         (given("seconds"), changes(frames=MIN_FRAMES))))
        if aligned > MAX_FRAMES:
            raise RequestError(Fix(f"{{}} is {frames_from_seconds(seconds)} frames, longer than "
                                   f"h3's longest clip of {MAX_FRAMES} frames ({MAX_FRAMES / FPS:.3f} s); "
                                   f"the nearest valid duration is {MAX_FRAMES / FPS:.3f} s", (given("seconds", f"{seconds:g}"),)),
                               field="seconds", hint=Fix(f"use {{}} up to {MAX_FRAMES / FPS:.3f} or {{}}",
                                                         (given("seconds"), changes(frames=MAX_FRAMES))))
        return
    if request.frames is None:
        return
    frames = _require_int(request.frames, "frames")
    # h3.c h3_valid_params: frames < 5 or aligned > 362 fails; h3_generate: aligned < 22 fails.
    # Upstream silently rounds other values up to 5 + 17n; we ask for a legal length instead so
    # the clip is the length the caller asked for (align_frame_count gives upstream's rounding).
    if frames < MIN_FRAMES:
        raise RequestError(Fix(f"{{}} is shorter than h3's shortest clip; the shortest legal length is {MIN_FRAMES} "
                               f"(legal lengths are 5 + 17n from {MIN_FRAMES} to {MAX_FRAMES})",
                               (given("frames", shown_value(frames)),)),
                           field="frames", hint=Fix("use {}", (changes(frames=MIN_FRAMES),)))
    if frames > MAX_FRAMES:
        raise RequestError(Fix(f"{{}} is longer than h3's longest clip; the longest legal length is {MAX_FRAMES} "
                               f"(legal lengths are 5 + 17n from {MIN_FRAMES} to {MAX_FRAMES})",
                               (given("frames", shown_value(frames)),)),
                           field="frames", hint=Fix("use {}", (changes(frames=MAX_FRAMES),)))
    if frames not in legal:
        below = max(n for n in legal if n < frames)
        above = min(n for n in legal if n > frames)
        raise RequestError(Fix(f"{{}} is not a legal H3 length; the next legal lengths are {below} and {above}",
                               (given("frames", frames),)), field="frames",
                           hint=Fix(f"use {{}} or {{}} (legal lengths are 5 + 17n, {MIN_FRAMES}..{MAX_FRAMES})",
                                    (changes(frames=below), changes(frames=above))))


def _canvas_side_error(name: str, value: int, other: int) -> RequestError:
    """A side that is not a multiple of 32: the multiples around it, and the whole canvas to use
    instead, which must also pass the pixel limit and keep the requested aspect (canvas_for):
    1920x1080's nearest heights make 1920x1056 and 1920x1088, both over the limit, so the fix is
    1344x768, not a 1920x512 strip."""
    width, height = (value, other) if name == "width" else (other, value)
    other_name = "height" if name == "width" else "width"
    options = _multiples_around(value, CANVAS_MULTIPLE, CANVAS_MULTIPLE, max(CANVAS_MULTIPLE, value + CANVAS_MULTIPLE))
    shown = [shown_value(option) for option in options]
    nearest = (f"the nearest valid {name} is {shown[0]}" if len(options) == 1 else
               f"the nearest valid {name}s are {shown[0]} and {shown[1]}")
    fit_w, fit_h = canvas_for(width, height)
    other_kept = (fit_h if name == "width" else fit_w) == other
    if other_kept and (fit_w if name == "width" else fit_h) in options:
        why = f"of the canvases they make, {fit_w}x{fit_h} is closest to {shown_value(width)}x{shown_value(height)}'s aspect"
    elif all(option * max(other, CANVAS_MULTIPLE) > MAX_PIXELS for option in options):
        why = (f"beside {{}} they are over h3's 768*1344 ({MAX_PIXELS}) pixel limit; "
               f"the valid canvas of about {shown_value(width)}x{shown_value(height)}'s aspect within it is "
               f"{fit_w}x{fit_h}")
    else:
        why = (f"the valid canvas closest to {shown_value(width)}x{shown_value(height)}'s aspect within h3's "
               f"768*1344 pixel limit is {fit_w}x{fit_h}")
    beside = (given(other_name, shown_value(other)),) if "{}" in why else ()
    if "{}" not in why:
        why = literal(why)
    return RequestError(Fix(f"{{}} is not a multiple of 32 of at least 32; {literal(nearest)}; {why}",
                            (given(name, shown_value(value)), *beside)),
                        field=name, hint=Fix("use {} and {}", (changes(width=fit_w), changes(height=fit_h))))


def _validate_canvas(request: GenerationRequest) -> None:
    # h3.c h3_valid_params: "width and height must be multiples of 32 and at least 32"
    for name, other_name in (("width", "height"), ("height", "width")):
        value = _require_int(getattr(request, name), name)
        if value < CANVAS_MULTIPLE or value % CANVAS_MULTIPLE:
            other = _require_int(getattr(request, other_name), other_name)
            raise _canvas_side_error(name, value, other)
    width, height = request.width, request.height
    # h3.c h3_valid_params: "canvas exceeds the released 768*1344 pixel limit"
    if width * height > MAX_PIXELS:
        fit_w, fit_h = largest_canvas_like(width, height)
        same = "the same" if fit_w * height == fit_h * width else "about the same"
        raise RequestError(f"canvas {shown_value(width)}x{shown_value(height)} is {shown_value(width * height)} "
                           f"pixels, over h3's 768*1344 "
                           f"({MAX_PIXELS}) pixel limit; the largest valid canvas of {same} aspect is "
                           f"{fit_w}x{fit_h}", field="width", hint=Fix("use {} and {}", (changes(width=fit_w), changes(height=fit_h))))
    render_w, render_h = request.render_width, request.render_height
    if (render_w is None) != (render_h is None):
        # h3.c h3_valid_params: "render width and height must be set together"
        missing = "render_height" if render_h is None else "render_width"
        raise RequestError(Fix("{} and {} must be set together (or neither)", (given("render_width"), given("render_height"))),
                           field=missing, hint=Fix("also set {}, or drop the render canvas", (given(missing),)))
    if render_w is None or render_h is None:
        return
    render_w = _require_int(render_w, "render_width")
    render_h = _require_int(render_h, "render_height")
    if render_w == 0 and render_h == 0:
        # h3.c h3_valid_params reads 0x0 as "no render canvas"; here that is None.
        raise RequestError(Fix("render canvas 0x0: to render at the output size, leave {} and {} unset",
                               (given("render_width"), given("render_height"))), field="render_width",
                           hint=Fix("leave out {} and {}", (given("render_width"), given("render_height"))))
    # h3.c h3_valid_params: "internal render canvas must be same-aspect multiples of 32 no larger
    # than the output canvas"
    valid = [(w, w * height // width) for w in range(CANVAS_MULTIPLE, width + 1, CANVAS_MULTIPLE)
             if (w * height) % width == 0 and (w * height // width) % CANVAS_MULTIPLE == 0]
    if (render_w, render_h) in valid:
        return
    nearest = sorted(valid, key=lambda wh: (abs(wh[0] - render_w) + abs(wh[1] - render_h), -wh[0]))[:2]
    listed = " and ".join(f"{w}x{h}" for w, h in sorted(nearest))
    if render_w > width or render_h > height:
        problem = f"is larger than the output canvas {width}x{height}"
    elif render_w % CANVAS_MULTIPLE or render_h % CANVAS_MULTIPLE or render_w < 32 or render_h < 32:
        problem = "is not made of multiples of 32 of at least 32"
    else:
        problem = f"does not have the output canvas's aspect ({width}x{height})"
    raise RequestError(f"render canvas {shown_value(render_w)}x{shown_value(render_h)} {problem}; the nearest "
                       f"valid render canvases "
                       f"are {listed}", field="render_width",
                       hint=f"use a same-aspect canvas of multiples of 32 no larger than {width}x{height}, "
                            f"e.g. {sorted(nearest)[0][0]}x{sorted(nearest)[0][1]}, or drop the render canvas")


def _validate_quality(request: GenerationRequest) -> None:
    # h3.c h3_valid_params, in upstream's order.
    _require_range(request.steps, "steps", MIN_STEPS, MAX_STEPS, "denoising steps")
    _require_range(request.reuse, "reuse", 1, MAX_REUSE, "denoiser reuse")
    _require_range(request.layers, "layers", MIN_LAYERS, MAX_LAYERS, "DiT layers")
    _require_range(request.core_reuse, "core_reuse", 1, MAX_CORE_REUSE, "core reuse")
    if request.ssd_streaming and request.int8_row_fc2:
        raise RequestError(Fix("{} streams the original BF16 weights and cannot be combined with {}",
                               (given("ssd_streaming"), given("int8_row_fc2"))), field="int8_row_fc2",
                           hint=Fix("drop {} (or {})", (given("int8_row_fc2"), given("ssd_streaming"))))
    if request.int8_row_fc2 and SlowerPath.BF16_MLP in request.slower_paths:
        raise RequestError(Fix("{} cannot be combined with the slower BF16 MLP path", (given("int8_row_fc2"),)),
                           field="int8_row_fc2", hint=Fix("drop {} or the bf16-mlp slower path", (given("int8_row_fc2"),)))
    if request.core_reuse > 1 and request.reuse > 1:
        raise RequestError(Fix("{} and {} cannot be combined: one of them must be 1",
                               (given("core_reuse", request.core_reuse), given("reuse", request.reuse))), field="core_reuse",
                           hint=Fix("use {} (keep {}) or {} (keep {})", (changes(core_reuse=1), given("reuse"),
                                                                       changes(reuse=1), given("core_reuse"))))
    seed = _require_int(request.seed, "seed")
    if not 0 <= seed <= MAX_SEED:
        raise RequestError(Fix("{} must be in [0, 2**64-1]", (given("seed", shown_value(seed)),)), field="seed",
                           hint=Fix("use {}", (changes(seed=min(max(seed, 0), MAX_SEED)),)))
    if not isinstance(request.reference_image_size, ReferenceImageSize):
        raise RequestError(Fix("{} must be match or max", (given("reference_image_size", shown_value(request.reference_image_size)),)),
                           field="reference_image_size", hint="use 'match' (default) or 'max'")


# How h3 counts Ref2VA references: main.c:109 "at most 12 references" (parse time);
# h3.c `h3_valid_params` (h3.c:595-633) counts images, videos and audio inputs, where a
# video with its embedded soundtrack and a video with a replacement soundtrack each count
# as one video AND one audio input, and audio alone needs an image or video reference.
_VIDEO_KINDS = frozenset({ReferenceKind.VIDEO, ReferenceKind.SILENT_VIDEO, ReferenceKind.VIDEO_AUDIO})
_AUDIO_INPUT_KINDS = frozenset({ReferenceKind.AUDIO, ReferenceKind.VIDEO, ReferenceKind.VIDEO_AUDIO})


@dataclass(frozen=True)
class ReferenceCounts:
    total: int = 0
    images: int = 0
    videos: int = 0
    audio_inputs: int = 0
    visual: int = 0

    @classmethod
    def of(cls, kinds: "list[ReferenceKind] | tuple[ReferenceKind, ...]") -> "ReferenceCounts":
        return cls(total=len(kinds),
                   images=sum(k is ReferenceKind.IMAGE for k in kinds),
                   videos=sum(k in _VIDEO_KINDS for k in kinds),
                   audio_inputs=sum(k in _AUDIO_INPUT_KINDS for k in kinds),
                   visual=sum(k is ReferenceKind.IMAGE or k in _VIDEO_KINDS for k in kinds))


def _too_many_references(total: int) -> RequestError:
    # main.c append_reference: "Ref2VA supports at most 12 references"
    return RequestError(f"{total} references given; Ref2VA supports at most {MAX_REFERENCES}",
                        field="references", hint=f"keep at most {MAX_REFERENCES} references")


def check_reference_limits(kinds: "list[ReferenceKind] | tuple[ReferenceKind, ...]", *,
                           complete: bool = True) -> ReferenceCounts:
    """Raise RequestError when an ordered list of reference kinds breaks upstream's Ref2VA
    limits (total, then images, videos, audio inputs, then audio needing a picture or video,
    as h3 checks them); return the counts.

    `complete=False` is for hosts still building the list one reference at a time: audio may
    come before the image or video it needs, so that rule waits for the finished list.
    """
    counts = ReferenceCounts.of(kinds)
    if counts.total > MAX_REFERENCES:
        raise _too_many_references(counts.total)
    # h3.c h3_valid_params: "Ref2VA limits are 9 images, 3 videos, and 3 audio inputs"
    for count, limit, what in ((counts.images, MAX_REFERENCE_IMAGES, "images"),
                               (counts.videos, MAX_REFERENCE_VIDEOS, "videos"),
                               (counts.audio_inputs, MAX_REFERENCE_AUDIO, "audio inputs")):
        if count > limit:
            extra = " ({} with its soundtrack counts as an audio input)" if what == "audio inputs" else ""
            kinds = ((Change("references", ReferenceKind.VIDEO),),) if extra else ()
            raise RequestError(Fix(f"{count} reference {what} given; Ref2VA allows at most {limit}{extra}", kinds),
                               field="references", hint=f"keep at most {limit} reference {what}")
    if complete and counts.total and not counts.visual:
        # h3.c h3_valid_params: "reference audio requires an image or video reference"
        raise RequestError("reference audio requires an image or video reference", field="references",
                           hint="add a reference image or video")
    return counts


# Hints that suggest a reference of another kind name it as data (h3bridge.fixes), so that each
# interface says how its user adds one (`--ref-silent-video`, an H3 References kind).
_SILENT = ((Change("references", ReferenceKind.SILENT_VIDEO),),)
_VIDEO_AUDIO = ((Change("references", ReferenceKind.VIDEO_AUDIO),),)


def reference_name(request: GenerationRequest, index: int, names: "Sequence[str] | None" = None) -> str:
    """Reference `index` (1-based) as messages name it: the caller's name for it, or `reference 2 (image)`."""
    if names is not None and index <= len(names):
        return names[index - 1]
    return f"reference {index} ({request.references[index - 1].kind.value})"


def _validate_references(request: GenerationRequest, names: "Sequence[str] | None" = None) -> None:
    references = request.references
    if not references:
        return
    if request.first_frame is not None or request.last_frame is not None:
        # h3.c h3_valid_params: "full references cannot be combined with frame anchors"
        raise RequestError("references cannot be combined with first_frame/last_frame anchors",
                           field="references", hint="drop the anchors (FL2VA) or the references (Ref2VA)")
    if len(references) > MAX_REFERENCES:
        raise _too_many_references(len(references))
    for index, reference in enumerate(references, 1):   # types: _validate_types
        if (reference.kind is ReferenceKind.VIDEO_AUDIO) != (reference.audio_path is not None):
            raise RequestError(f"{reference_name(request, index, names)}: only video_audio references take "
                               f"an audio_path, and they need one", field="references",
                               hint="give video_audio references an audio_path, and no other kind")
    check_reference_limits([reference.kind for reference in references])


def _type_name(value: object) -> str:
    return type(value).__name__


def _is_path(value: object) -> bool:
    """A file path as the library takes it: a str or os.PathLike naming something (not bytes)."""
    if isinstance(value, os.PathLike):
        try:
            value = os.fspath(value)
        except Exception:                # a caller's PathLike may raise anything from __fspath__
            return False
    return isinstance(value, str) and value != ""


def _require_path(value: object, name: str, what: str) -> None:
    if not _is_path(value):
        raise RequestError(f"{what} must be a file path (a str or pathlib.Path), not {_type_name(value)} "
                           f"{shown_value(value)}",
                           field=name, hint=f"give {name} the path of a file, e.g. Path('image.png')")


# The on/off options: anything but True/False is a caller's mistake (a string "no" is truthy).
_SWITCHES = ("token_reduction", "ssd_streaming", "int8_row_fc2", "reference_rope")


def _validate_types(request: GenerationRequest) -> None:
    """The field types that the value rules below rely on, each a RequestError naming the field and
    the type it wants (numbers are checked where their ranges are, by _require_int)."""
    for name in _SWITCHES:
        value = getattr(request, name)
        if not isinstance(value, bool):
            raise RequestError(f"{name}={shown_value(value)} must be True or False, not {_type_name(value)}", field=name,
                               hint=f"use {name}=True or {name}=False")
    for name in ("first_frame", "last_frame"):
        value = getattr(request, name)
        if value is not None:
            _require_path(value, name, name)
    if not isinstance(request.slower_paths, (frozenset, set, tuple, list)):
        raise RequestError(f"slower_paths={shown_value(request.slower_paths)} must be a set of SlowerPath, not "
                           f"{_type_name(request.slower_paths)}", field="slower_paths",
                           hint="use slower_paths=frozenset() for none, or e.g. frozenset({SlowerPath.BF16_MLP})")
    for path in request.slower_paths:    # checked before any rule compares them with a SlowerPath
        if not isinstance(path, SlowerPath):
            raise RequestError(f"unknown slower path {shown_value(path)}", field="slower_paths",
                               hint=f"use one of: {', '.join(p.value for p in SlowerPath)}")
    references = request.references
    if not isinstance(references, (tuple, list)):
        raise RequestError(f"references={shown_value(references)} must be a tuple of Reference, not "
                           f"{_type_name(references)}",
                           field="references", hint="use references=() for none, or a tuple of Reference(kind, path)")
    for index, reference in enumerate(references, 1):
        if not isinstance(reference, Reference):
            raise RequestError(f"reference {index} ({shown_value(reference)}) must be a Reference, not "
                               f"{_type_name(reference)}",
                               field="references", hint="build it as Reference(ReferenceKind.IMAGE, Path('ref.png'))")
        if not isinstance(reference.kind, ReferenceKind):
            raise RequestError(f"reference {index}: kind={shown_value(reference.kind)} must be a ReferenceKind, not "
                               f"{_type_name(reference.kind)}", field="references",
                               hint=f"use one of: {', '.join('ReferenceKind.' + k.name for k in ReferenceKind)}")
        _require_path(reference.path, "references", f"reference {index} ({reference.kind.value}): path")
        if reference.audio_path is not None:
            _require_path(reference.audio_path, "references",
                          f"reference {index} ({reference.kind.value}): audio_path")


def _validate_values(request: GenerationRequest, reference_names: "Sequence[str] | None" = None) -> None:
    if not isinstance(request.prompt, str):
        raise RequestError(f"prompt={shown_value(request.prompt)} must be text (a str), not "
                           f"{_type_name(request.prompt)}",
                           field="prompt", hint="describe the clip in the prompt, as a str")
    if not request.prompt.strip():
        # h3.c h3_generate refuses "" ("prompt must not be empty"); a prompt of only whitespace
        # would run, on nothing to describe, so it is refused here too.
        raise RequestError("the prompt has no text (it is empty or only whitespace)", field="prompt",
                           hint="describe the clip in the prompt")
    if "\0" in request.prompt:
        raise RequestError("the prompt contains a NUL character, which cannot reach the engine",
                           field="prompt", hint="remove the NUL character")
    try:
        prompt_bytes = len(request.prompt.encode("utf-8"))
    except UnicodeEncodeError as error:
        # h3_tokenizer.m: "prompt is not valid UTF-8", only after the model load (and, with
        # anchors or references, after reading and encoding them). Undecodable command-line bytes
        # reach Python as lone surrogates.
        raise RequestError(f"the prompt is not valid UTF-8 (character {error.start + 1} is not text)",
                           field="prompt", hint="retype the prompt, or save it as UTF-8 text") from None
    if prompt_bytes > MAX_PROMPT_BYTES:
        raise RequestError(f"the prompt is {prompt_bytes:,} bytes; h3 takes prompts of at most {MAX_PROMPT_BYTES:,} "
                           f"bytes (its text encoder's limit of {MAX_PROMPT_BYTES:,} tokens)", field="prompt",
                           hint=f"shorten the prompt to at most {MAX_PROMPT_BYTES:,} bytes of UTF-8 text")
    _validate_types(request)
    _validate_canvas(request)
    _validate_frames(request)
    _validate_quality(request)
    _validate_references(request, reference_names)


def _validate_files(request: GenerationRequest, reference_names: "Sequence[str] | None" = None) -> None:
    from .errors import MediaError
    from .media.decode import MediaInfo, media_read_error, probe_media  # PyAV is only needed when files are checked

    def probe(path: Path, field_name: str, what: str) -> MediaInfo:
        path = Path(path)
        try:
            regular = path.is_file()
        except OSError as error:     # a name the file system cannot even look up (too long, ...)
            raise RequestError(f"{what} {shown_value(str(path), limit=80)} cannot be looked up: "
                               f"{error.strerror or error}", field=field_name, hint="check the path") from None
        if not regular:
            raise RequestError(f"{what} {str(path)!r} does not exist or is not a file", field=field_name,
                               hint="check the path")
        try:
            with open(path, "rb"):
                pass
            return probe_media(path)
        except MediaError as error:     # says what is wrong in plain words, and the fix
            raise RequestError(f"{what}: {error.message}", field=field_name, hint=error.hint) from None
        except Exception as error:  # PyAV raises many types for undecodable input
            unreadable = media_read_error(path, error)
            raise RequestError(f"{what}: {unreadable.message}", field=field_name, hint=unreadable.hint) from None

    def need_visual(info: MediaInfo, path: Path, field_name: str, what: str) -> None:
        if not info.has_video:
            raise RequestError(f"{what} {str(path)!r} has no image or video stream", field=field_name,
                               hint="use an image or video file")

    for name in ("first_frame", "last_frame"):
        anchor = getattr(request, name)
        if anchor is not None:
            need_visual(probe(anchor, name, name.replace("_", " ")), anchor, name, name.replace("_", " "))
    output_frames = request.frame_count
    total_samples = 0
    for index, reference in enumerate(request.references, 1):
        what = reference_name(request, index, reference_names)
        info = probe(reference.path, "references", what)
        soundtrack_path: Path | None = None
        max_samples = MAX_AUDIO_SAMPLES
        if reference.kind is ReferenceKind.AUDIO:
            if not info.has_audio:
                raise RequestError(f"{what} {str(reference.path)!r} has no audio stream", field="references",
                                   hint="use an audio file (WAV, MP3, AAC ...)")
            audio_samples = info.audio_samples
        else:
            need_visual(info, reference.path, "references", what)
            if reference.kind is ReferenceKind.IMAGE:
                continue
            # h3_ffmpeg.c h3_ffmpeg_read_video_f32: decode at 24 fps up to the output length,
            # require >= 5 frames, then trim down to 5 + 17n.
            decoded = min(info.frames_at_24fps or 0, output_frames)
            if decoded < MIN_REFERENCE_VIDEO_FRAMES:
                raise RequestError(f"{what} {str(reference.path)!r} has {decoded} frames at 24 fps; reference "
                                   f"videos need at least {MIN_REFERENCE_VIDEO_FRAMES}", field="references",
                                   hint="use a longer video")
            condition_frames = reference_video_frames(decoded, output_frames)
            if reference.kind is ReferenceKind.SILENT_VIDEO:
                continue
            soundtrack_path = reference.audio_path if reference.kind is ReferenceKind.VIDEO_AUDIO else reference.path
            # h3.c h3_generate: the soundtrack is cut to the decoded video's duration, which must
            # be >= 2 s, i.e. >= 56 frames (5 + 17n) of both the output and the reference video.
            if condition_frames < MIN_SOUNDTRACK_FRAMES:
                if output_frames < MIN_SOUNDTRACK_FRAMES:
                    raise RequestError(f"{what}: a video soundtrack needs at least {MIN_SOUNDTRACK_FRAMES} output "
                                       f"frames, but the clip has {output_frames}", field="frames",
                                       hint=Fix(f"use frames>={MIN_SOUNDTRACK_FRAMES}, or use {{}}", _SILENT))
                raise RequestError(f"{what}: the video {str(reference.path)!r} is only {decoded} frames at 24 fps; "
                                   f"its soundtrack needs at least {MIN_SOUNDTRACK_FRAMES} frames of video "
                                   f"(2.33 s)", field="references",
                                   hint=Fix("use a longer video, or use {}", _SILENT))
            max_samples = round(condition_frames * SAMPLE_RATE / FPS)
            if max_samples > MAX_AUDIO_SAMPLES:
                # h3_ffmpeg.c h3_ffmpeg_read_audio_f32 rejects a soundtrack window over 15 s
                # ("invalid FFmpeg audio input arguments"): 362 frames of video is 15.08 s.
                raise RequestError(f"{what}: at {output_frames} frames the video soundtrack window is "
                                   f"{condition_frames / FPS:.2f} s, over h3's 15 s audio limit; the nearest valid "
                                   f"length is 345 frames", field="frames",
                                   hint=Fix("use frames<=345, or a shorter reference video, or {}", _SILENT))
            if reference.kind is ReferenceKind.VIDEO_AUDIO:
                assert reference.audio_path is not None
                info = probe(reference.audio_path, "references", f"{what} soundtrack")
            if not info.has_audio:
                raise RequestError(f"{what} {str(soundtrack_path)!r} has no audio stream", field="references",
                                   hint=Fix("use {}, or {} with a separate soundtrack", (*_SILENT, *_VIDEO_AUDIO)))
            audio_samples = min(info.audio_samples or 0, max_samples)
        seconds = (audio_samples or 0) / SAMPLE_RATE
        source = soundtrack_path or reference.path
        if (audio_samples or 0) < MIN_AUDIO_SAMPLES:
            # h3_ffmpeg.c: "reference audio requires at least 2 seconds at 32 kHz"
            raise RequestError(f"{what}: audio {str(source)!r} is {seconds:.2f} s; reference audio must be "
                               f"at least 2 s", field="references", hint="use audio of 2 to 15 seconds")
        if reference.kind is ReferenceKind.AUDIO and audio_samples > MAX_AUDIO_SAMPLES:
            # h3_ffmpeg.c: "reference audio exceeds the 15 second total limit"
            raise RequestError(f"{what}: audio {str(source)!r} is {seconds:.2f} s; reference audio must be "
                               f"at most 15 s", field="references", hint="trim the audio to 15 seconds or less")
        total_samples += audio_samples
        if total_samples > MAX_AUDIO_SAMPLES:
            # h3.c h3_generate: "ordered reference audio exceeds 15 seconds in total"
            raise RequestError(f"reference audio adds up to {total_samples / SAMPLE_RATE:.2f} s after reference "
                               f"{index}; all reference audio together must be at most 15 s", field="references",
                               hint="drop or trim audio references")


def request_fields(request: GenerationRequest, *, path_value=str) -> dict[str, object]:
    """Every field of `request` as JSON-ready values: enums by value, sets sorted (so the same
    request always reads the same), dataclasses (references) as their fields, paths through
    `path_value` (text by default). The one serialisation of a request: the job history's record,
    a story shot's manifest record and a shot's key are all made from it."""
    def plain(value: object) -> object:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, Path):
            return path_value(value)
        if is_dataclass(value) and not isinstance(value, type):
            return {item.name: plain(getattr(value, item.name)) for item in fields(value)}
        if isinstance(value, (set, frozenset)):
            return sorted(plain(item) for item in value)     # type: ignore[type-var]
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        return value
    return {item.name: plain(getattr(request, item.name)) for item in fields(request)}

