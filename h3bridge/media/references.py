"""In-memory media -> files h3 can read: PNG anchors/reference images, WAV audio, MP4 video.

Hosts such as ComfyUI hold images and audio as arrays; h3 only takes paths
(main.c `--first-frame`, `--ref-image`, `--ref-audio`, ...). This module writes
those arrays with PyAV into a per-run directory, and keeps an ordered,
limit-checked list of references (`ReferenceList`) that hosts build up
piece by piece before anything is written.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import av
import numpy as np

from ..errors import MediaError, RequestError
from .decode import probe_media
from ..request import Reference, ReferenceKind, check_reference_limits

# ----------------------------------------------------------------------------- arrays

def image_to_uint8(image: np.ndarray) -> np.ndarray:
    """One RGB picture as uint8 [H, W, 3] from a float 0..1 or uint8 array.

    Accepts [H, W, C] or a batch [B, H, W, C] (first picture used), C in 1, 3 or 4
    (grey is repeated, alpha dropped).
    """
    array = np.asarray(image)
    if array.ndim == 4:
        if array.shape[0] < 1:
            raise MediaError("the image batch is empty")
        array = array[0]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4) or array.shape[0] < 1 or array.shape[1] < 1:
        raise MediaError(f"expected an image shaped [H, W, 3], got {list(np.shape(image))}")
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    array = array[:, :, :3]
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    scaled = np.clip(array.astype(np.float32, copy=False), 0.0, 1.0) * 255.0
    return np.ascontiguousarray(np.rint(scaled).astype(np.uint8))


# FFmpeg's usual layout for each channel count (channels in the order WAV and ComfyUI's LoadAudio
# keep them). Surround is written as it is: h3 reads references with `-ac 2` (h3_ffmpeg.c), so
# FFmpeg's own downmix keeps the centre channel, where dialogue usually is.
CHANNEL_LAYOUTS = {1: "mono", 2: "stereo", 3: "2.1", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}


@dataclass(frozen=True, eq=False)
class AudioClip:
    """PCM audio: float32 [channels, samples] in -1..1 at `sample_rate` Hz."""

    waveform: np.ndarray
    sample_rate: int

    def __post_init__(self) -> None:
        if self.waveform.ndim != 2 or self.waveform.shape[0] not in CHANNEL_LAYOUTS:
            raise MediaError(f"expected audio shaped [channels (1..8), samples], got {list(self.waveform.shape)}")
        if self.sample_rate <= 0:
            raise MediaError(f"audio sample rate must be positive, got {self.sample_rate}")

    @property
    def seconds(self) -> float:
        return self.waveform.shape[1] / self.sample_rate


# ----------------------------------------------------------------------------- writers

def write_png(image: np.ndarray, path: Path) -> Path:
    """Write one picture as an RGB PNG through PyAV's png encoder."""
    pixels = image_to_uint8(image)
    height, width = pixels.shape[:2]
    try:
        with av.open(str(path), mode="w", format="image2") as container:
            stream = container.add_stream("png")
            stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
    except (av.FFmpegError, OSError) as error:
        raise MediaError(f"cannot write {path}: {error}") from None
    return path


def write_wav(clip: AudioClip, path: Path) -> Path:
    """Write 16-bit PCM WAV at the clip's own rate (h3's FFmpeg resamples to 32 kHz itself)."""
    layout = CHANNEL_LAYOUTS[clip.waveform.shape[0]]
    planar = np.ascontiguousarray(np.clip(clip.waveform, -1.0, 1.0).astype(np.float32, copy=False))
    try:
        with av.open(str(path), mode="w", format="wav") as container:
            stream = container.add_stream("pcm_s16le", rate=clip.sample_rate, layout=layout)
            resampler = av.AudioResampler(format="s16", layout=layout, rate=clip.sample_rate)
            # 1 s chunks keep frame sizes bounded for long clips.
            for start in range(0, max(planar.shape[1], 1), clip.sample_rate):
                chunk = planar[:, start:start + clip.sample_rate]
                if chunk.shape[1] == 0:
                    break
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout=layout)
                frame.sample_rate = clip.sample_rate
                for converted in resampler.resample(frame):
                    for packet in stream.encode(converted):
                        container.mux(packet)
            for converted in resampler.resample(None):
                for packet in stream.encode(converted):
                    container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
    except (av.FFmpegError, OSError) as error:
        raise MediaError(f"cannot write {path}: {error}") from None
    return path


# ----------------------------------------------------------------------------- references

VideoWriter = Callable[[Path], None]


@dataclass(frozen=True, eq=False)
class VideoSource:
    """A video the host can write to a path on demand (ComfyUI: `VideoInput.save_to`)."""

    write: VideoWriter
    description: str = "video"

    @classmethod
    def from_file(cls, path: Path) -> "VideoSource":
        source = Path(path)

        def copy(target: Path) -> None:
            try:
                shutil.copyfile(source, target)
            except OSError as error:
                raise MediaError(f"cannot copy reference video {source}: {error}") from None

        return cls(write=copy, description=str(source))


@dataclass(frozen=True, eq=False)
class ReferenceItem:
    """One ordered reference before it becomes files."""

    kind: ReferenceKind
    image: np.ndarray | None = None       # IMAGE
    video: VideoSource | None = None      # VIDEO, SILENT_VIDEO, VIDEO_AUDIO
    audio: AudioClip | None = None        # AUDIO, VIDEO_AUDIO (the replacement soundtrack)

    def __post_init__(self) -> None:
        needs = {
            ReferenceKind.IMAGE: ("image",),
            ReferenceKind.VIDEO: ("video",),
            ReferenceKind.SILENT_VIDEO: ("video",),
            ReferenceKind.VIDEO_AUDIO: ("video", "audio"),
            ReferenceKind.AUDIO: ("audio",),
        }[self.kind]
        for name in ("image", "video", "audio"):
            present = getattr(self, name) is not None
            if name in needs and not present:
                raise RequestError(f"a {describe_kind(self.kind)} reference needs its {name} input",
                                   field="references", hint=f"connect the {name} input")
            if name not in needs and present:
                raise RequestError(f"a {describe_kind(self.kind)} reference does not use the {name} input",
                                   field="references",
                                   hint=f"disconnect {name}, or pick the kind that uses it")


def describe_kind(kind: ReferenceKind) -> str:
    return {
        ReferenceKind.IMAGE: "image",
        ReferenceKind.VIDEO: "video with its audio",
        ReferenceKind.SILENT_VIDEO: "video",
        ReferenceKind.VIDEO_AUDIO: "video plus replacement audio",
        ReferenceKind.AUDIO: "audio",
    }[kind]


@dataclass(frozen=True)
class ReferenceList:
    """An ordered, immutable list of references; order is the order h3 receives them."""

    items: tuple[ReferenceItem, ...] = ()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[ReferenceItem]:
        return iter(self.items)

    def appended(self, item: ReferenceItem) -> "ReferenceList":
        """A new list with `item` last; raises RequestError if that breaks a limit."""
        check_reference_limits([i.kind for i in self.items] + [item.kind], complete=False)
        return ReferenceList(self.items + (item,))

    def describe(self) -> str:
        return ", ".join(f"{index}. {describe_kind(item.kind)}" for index, item in enumerate(self.items, 1))


def materialise_references(references: ReferenceList, directory: Path) -> tuple[Reference, ...]:
    """Write every reference into `directory` and return them as request References, in order.

    Checks the list as a whole first (limits, audio needing a picture or video), and that a
    'video with its audio' really carries a soundtrack, so a mistake is reported before the
    engine starts.
    """
    check_reference_limits([item.kind for item in references])
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Reference] = []
    for index, item in enumerate(references, 1):
        stem = directory / f"ref-{index:02d}"
        if item.kind is ReferenceKind.IMAGE:
            assert item.image is not None
            written.append(Reference(item.kind, write_png(item.image, stem.with_suffix(".png"))))
        elif item.kind is ReferenceKind.AUDIO:
            assert item.audio is not None
            written.append(Reference(item.kind, write_wav(item.audio, stem.with_suffix(".wav"))))
        else:
            assert item.video is not None
            video_path = stem.with_suffix(".mp4")
            item.video.write(video_path)
            info = probe_media(video_path)
            if not info.has_video:
                raise MediaError(f"reference {index} ({item.video.description}) has no video stream")
            if item.kind is ReferenceKind.VIDEO and not info.has_audio:
                raise MediaError(f"reference {index} ({item.video.description}) is a 'video with its audio' "
                                 "but has no audio stream",
                                 hint="pick kind 'video', or 'video plus replacement audio' with an audio input")
            audio_path = None
            if item.kind is ReferenceKind.VIDEO_AUDIO:
                assert item.audio is not None
                audio_path = write_wav(item.audio, directory / f"ref-{index:02d}-audio.wav")
            written.append(Reference(item.kind, video_path, audio_path))
    return tuple(written)


class RunDirectory:
    """A private scratch directory for one generation's input files, removed afterwards."""

    def __init__(self, parent: Path, prefix: str = "h3-run-") -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc_info: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


__all__ = [
    "AudioClip", "ReferenceItem", "ReferenceList", "RunDirectory", "VideoSource",
    "describe_kind", "image_to_uint8", "materialise_references",
    "write_png", "write_wav",
]
