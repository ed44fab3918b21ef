"""`h3_params` and the host-side arithmetic of upstream h3.c, for the simulator.

Every function names the upstream function it mirrors (h3_host.c, h3.c, h3.h at 8974cc0).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

# h3.h:12-18, h3_host.h:7-14
H3_VERSION = "0.1.0-dev"
DEFAULT_WIDTH, DEFAULT_HEIGHT, DEFAULT_FRAMES, DEFAULT_STEPS = 864, 480, 56, 20
DEFAULT_DIT_LAYERS, MIN_DIT_LAYERS = 50, 35
CANVAS_MULTIPLE = 32
MAX_PIXELS = 768 * 1344
FPS = 24
AUDIO_LATENT_FPS = 40
VAE_SPATIAL_RATIO = 16
MAX_STEPS = 1000
SAMPLE_RATE = 32000          # h3_audio_vae.c:22 SAMPLE_RATE
AUDIO_HOP_LENGTH = 800       # h3_audio_vae.c:23 HOP_LENGTH (decoded samples per audio latent)
AUDIO_CHANNELS = 2
MAX_REFERENCES = 12          # main.c:108 / h3.c:582


class ReferenceKind(enum.IntEnum):
    """h3_reference_kind (h3.h:30-35)."""

    IMAGE = 1
    VIDEO = 2
    AUDIO = 3
    VIDEO_AUDIO = 4


class ReferenceImageSize(enum.IntEnum):
    """h3_reference_image_size (h3.h:44-47)."""

    MATCH = 0
    MAX = 1


@dataclass(frozen=True)
class SimReference:
    """h3_reference (h3.h:37-42)."""

    kind: ReferenceKind
    path: str | None
    audio_path: str | None = None
    include_embedded_audio: bool = False


# The ten --use-slower-* switches, in h3_params / h3_prepared_key order (h3.c:178-187).
SLOWER_FLAGS = (
    "use_slower_bf16_mlp", "use_slower_bf16_qkv", "use_slower_bf16_attention_output",
    "use_slower_row_major_attention_output", "use_slower_unfused_int8_inputs",
    "use_slower_unfused_qkv_rope", "use_slower_scalar_qkv_rms",
    "use_slower_uncached_int8_scales", "use_slower_dynamic_fc1_k",
    "use_slower_grouped_quantizer",
)


@dataclass
class SimParams:
    """h3_params (h3.h:65-129) with H3_PARAMS_DEFAULT values (h3.h:131-135).

    Integers stay integers (not bools) so out-of-range values reach the same checks as
    in `h3_valid_params`. Callbacks are passed to `engine.generate` separately.
    """

    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT
    frames: int = DEFAULT_FRAMES
    steps: int = DEFAULT_STEPS
    seed: int = 42
    output_path: str | None = None
    first_frame: str | None = None
    last_frame: str | None = None
    references: list[SimReference] = field(default_factory=list)
    reference_image_size: int = ReferenceImageSize.MATCH
    denoise_reuse: int = 1
    dit_layers: int = DEFAULT_DIT_LAYERS
    core_reuse: int = 1
    token_reduction: int = 0
    use_int8_row_fc2: int = 0
    use_reference_rope: int = 0
    ssd_streaming: int = 0
    render_width: int = 0
    render_height: int = 0
    use_slower_bf16_mlp: int = 0
    use_slower_bf16_qkv: int = 0
    use_slower_bf16_attention_output: int = 0
    use_slower_row_major_attention_output: int = 0
    use_slower_unfused_int8_inputs: int = 0
    use_slower_unfused_qkv_rope: int = 0
    use_slower_scalar_qkv_rms: int = 0
    use_slower_uncached_int8_scales: int = 0
    use_slower_dynamic_fc1_k: int = 0
    use_slower_grouped_quantizer: int = 0
    preview_denoise: int = 0
    # h3_params.references is NULL while reference_count is not: only a library caller (the
    # libh3 double, h3bridge/sim/double_host.py) can say that; h3-sim's CLI never does.
    references_null: bool = False


def align_frame_count(requested: int) -> int:
    """h3_align_frame_count (h3_host.c:15-21)."""
    value = max(requested, 5)
    remainder = (value - 5) % 17
    if remainder:
        value += 17 - remainder
    # `int value` in C: within 16 of INT32_MAX the round-up overflows. That is UB, but the
    # arm64 add wraps, so h3 sees a negative count (e.g. --frames 2147483647 passes the
    # 5..362 check and fails "at least one trained 22-frame decoder chunk").
    return (value + 2**31) % 2**32 - 2**31


def video_latent_t(frame_count: int) -> int:
    """h3_video_latent_t (h3_host.c:23-26)."""
    return 2 if frame_count <= 5 else ((frame_count - 5) // 17) * 5 + 2


def video_encoder_latent_t(frame_count: int) -> int:
    """h3_video_encoder_latent_t (h3_host.c:28-30)."""
    return (frame_count + 3) // 4 if frame_count > 0 else 0


def c_llround(value: float) -> int:
    """C llround: half away from zero. Not floor(|x| + 0.5): that addition rounds, so
    0.49999999999999994 would become 1 where llround gives 0."""
    magnitude = abs(value)
    whole = math.floor(magnitude)
    if magnitude - whole >= 0.5:      # exact: x - floor(x) never rounds
        whole += 1
    return int(whole) * (1 if value >= 0 else -1)


@dataclass(frozen=True)
class TemporalShape:
    frame_count: int
    video_t: int
    audio_t: int


def temporal(requested_frames: int) -> TemporalShape:
    """h3_temporal (h3_host.c:32-39)."""
    frames = align_frame_count(requested_frames)
    return TemporalShape(frames, video_latent_t(frames),
                         c_llround(frames * AUDIO_LATENT_FPS / FPS))


def latent_canvas(width: int, height: int) -> tuple[int, int]:
    """h3_latent_canvas (h3_host.c:41-44): (latent_w, latent_h)."""
    return width // VAE_SPATIAL_RATIO, height // VAE_SPATIAL_RATIO


def _nearbyint(value: float) -> float:
    return float(round(value))   # round-half-even, the default FE_TONEAREST mode


def adapt_canvas(width: int, height: int) -> tuple[int, int]:
    """h3_adapt_canvas (h3_host.c:46-72)."""
    ratio = width / height
    if ratio >= 1.0:
        nominal_w, nominal_h = 768.0 * ratio, 768.0
    else:
        nominal_w, nominal_h = 768.0, 768.0 / ratio
    pixels = nominal_w * nominal_h
    if pixels > MAX_PIXELS:
        scale = math.sqrt(MAX_PIXELS / pixels)
        nominal_w *= scale
        nominal_h *= scale
    out_w = int(_nearbyint(nominal_w / CANVAS_MULTIPLE) * CANVAS_MULTIPLE)
    out_h = int(_nearbyint(nominal_h / CANVAS_MULTIPLE) * CANVAS_MULTIPLE)
    return max(out_w, CANVAS_MULTIPLE), max(out_h, CANVAS_MULTIPLE)


def reference_image_canvas(width: int, height: int, target_width: int, target_height: int,
                           max_short_edge: int) -> tuple[int, int]:
    """h3_reference_image_canvas (h3_host.c:74-98)."""
    if max_short_edge:
        scale = min(1.0, max_short_edge / min(width, height))
    else:
        scale = min(1.0, math.sqrt((target_width * target_height) / (width * height)))
    out_w = _nearbyint(width * scale / CANVAS_MULTIPLE) * CANVAS_MULTIPLE
    out_h = _nearbyint(height * scale / CANVAS_MULTIPLE) * CANVAS_MULTIPLE
    return int(max(out_w, CANVAS_MULTIPLE)), int(max(out_h, CANVAS_MULTIPLE))


def reference_video_canvas(width: int, height: int) -> tuple[int, int]:
    """h3_reference_video_canvas (h3_host.c:100-115)."""
    adapted_w, adapted_h = adapt_canvas(width, height)
    if width * height < adapted_w * adapted_h:
        out_w = int(_nearbyint(width / CANVAS_MULTIPLE) * CANVAS_MULTIPLE)
        out_h = int(_nearbyint(height / CANVAS_MULTIPLE) * CANVAS_MULTIPLE)
        return max(out_w, CANVAS_MULTIPLE), max(out_h, CANVAS_MULTIPLE)
    return adapted_w, adapted_h


def reuse_evaluations(steps: int, reuse_interval: int) -> int:
    """h3_dit_reuse_schedule (h3_dit.c:2540-2555): model forwards actually evaluated."""
    return sum(1 for step in range(steps)
               if reuse_interval == 1 or step in (0, steps - 1) or step % reuse_interval == 0)


def valid_params_error(params: SimParams, metal4: bool, has_frame_callback: bool) -> str | None:
    """h3_valid_params (h3.c:481-637): the first failing rule's message, or None."""
    p = params
    if p.width < 32 or p.height < 32 or p.width % CANVAS_MULTIPLE or p.height % CANVAS_MULTIPLE:
        return "width and height must be multiples of 32 and at least 32"
    if p.width * p.height > MAX_PIXELS:
        return "canvas exceeds the released 768*1344 pixel limit"
    if (p.render_width == 0) != (p.render_height == 0):
        return "render width and height must be set together"
    if p.render_width:
        if (p.render_width < 32 or p.render_height < 32
                or p.render_width % CANVAS_MULTIPLE or p.render_height % CANVAS_MULTIPLE
                or p.render_width > p.width or p.render_height > p.height
                or p.render_width * p.height != p.render_height * p.width):
            return ("internal render canvas must be same-aspect multiples of 32 "
                    "no larger than the output canvas")
    if p.frames < 5 or align_frame_count(p.frames) > 362:
        return "frames must align within the released 5..362 range"
    if p.steps < 2 or p.steps > MAX_STEPS:
        return "denoising steps must be in [2, 1000]"
    if p.denoise_reuse < 1 or p.denoise_reuse > 3:
        return "denoise reuse must be in [1, 3]"
    if p.dit_layers < MIN_DIT_LAYERS or p.dit_layers > DEFAULT_DIT_LAYERS:
        return "DiT layers must be in [35, 50]"
    if p.core_reuse < 1 or p.core_reuse > 6:
        return "core reuse must be in [1, 6]"
    if p.token_reduction not in (0, 1):
        return "token reduction must be zero or one"
    if p.use_int8_row_fc2 not in (0, 1):
        return "int8 row FC2 must be zero or one"
    if p.use_reference_rope not in (0, 1):
        return "reference RoPE must be zero or one"
    if p.ssd_streaming not in (0, 1):
        return "SSD streaming must be zero or one"
    if p.ssd_streaming and p.use_int8_row_fc2:
        return ("SSD streaming uses original BF16 weights and cannot "
                "be combined with int8 row FC2")
    if p.use_int8_row_fc2 and p.use_slower_bf16_mlp:
        return "int8 row FC2 cannot be combined with the BF16 MLP"
    if p.use_int8_row_fc2 and not metal4:
        return "int8 row FC2 requires an M5-class Metal 4 GPU"
    if p.preview_denoise not in (0, 1):
        return "denoising preview must be zero or one"
    if p.preview_denoise and not has_frame_callback:
        return "denoising preview requires a frame callback"
    if p.core_reuse > 1 and p.denoise_reuse > 1:
        return "core reuse and denoiser reuse cannot be combined"
    if p.references_null:
        return "reference_count is nonzero but references is NULL"
    if len(p.references) > MAX_REFERENCES:
        return "Ref2VA supports at most 12 references"
    if p.reference_image_size not in (ReferenceImageSize.MATCH, ReferenceImageSize.MAX):
        return "unknown reference image sizing policy"
    # Pointers, not strings: `--first-frame ''` is an anchor too (h3.c:591).
    if p.references and (p.first_frame is not None or p.last_frame is not None):
        return "full references cannot be combined with frame anchors"
    images = videos = audio_inputs = visual = 0
    for index, reference in enumerate(p.references, start=1):
        if not reference.path:
            return f"reference {index} has no input path"
        if reference.kind == ReferenceKind.IMAGE:
            images += 1
            visual += 1
        elif reference.kind == ReferenceKind.VIDEO:
            videos += 1
            visual += 1
            if reference.include_embedded_audio:
                audio_inputs += 1
        elif reference.kind == ReferenceKind.AUDIO:
            audio_inputs += 1
        elif reference.kind == ReferenceKind.VIDEO_AUDIO:
            videos += 1
            visual += 1
            audio_inputs += 1
            if not reference.audio_path:
                return f"video+audio reference {index} has no soundtrack path"
        else:
            return f"reference {index} has an unknown type"
    if images > 9 or videos > 3 or audio_inputs > 3:
        return "Ref2VA limits are 9 images, 3 videos, and 3 audio inputs"
    if p.references and not visual:
        return "reference audio requires an image or video reference"
    return None
