"""The request's shape as upstream computes it: sequence rows, reference media probed and sized
with upstream's canvas functions."""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import MediaError
from ...geometry import (
    FPS, SAMPLE_RATE, reference_image_canvas, reference_video_canvas, reference_video_frames, round_to_canvas,
    video_encoder_latent_t, video_latent_t,
)
from ...request import MAX_AUDIO_SAMPLES, GenerationRequest, ReferenceImageSize, ReferenceKind
from .constants import (
    AUDIO_HOP, AUDIO_LATENT_FPS, AUDIO_STREAMS, BYTES_PER_PROMPT_TOKEN, DIT_PATCH, PROMPT_TEMPLATE_TOKENS,
    REFERENCE_IMAGE_MAX_EDGE, VAE_SPATIAL_RATIO, VIDEO_FRAMES_PER_VISION_SAMPLE, VISION_MERGE, VISION_PATCH,
    VISION_SAMPLES_PER_BLOCK,
)

if TYPE_CHECKING:
    from ...media.decode import MediaInfo


# ---------------------------------------------------------------------------------------------
# Upstream's canvas arithmetic (h3_host.c), for reference and anchor media


@functools.lru_cache(maxsize=64)
def _probe_file(path: str, modified_ns: int, size: int) -> "MediaInfo | None":
    from ...media.decode import probe_media  # PyAV is only needed when there are media files
    try:
        return probe_media(Path(path))
    except (MediaError, OSError):
        return None


def probe_reference(path: Path | None) -> "MediaInfo | None":
    """The file's size and length as request validation reads them (media.probe_media, PyAV),
    cached by path, size and modification time (the suggestion search re-plans many times);
    None when the file is missing or unreadable (the plan then assumes upstream's largest)."""
    if path is None:
        return None
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return _probe_file(os.fspath(path), stat.st_mtime_ns, stat.st_size)


# ---------------------------------------------------------------------------------------------
# Request geometry


def _tokens(text: str) -> int:
    """Token estimate for text h3 tokenizes (conservative: 3 bytes a token)."""
    return math.ceil(len(text.encode()) / BYTES_PER_PROMPT_TOKEN)


@dataclass(frozen=True)
class VisualInput:
    """One anchor or visual reference as h3 reads it (h3.c h3_generate): decoded at `width` x
    `height` for `frames` frames, VAE-encoded into DiT condition rows and shown to the Qwen vision
    tower (one call per image, one per pair of sampled frames of a video)."""

    what: str
    width: int
    height: int
    frames: int
    vision_calls: int
    assumed: bool = False          # the file could not be read: upstream's largest size assumed

    @property
    def condition_rows(self) -> int:
        """h3.c h3_generate (l.1262-1275): latent_t x (H/16) x (W/16) / 4 rows of 96 values."""
        latent_w, latent_h = self.width // VAE_SPATIAL_RATIO, self.height // VAE_SPATIAL_RATIO
        return video_encoder_latent_t(self.frames) * latent_h * latent_w // (DIT_PATCH * DIT_PATCH)

    @property
    def vision_tokens_per_call(self) -> int:
        """h3_vision_encoder.c h3_vision_encode_bf16: (H/16)(W/16) patches merged 2x2 into tokens."""
        patches = (self.height // VISION_PATCH) * (self.width // VISION_PATCH)
        return patches // (VISION_MERGE * VISION_MERGE)

    @property
    def vision_tokens(self) -> int:
        return self.vision_calls * self.vision_tokens_per_call

    @property
    def pixel_bytes(self) -> int:
        """h3_ffmpeg_read_*_f32: channel-major F32 pixels, held until the vision tower has run."""
        return self.frames * 3 * self.width * self.height * 4


@dataclass(frozen=True)
class Geometry:
    """Sequence rows of one DiT forward (h3_host.c layout) and the decoded frame sizes."""

    render_width: int
    render_height: int
    frames: int
    video_t: int
    text_rows: int                 # tokens the Qwen encoder runs over = DiT text rows (h3.c:1449)
    audio_rows: int
    video_rows: int
    condition_rows: int            # visual + audio condition rows
    time_rows: int
    condition_audio_rows: int = 0
    vision_tokens: int = 0         # picture tokens among the text rows
    visual_inputs: tuple[VisualInput, ...] = ()

    @property
    def sequence(self) -> int:
        return self.text_rows + self.audio_rows + self.video_rows + self.condition_rows

    @property
    def condition_video_rows(self) -> int:
        return self.condition_rows - self.condition_audio_rows

    @property
    def assumed_inputs(self) -> tuple[VisualInput, ...]:
        return tuple(v for v in self.visual_inputs if v.assumed)


def _vision_calls_for_video(frames: int) -> int:
    """h3.c h3_generate (l.1076-1077): one sample every 12 frames, two samples per vision call."""
    samples = math.ceil(frames / VIDEO_FRAMES_PER_VISION_SAMPLE)
    return math.ceil(samples / VISION_SAMPLES_PER_BLOCK)


def _video_timestamps(frames: int) -> list[str]:
    """h3.c h3_generate (l.1089-1093) + h3_multimodal.c: "<%.1f seconds>" before each vision pair."""
    samples = math.ceil(frames / VIDEO_FRAMES_PER_VISION_SAMPLE)
    stamps = []
    for block in range(_vision_calls_for_video(frames)):
        first = 2 * block
        second = first + 1 if first + 1 < samples else first
        stamps.append(f"<{(first + second) / 4.0:.1f} seconds>")
    return stamps


def _reference_visual(request: GenerationRequest, index: int, render: tuple[int, int]) -> VisualInput:
    reference = request.references[index]
    info = probe_reference(reference.path)
    known = info is not None and info.width and info.height
    what = f"reference {index + 1} ({reference.kind.value})"
    if reference.kind is ReferenceKind.IMAGE:
        cap = REFERENCE_IMAGE_MAX_EDGE if request.reference_image_size is ReferenceImageSize.MAX else 0
        if known:
            assert info is not None and info.width and info.height
            width, height = reference_image_canvas(info.width, info.height, *render, cap)
        elif cap:
            # unknown size: a 2048-pixel short edge at the render canvas's aspect
            scale = cap / min(render)
            width, height = round_to_canvas(render[0] * scale), round_to_canvas(render[1] * scale)
        else:
            width, height = render       # "match": never more than the render canvas's area
        return VisualInput(what, width, height, 1, 1, assumed=not known)
    if known:
        assert info is not None and info.width and info.height
        width, height = reference_video_canvas(info.width, info.height)
        frames = reference_video_frames(info.frames_at_24fps or request.frame_count, request.frame_count)
    else:
        width, height = 1344, 768        # h3_adapt_canvas's largest (H3_MAX_PIXELS), the whole clip
        frames = reference_video_frames(request.frame_count, request.frame_count)
    return VisualInput(what, width, height, frames, _vision_calls_for_video(frames), assumed=not known)


def _reference_audio_samples(request: GenerationRequest, visuals: dict[int, VisualInput]) -> list[int]:
    """Samples each reference soundtrack contributes (h3.c h3_generate l.1117-1160): a video's
    soundtrack is cut to its decoded frames, reference audio to 15 s; 15 s in total."""
    samples = []
    for index, reference in enumerate(request.references):
        if reference.kind in (ReferenceKind.IMAGE, ReferenceKind.SILENT_VIDEO):
            continue
        cap = MAX_AUDIO_SAMPLES
        if index in visuals:
            cap = min(cap, round(visuals[index].frames * SAMPLE_RATE / FPS))
        path = reference.audio_path if reference.kind is ReferenceKind.VIDEO_AUDIO else reference.path
        info = probe_reference(path)
        known = info is not None and info.audio_samples is not None
        samples.append(min(cap, info.audio_samples) if known and info is not None and info.audio_samples is not None
                       else cap)
    return samples


def geometry(request: GenerationRequest) -> Geometry:
    """Rows of h3's packed DiT sequence for `request` (h3.c h3_generate, h3_host.c layout).

    Anchors and references add rows twice: VAE-encoded condition rows, and picture tokens that the
    Qwen vision tower splices into the text (which becomes the DiT's text rows). Reference media
    are read with PyAV for their size and length; unreadable files are taken at upstream's
    largest (noted in the plan)."""
    width = request.render_width or request.width
    height = request.render_height or request.height
    frames = request.frame_count
    video_t = video_latent_t(frames)
    frame_rows = (height // (VAE_SPATIAL_RATIO * DIT_PATCH)) * (width // (VAE_SPATIAL_RATIO * DIT_PATCH))
    audio_t = int(frames * AUDIO_LATENT_FPS / FPS + 0.5)        # h3_host.c h3_temporal: llround
    text = PROMPT_TEMPLATE_TOKENS + _tokens(request.prompt)
    visuals: list[VisualInput] = []
    by_reference: dict[int, VisualInput] = {}
    if request.is_ref2va:
        # h3_multimodal.c h3_multimodal_encode_ref2va_bf16: "<Audio n>: " for a reference with
        # sound, "<Picture n>: " + picture tokens for an image, "<Video n>: " then per vision pair
        # "<t seconds>" + picture tokens for a video; each picture span adds start/end tokens.
        ordinals = {"image": 0, "video": 0, "audio": 0}
        for index, reference in enumerate(request.references):
            if reference.kind not in (ReferenceKind.IMAGE, ReferenceKind.SILENT_VIDEO):
                ordinals["audio"] += 1
                text += _tokens(f"<Audio {ordinals['audio']}>: ")
            if reference.kind is ReferenceKind.AUDIO:
                continue
            visual = _reference_visual(request, index, (width, height))
            visuals.append(visual)
            by_reference[index] = visual
            if reference.kind is ReferenceKind.IMAGE:
                ordinals["image"] += 1
                text += _tokens(f"<Picture {ordinals['image']}>: ") + 2
            else:
                ordinals["video"] += 1
                text += _tokens(f"<Video {ordinals['video']}>: ")
                text += sum(_tokens(stamp) + 2 for stamp in _video_timestamps(visual.frames))
    else:
        # h3.c h3_generate (l.1194-1222): anchors are read at the render canvas; h3_multimodal.c
        # h3_multimodal_encode_fl2va_bf16 presents each as "<Picture n>: " + picture tokens.
        for number, anchor in enumerate(a for a in (request.first_frame, request.last_frame) if a is not None):
            visuals.append(VisualInput("first/last frame", width, height, 1, 1))
            text += _tokens(f"<Picture {number + 1}>: ") + 2
    vision_tokens = sum(v.vision_tokens for v in visuals)
    condition_video = sum(v.condition_rows for v in visuals)
    audio_samples = _reference_audio_samples(request, by_reference) if request.is_ref2va else []
    # h3_audio_vae.c: latent length ceil(samples / 800), two streams; h3 refuses over 15 s in total
    condition_audio = sum(AUDIO_STREAMS * math.ceil(n / AUDIO_HOP) for n in audio_samples)
    condition_audio = min(condition_audio, AUDIO_STREAMS * math.ceil(MAX_AUDIO_SAMPLES / AUDIO_HOP))
    # h3_dit_schedule.c (l.100-118): a video and an audio timestep row per step, shared where the two
    # sigmas are equal (only the first step, where both shifted schedules start at 1:
    # h3_host.c h3_serving_schedule_build), + one row per condition kind (visual, audio)
    time_rows = 2 * request.steps - 1 + int(condition_video > 0) + int(condition_audio > 0)
    return Geometry(render_width=width, render_height=height, frames=frames, video_t=video_t,
                    text_rows=text + vision_tokens, audio_rows=AUDIO_STREAMS * audio_t,
                    video_rows=video_t * frame_rows, condition_rows=condition_video + condition_audio,
                    time_rows=time_rows, condition_audio_rows=condition_audio, vision_tokens=vision_tokens,
                    visual_inputs=tuple(visuals))
