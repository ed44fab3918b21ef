"""Joining a story's shots into one film, streamed: one shot's audio and one frame at a time.

Each shot's MP4 (the engine's H.264) is decoded frame by frame and encoded once into the film;
nothing holds more than one shot's soundtrack and one decoded frame (plus the encoder's own
look-ahead), whatever the story's length. At an `anchor` join the next shot's first frame
repeats the last one and is dropped. The soundtracks are laid on the film's timeline (sample
n = frame n / 24 s at 32 kHz), and each join gets a short crossfade centred on it: where a shot
has no sound of its own beyond its edge, its sound is mirrored there, so the fade never dips to
silence and never jumps. Chapters (one per shot) go into the MP4.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import av
import numpy as np

from ..cancel import CancelToken
from ..errors import GenerationCancelled, MediaError
from ..geometry import FPS, SAMPLE_RATE
from ..media.decode import decode_audio, media_read_error
from .mp4 import Mp4Writer


@dataclass(frozen=True)
class FilmPiece:
    """One shot as the film uses it."""

    index: int
    video: Path               # the shot's MP4
    frame_count: int          # frames in the shot's MP4
    dropped: int              # leading frames not used (1 after an anchor join)
    crossfade_before: int     # samples of audio crossfade at the join before this shot (0: hard join)
    title: str

    @property
    def kept(self) -> int:
        return self.frame_count - self.dropped


@dataclass(frozen=True)
class FilmChunk:
    """What `iter_film` yields: one frame, or some audio, of shot `shot`."""

    shot: int
    frame: np.ndarray | None = None       # uint8 [H, W, 3]
    audio: np.ndarray | None = None       # float32 [2, n]


@dataclass
class FilmResult:
    path: Path | None
    frames: int
    samples: int
    chapters: list[tuple[int, int, str]]    # (first frame, end frame, title) per shot


def sample_at(frame: int) -> int:
    """The film's audio sample at which frame `frame` starts."""
    return frame * SAMPLE_RATE // FPS


def crossfade_samples(frames: int) -> int:
    return sample_at(frames)


def _take(audio: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Samples [start, stop) of a shot's audio; outside the audio, its sound mirrored at the edge."""
    length = audio.shape[1]
    if length == 0:
        return np.zeros((2, stop - start), np.float32)
    positions = np.arange(start, stop)
    period = 2 * length
    folded = np.mod(positions, period)
    folded = np.where(folded >= length, period - 1 - folded, folded)
    return audio[:, folded]


def _fade(outgoing: np.ndarray, incoming: np.ndarray) -> np.ndarray:
    width = outgoing.shape[1]
    weight = (0.5 - 0.5 * np.cos(np.pi * (np.arange(width) + 0.5) / width)).astype(np.float32)
    return outgoing * (1.0 - weight) + incoming * weight


def _iter_frames(piece: FilmPiece) -> Iterator[np.ndarray]:
    decoded = 0
    try:
        with av.open(str(piece.video)) as container:
            if not container.streams.video:
                raise MediaError(f"{piece.video} has no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                decoded += 1
                if decoded > piece.dropped and decoded <= piece.frame_count:
                    yield frame.to_ndarray(format="rgb24")
    except (av.FFmpegError, OSError) as error:
        raise media_read_error(piece.video, error) from None
    if decoded != piece.frame_count:
        raise MediaError(f"shot {piece.index}: {piece.video} holds {decoded} frames, the manifest says "
                         f"{piece.frame_count}", hint="run the story again: the shot is checked and redone")


def iter_film(pieces: list[FilmPiece], cancel: CancelToken | None = None) -> Iterator[FilmChunk]:
    """The film as a stream of frames and audio chunks, shot after shot."""
    start_frame = 0
    held: tuple[np.ndarray, int, int] | None = None    # outgoing audio of the join ahead, its start, width
    for number, piece in enumerate(pieces):
        audio = decode_audio(piece.video)
        if audio.shape[0] == 1:
            audio = np.repeat(audio, 2, axis=0)
        begin, end = sample_at(start_frame), sample_at(start_frame + piece.kept)
        offset = sample_at(piece.dropped) - begin          # shot-local sample = film sample + offset
        following = pieces[number + 1] if number + 1 < len(pieces) else None
        half_before = held[2] // 2 if held is not None else 0
        half_after = 0
        if following is not None:
            limit = min(end - begin, sample_at(following.kept)) // 2
            half_after = min(following.crossfade_before // 2, limit)
        if held is not None:
            outgoing, window_start, width = held
            incoming = _take(audio, window_start + offset, window_start + width + offset)
            yield FilmChunk(piece.index, audio=_fade(outgoing, incoming))
        plain_start, plain_stop = begin + half_before, end - half_after
        yield FilmChunk(piece.index, audio=_take(audio, plain_start + offset, plain_stop + offset))
        held = None
        if following is not None and half_after:
            held = (_take(audio, end - half_after + offset, end + half_after + offset), end - half_after,
                    2 * half_after)
        del audio
        for frame in _iter_frames(piece):
            if cancel is not None and cancel.cancelled:
                raise GenerationCancelled("the film's assembly was cancelled; run the story again to finish it")
            yield FilmChunk(piece.index, frame=frame)
        start_frame += piece.kept


def film_arrays(pieces: list[FilmPiece], width: int, height: int, *, want_frames: bool = True,
                cancel: CancelToken | None = None) -> tuple[np.ndarray | None, np.ndarray]:
    """The film as arrays, streamed from the shots into one preallocated array each (no second
    copy): frames uint8 [F, H, W, 3] (None unless `want_frames`), audio float32 [2, samples]."""
    total = sum(piece.kept for piece in pieces)
    frames = np.empty((total, height, width, 3), np.uint8) if want_frames else None
    audio = np.empty((2, sample_at(total)), np.float32)
    frame_at = sample = 0
    for chunk in iter_film(pieces, cancel):
        if chunk.audio is not None:
            audio[:, sample:sample + chunk.audio.shape[1]] = chunk.audio
            sample += chunk.audio.shape[1]
        elif frames is not None and chunk.frame is not None:
            frames[frame_at] = chunk.frame
            frame_at += 1
        elif chunk.frame is not None:
            frame_at += 1
    return frames, audio


def film_chapters(pieces: list[FilmPiece]) -> list[tuple[int, int, str]]:
    chapters, start = [], 0
    for piece in pieces:
        chapters.append((start, start + piece.kept, piece.title))
        start += piece.kept
    return chapters


def assemble_film(pieces: list[FilmPiece], output: Path, width: int, height: int, *, replace: bool = False,
                  cancel: CancelToken | None = None) -> FilmResult:
    """Write the film to `output` (atomically: a temporary name, then a rename)."""
    chapters = film_chapters(pieces)
    with Mp4Writer(output, width, height) as writer:
        for chunk in iter_film(pieces, cancel):
            if chunk.frame is not None:
                writer.write_frame(chunk.frame)
            elif chunk.audio is not None:
                writer.write_audio(chunk.audio)
        for first, end, title in chapters:
            writer.add_chapter(first, end, title)
        frames, samples = writer.frames_written, writer.samples_written
        writer.publish(replace=replace)
        if not writer.chapters_embedded:
            write_chapters_file(output, chapters)
    return FilmResult(output, frames, samples, chapters)


def chapters_file(output: Path) -> Path:
    return output.with_name(output.name + ".chapters.txt")


def write_chapters_file(output: Path, chapters: list[tuple[int, int, str]]) -> Path:
    """FILM.mp4.chapters.txt in FFmpeg's FFMETADATA form (`ffmpeg -i FILM.mp4 -i FILE -map_metadata 1
    -codec copy OUT.mp4` embeds it), for a PyAV that cannot write chapters itself."""
    from .jobdir import write_atomically
    lines = [";FFMETADATA1"]
    for first, end, title in chapters:
        escaped = "".join("\\" + c if c in "=;#\\\n" else c for c in title)
        lines += ["[CHAPTER]", f"TIMEBASE=1/{FPS}", f"START={first}", f"END={end}", f"title={escaped}"]
    path = chapters_file(output)
    write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))
    return path


def chapter_title(index: int, prompt: str) -> str:
    text = " ".join(prompt.split())
    return f"Shot {index}: {text[:60]}{'...' if len(text) > 60 else ''}"


__all__ = ["FilmChunk", "FilmPiece", "FilmResult", "assemble_film", "chapter_title", "crossfade_samples",
           "film_arrays", "film_chapters", "iter_film", "sample_at"]
