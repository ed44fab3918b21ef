"""Writing H.264 + AAC MP4s with PyAV, one frame and one audio chunk at a time.

Used for the tail reference a `tail` shot conditions on, the stand-in files the plan validates
with, and the assembled film. The file appears only when complete: it is written under a
temporary name beside the target and given its name by `publish` (safeio.outputs: fsynced, never
over anything but a regular file, and over that only when replacing is allowed).
"""
from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Sequence

import av
import numpy as np

from ..errors import MediaError
from ..geometry import FPS, SAMPLE_RATE
from ..media.decode import remove_quietly
from ..safeio.outputs import ALLOW_OVERWRITE, publish, staging_path

FILM_CRF = 18            # H.264 quality of the assembled film (visually lossless at H3's sizes)
REFERENCE_CRF = 0        # the tail reference: as close to the engine's frames as H.264 gets
AUDIO_BIT_RATE = 192_000
# libx264's macroblock tree (its lookahead's look at how each block is referenced) reads heap
# memory it never wrote on small canvases: the same frames then encode to different pixels
# depending on what the process's allocator left there (the same film differed from run to run,
# and a parallel story's film from the serial one). Without it the encoder's output depends on its
# input alone (tests/test_story_film.py runs it under different glibc heap fillings); it costs a
# little compression at the film's CRF 18 and nothing at the reference's lossless CRF 0.
X264_PARAMS = "mbtree=0"


class Mp4Writer:
    """An H.264 (+ AAC) MP4 written under a temporary name; `publish()` renames it into place.

    Use as a context manager: leaving the block without `publish()` removes the partial file."""

    def __init__(self, path: str | os.PathLike[str], width: int, height: int, *, audio: bool = True,
                 crf: int = FILM_CRF, fps: int = FPS, sample_rate: int = SAMPLE_RATE) -> None:
        self.path = Path(path)
        self.temporary = staging_path(self.path)      # beside it: the rename is atomic
        self.sample_rate = sample_rate
        self.frames_written = 0
        self.samples_written = 0
        self._chapters: list[dict] = []
        try:
            self._container = av.open(str(self.temporary), mode="w", format="mp4")
            self._video = self._container.add_stream("libx264", rate=fps)
            self._video.width, self._video.height = width, height
            self._video.pix_fmt = "yuv444p" if crf == 0 else "yuv420p"
            self._video.options = {"crf": str(crf), "x264-params": X264_PARAMS}
            self._audio = self._container.add_stream("aac", rate=sample_rate, layout="stereo",
                                                     bit_rate=AUDIO_BIT_RATE) if audio else None
        except (av.FFmpegError, OSError) as error:
            remove_quietly(self.temporary)
            raise MediaError(f"cannot write {self.path}: {error}",
                             hint="check that the folder exists, is writable and has room") from None
        self._closed = False

    def write_frame(self, rgb: np.ndarray) -> None:
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = self.frames_written
        frame.time_base = Fraction(1, FPS)
        self._mux(self._video.encode(frame))
        self.frames_written += 1

    def write_audio(self, samples: np.ndarray) -> None:
        """float32 [2, n] at the writer's sample rate; any n (the encoder reframes)."""
        if self._audio is None or samples.shape[1] == 0:
            return
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype=np.float32), format="fltp",
                                           layout="stereo")
        frame.sample_rate = self.sample_rate
        frame.pts = self.samples_written
        frame.time_base = Fraction(1, self.sample_rate)
        self._mux(self._audio.encode(frame))
        self.samples_written += samples.shape[1]

    def add_chapter(self, start_frame: int, end_frame: int, title: str) -> None:
        self._chapters.append({"id": len(self._chapters) + 1, "start": start_frame, "end": end_frame,
                               "time_base": Fraction(1, FPS), "metadata": {"title": title}})

    def _mux(self, packets: Sequence[av.Packet]) -> None:
        for packet in packets:
            self._container.mux(packet)

    def publish(self, *, replace: bool = False) -> Path:
        """Finish the file and give it its name (never over an existing file unless `replace`, and then
        only over a regular file)."""
        self._mux(self._video.encode(None))
        if self._audio is not None:
            self._mux(self._audio.encode(None))
        self.chapters_embedded = False
        if self._chapters and hasattr(self._container, "set_chapters"):     # PyAV >= 14
            self._container.set_chapters(self._chapters)
            self.chapters_embedded = True
        self._container.close()
        self._closed = True
        # OutputExistsError (a FileExistsError) when the name is taken by what may not be replaced;
        # the staged file then goes with __exit__
        publish(self.temporary, self.path, overwrite=replace, field="the output",
                allow_overwrite=ALLOW_OVERWRITE)
        return self.path

    def __enter__(self) -> "Mp4Writer":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            try:
                self._container.close()
            except (av.FFmpegError, OSError):
                pass
            self._closed = True
        remove_quietly(self.temporary)


def write_clip(path: Path, frames: Iterable[np.ndarray], width: int, height: int,
               audio: np.ndarray | None = None, *, crf: int = REFERENCE_CRF, replace: bool = False) -> Path:
    """A whole (short) clip at once: the tail reference, the plan's stand-ins."""
    with Mp4Writer(path, width, height, audio=audio is not None, crf=crf) as writer:
        for frame in frames:
            writer.write_frame(frame)
        if audio is not None:
            for start in range(0, audio.shape[1], SAMPLE_RATE):
                writer.write_audio(audio[:, start:start + SAMPLE_RATE])
        return writer.publish(replace=replace)
