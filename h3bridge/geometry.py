"""The shape of a clip as upstream defines it, written once for validation and the memory planner:
frame rate, sample rate, legal lengths (5 + 17n), canvas limits, and h3_host.c's canvas arithmetic
for anchors and references.
"""
from __future__ import annotations

import math


# h3.h / h3_host.h constants.
FPS = 24
SAMPLE_RATE = 32000
CANVAS_MULTIPLE = 32
MAX_PIXELS = 768 * 1344
MIN_FRAMES = 22          # h3.c: "generation requires at least one trained 22-frame decoder chunk"
MAX_FRAMES = 362         # h3.c: "frames must align within the released 5..362 range"


def align_frame_count(requested: int) -> int:
    """Upstream `h3_align_frame_count`: round up to the next 5 + 17n (minimum 5)."""
    value = max(requested, 5)
    remainder = (value - 5) % 17
    return value if remainder == 0 else value + 17 - remainder


def frames_from_seconds(seconds: float) -> int:
    """main.c `frames_from_seconds`: llround(seconds * 24) (half away from zero)."""
    scaled = seconds * FPS
    return int(scaled + 0.5) if scaled >= 0 else -int(-scaled + 0.5)


def legal_frame_counts() -> list[int]:
    """Every length h3 can render: 5 + 17n within 22..362 (h3_host.c h3_align_frame_count)."""
    return list(range(MIN_FRAMES, MAX_FRAMES + 1, 17))


def reference_video_frames(frames_at_24fps: int, output_frames: int) -> int:
    """The frames of a reference video h3 conditions on (h3_ffmpeg.c h3_ffmpeg_read_video_f32):
    decoded at 24 fps up to the output length (h3.c passes temporal.frame_count), then trimmed
    down to 5 + 17n."""
    frames = min(frames_at_24fps, output_frames)
    while frames > 5 and frames % 17 != 5:
        frames -= 1
    return max(frames, 5)


# How far (relative) a suggested canvas's aspect may be from the one asked for when looking for the
# largest legal canvas "of the same aspect": exact same-aspect multiples of 32 are often tiny
# (16:9 -> 1024x576), while 1344x768 is within 1.6 %.
ASPECT_TOLERANCE = 0.03


def largest_canvas_like(width: int, height: int) -> tuple[int, int]:
    """The largest legal canvas (multiples of 32, width*height <= 768*1344) whose aspect is
    within ASPECT_TOLERANCE of width:height; when none is, the legal canvas of the closest aspect.
    Any positive whole sizes, however large (int / int is exact until the quotient overflows a
    float, and no legal canvas is wider than 1008:1, 32256x32, so a wider aspect is that one)."""
    widest_aspect = MAX_PIXELS // CANVAS_MULTIPLE // CANVAS_MULTIPLE
    if width > height * widest_aspect:
        width, height = widest_aspect, 1
    elif height > width * widest_aspect:
        width, height = 1, widest_aspect
    target = math.log(width / height)
    tolerance = math.log1p(ASPECT_TOLERANCE)
    best: tuple[tuple[float, ...], tuple[int, int]] | None = None
    for h in range(CANVAS_MULTIPLE, MAX_PIXELS // CANVAS_MULTIPLE + 1, CANVAS_MULTIPLE):
        widest = (MAX_PIXELS // h) // CANVAS_MULTIPLE * CANVAS_MULTIPLE
        ideal = h * width / height
        for w in {int(ideal // CANVAS_MULTIPLE) * CANVAS_MULTIPLE, -int(-ideal // CANVAS_MULTIPLE) * CANVAS_MULTIPLE}:
            w = min(widest, max(CANVAS_MULTIPLE, w))
            off = abs(math.log(w / h) - target)
            key = (0.0, -w * h, off) if off <= tolerance else (1.0, off, -w * h)
            if best is None or key < best[0]:
                best = (key, (w, h))
    assert best is not None
    return best[1]


def _log_aspect(width: int, height: int) -> float:
    """log(width / height) for whole sizes of any magnitude (math.log takes big ints; a quotient
    of two huge ints would overflow a float)."""
    return math.log(max(width, 1)) - math.log(max(height, 1))


def canvas_for(width: int, height: int) -> tuple[int, int]:
    """The valid canvas to suggest for a requested `width` x `height` that is not one (a side not
    a multiple of 32, or over the pixel limit): of the canvases made of the multiples of 32 just
    below and above each side, the one closest to the requested aspect (then in size), when one
    is within MAX_PIXELS (1280x720 -> 1280x736); otherwise the largest canvas of about the same
    aspect (largest_canvas_like: 1920x1080 -> 1344x768, never 1920x512). Both sides are named
    in the suggestion, so it never silently keeps a side that no longer fits."""
    width, height = max(width, CANVAS_MULTIPLE), max(height, CANVAS_MULTIPLE)
    around = [sorted({max(CANVAS_MULTIPLE, side // CANVAS_MULTIPLE * CANVAS_MULTIPLE),
                      -(-side // CANVAS_MULTIPLE) * CANVAS_MULTIPLE}) for side in (width, height)]
    fitting = [(w, h) for w in around[0] for h in around[1] if w * h <= MAX_PIXELS]
    if not fitting:
        return largest_canvas_like(width, height)
    target = _log_aspect(width, height)
    return min(fitting, key=lambda wh: (abs(_log_aspect(*wh) - target),
                                        abs(math.log(wh[0] * wh[1]) - math.log(width * height)), wh))


def round_to_canvas(value: float) -> int:
    """nearbyint(value / 32) * 32, at least 32 (nearbyint rounds half to even, like round())."""
    return max(CANVAS_MULTIPLE, round(value / CANVAS_MULTIPLE) * CANVAS_MULTIPLE)


def adapt_canvas(width: int, height: int) -> tuple[int, int]:
    """h3_host.c h3_adapt_canvas: 768 on the short side, then scaled under H3_MAX_PIXELS."""
    ratio = width / height
    nominal_w, nominal_h = (768.0 * ratio, 768.0) if ratio >= 1.0 else (768.0, 768.0 / ratio)
    if nominal_w * nominal_h > MAX_PIXELS:
        scale = math.sqrt(MAX_PIXELS / (nominal_w * nominal_h))
        nominal_w, nominal_h = nominal_w * scale, nominal_h * scale
    return round_to_canvas(nominal_w), round_to_canvas(nominal_h)


def reference_image_canvas(width: int, height: int, target_width: int, target_height: int,
                           max_short_edge: int = 0) -> tuple[int, int]:
    """h3_host.c h3_reference_image_canvas: the source scaled down (never up) to the render canvas's
    area, or with `--ref-image-size max` (h3.c passes 2048) to a 2048-pixel short edge."""
    if max_short_edge:
        scale = min(1.0, max_short_edge / min(width, height))
    else:
        scale = min(1.0, math.sqrt((target_width * target_height) / (width * height)))
    return round_to_canvas(width * scale), round_to_canvas(height * scale)


def reference_video_canvas(width: int, height: int) -> tuple[int, int]:
    """h3_host.c h3_reference_video_canvas: the adapted canvas (up to 768x1344), or the source
    rounded to multiples of 32 when it is smaller. The output/render canvas plays no part."""
    adapted_w, adapted_h = adapt_canvas(width, height)
    if width * height < adapted_w * adapted_h:
        return round_to_canvas(width), round_to_canvas(height)
    return adapted_w, adapted_h


def video_encoder_latent_t(frames: int) -> int:
    """h3_host.c h3_video_encoder_latent_t: ceil(frames / 4)."""
    return (frames + 3) // 4 if frames > 0 else 0


def video_latent_t(frames: int) -> int:
    """h3_host.c h3_video_latent_t: 2 for F <= 5, else ((F - 5) / 17) * 5 + 2 (F > 5, so C's
    truncating division and Python's floor agree)."""
    return 2 if frames <= 5 else ((frames - 5) // 17) * 5 + 2


AUDIO_LATENT_FPS = 40       # h3_host.h H3_AUDIO_LATENT_FPS (model/memory.py plans with the same value)


def audio_latent_t(frames: int) -> int:
    """Audio latent frames of a clip of `frames` video frames (h3_host.c h3_temporal)."""
    return int(frames * AUDIO_LATENT_FPS / FPS + 0.5)
