"""Synthetic, deterministic test-pattern "generation" for h3-sim (never model output).

Frames and audio are pure functions of (prompt, seed, output size, conditions): same
inputs give byte-identical frames, a different seed gives different frames. Conditions
show visibly: the first/last-frame anchors ARE the first/last frames (cross-fading into
the pattern), and Ref2VA visual references are blended into every frame, reference audio
is mixed into the soundtrack.

Frames are produced one at a time (`iter_frames`), so nothing holds the whole clip.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .params import AUDIO_CHANNELS


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8", "surrogateescape"))
    return np.random.default_rng(int.from_bytes(digest.digest()[:16], "little"))


def resize_nearest(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Nearest-neighbour resize of an HxWx3 uint8 image (stands in for h3's vImage resize)."""
    source_h, source_w = image.shape[:2]
    if (source_w, source_h) == (width, height):
        return image
    rows = (np.arange(height) * source_h // height).clip(0, source_h - 1)
    cols = (np.arange(width) * source_w // width).clip(0, source_w - 1)
    return image[rows[:, None], cols[None, :]]


@dataclass
class Conditions:
    """What the (simulated) encoders extracted: decoded media, kept for the renderer."""

    first_frame: np.ndarray | None = None          # HxWx3 uint8 at the render canvas
    last_frame: np.ndarray | None = None
    reference_images: list[np.ndarray] = field(default_factory=list)   # HxWx3 each
    reference_videos: list[np.ndarray] = field(default_factory=list)   # TxHxWx3 each
    reference_audio: list[np.ndarray] = field(default_factory=list)    # 2xN float32 each


@dataclass(frozen=True)
class PatternSpec:
    prompt: str
    seed: int
    width: int
    height: int
    frame_count: int


def iter_frames(spec: PatternSpec, conditions: Conditions) -> Iterator[np.ndarray]:
    """Yield `frame_count` HxWx3 uint8 frames, one at a time."""
    rng = _rng("video", spec.prompt, spec.seed, spec.width, spec.height)
    fx, fy = rng.uniform(0.5, 3.0, size=2)
    vx, vy, vb = rng.uniform(-1.5, 1.5, size=3)
    phases = rng.uniform(0, 2 * np.pi, size=3)
    box_color = rng.integers(0, 256, size=3).astype(np.float32)
    orbit = rng.uniform(0.5, 2.0, size=2)
    x = np.linspace(0.0, 1.0, spec.width, dtype=np.float32)[None, :]
    y = np.linspace(0.0, 1.0, spec.height, dtype=np.float32)[:, None]
    box_w = max(2, spec.width // 6)
    box_h = max(2, spec.height // 6)
    first = resize_nearest(conditions.first_frame, spec.width, spec.height).astype(np.float32) \
        if conditions.first_frame is not None else None
    last = resize_nearest(conditions.last_frame, spec.width, spec.height).astype(np.float32) \
        if conditions.last_frame is not None else None
    still = None
    if conditions.reference_images:
        still = np.mean([resize_nearest(image, spec.width, spec.height).astype(np.float32)
                         for image in conditions.reference_images], axis=0)
    denominator = max(spec.frame_count - 1, 1)
    frame = np.empty((spec.height, spec.width, 3), dtype=np.float32)
    two_pi = 2 * np.pi
    for index in range(spec.frame_count):
        t = index / 24.0
        # Separable waves: red varies along x, green along y, blue along x+y (expanded with
        # the angle-sum identity so each frame needs only 1-D sines).
        frame[..., 0] = (0.5 + 0.5 * np.sin(two_pi * (fx * x + vx * t) + phases[0])) * 255.0
        frame[..., 1] = (0.5 + 0.5 * np.sin(two_pi * (fy * y + vy * t) + phases[1])) * 255.0
        along_x = two_pi * (fx * x - vb * t) + phases[2]
        along_y = two_pi * fy * y
        frame[..., 2] = 127.5 + 127.5 * (np.sin(along_x) * np.cos(along_y)
                                         + np.cos(along_x) * np.sin(along_y))
        left = int((0.5 + 0.4 * np.sin(orbit[0] * t)) * (spec.width - box_w))
        top = int((0.5 + 0.4 * np.cos(orbit[1] * t)) * (spec.height - box_h))
        frame[top:top + box_h, left:left + box_w] = box_color
        mixed = frame
        if still is not None:
            mixed = 0.4 * mixed + 0.6 * still
        for video in conditions.reference_videos:
            source = resize_nearest(video[index % len(video)], spec.width, spec.height)
            mixed = 0.5 * mixed + 0.5 * source.astype(np.float32)
        position = index / denominator
        if first is not None:
            weight = (1.0 - position) ** 2
            mixed = (1.0 - weight) * mixed + weight * first
        if last is not None:
            weight = position ** 2
            mixed = (1.0 - weight) * mixed + weight * last
        yield np.rint(np.clip(mixed, 0.0, 255.0)).astype(np.uint8)


def render_preview(spec: PatternSpec, conditions: Conditions, frame_index: int,
                   completed_steps: int, total_steps: int) -> np.ndarray:
    """A denoising-preview frame: the final frame fading in from seeded noise."""
    final = None
    for index, frame in enumerate(iter_frames(spec, conditions)):
        if index == frame_index:
            final = frame
            break
    assert final is not None
    noise = _rng("preview", spec.prompt, spec.seed, completed_steps).integers(
        0, 256, size=final.shape, dtype=np.uint8)
    weight = completed_steps / max(total_steps, 1)
    return np.rint(weight * final + (1 - weight) * noise).astype(np.uint8)


def render_audio(prompt: str, seed: int, samples: int, sample_rate: int,
                 conditions: Conditions) -> np.ndarray:
    """Channel-major float32 [2, samples] soundtrack: seeded tones + reference audio."""
    rng = _rng("audio", prompt, seed)
    t = np.arange(samples, dtype=np.float64) / sample_rate
    pcm = np.empty((AUDIO_CHANNELS, samples), dtype=np.float32)
    for channel in range(AUDIO_CHANNELS):
        low, high = rng.uniform(180.0, 900.0, size=2)
        wobble = rng.uniform(0.5, 3.0)
        pcm[channel] = (0.18 * np.sin(2 * np.pi * low * t)
                        + 0.12 * np.sin(2 * np.pi * high * t) * np.sin(np.pi * wobble * t) ** 2)
    for clip in conditions.reference_audio:
        if clip.shape[1] == 0:
            continue
        repeats = -(-samples // clip.shape[1])
        repeated = np.tile(clip, (1, repeats))[:, :samples]   # loops the clip
        pcm = 0.5 * pcm + 0.5 * repeated.astype(np.float32)
    return pcm
