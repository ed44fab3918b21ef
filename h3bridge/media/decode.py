"""Media reading with PyAV and numpy: engine PPM frames, MP4 audio, and input probing.

Frames come from h3's `--frames-dir` (main.c `cli_frame`: binary P6, maxval 255,
`frame-%04d.ppm`, 0-based). They are read straight into one preallocated array and
each file is deleted as soon as it is read, so a clip never exists twice in memory
or twice on disk.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from ..errors import MediaError
from ..geometry import FPS, MAX_FRAMES, SAMPLE_RATE

PPM_NAME = "frame-{index:04d}.ppm"   # main.c cli_frame: "%s/frame-%04d.ppm"


# ----------------------------------------------------------------------------- read failures

_REEXPORT = "open it in a player to check it, then export it again (e.g. `ffmpeg -i FILE fixed.mp4`, or save the " \
            "image again as PNG), or use another file"


def media_read_error(path: Path | str, error: BaseException) -> MediaError:
    """A MediaError saying in plain words why `path` could not be read as media, with the fix,
    instead of PyAV's raw text ("[Errno 1094995529] Invalid data found when processing input")."""
    reason, fix = _explain_read_failure(error)
    return MediaError(f"{path} {reason}", hint=fix)


def _explain_read_failure(error: BaseException) -> tuple[str, str]:
    """(what is wrong, as a phrase following the file name; the fix)."""
    if isinstance(error, FileNotFoundError):          # av.error.FileNotFoundError is one too
        return "does not exist", "check the path"
    if isinstance(error, IsADirectoryError):
        return "is a folder, not a file", "give the path of a file"
    if isinstance(error, PermissionError):
        return "cannot be opened: permission denied", "make it readable (`chmod u+r FILE`) or copy it somewhere readable"
    if isinstance(error, av.error.InvalidDataError):
        return ("is damaged or is not a picture, video or sound file: FFmpeg found no media it can read in it "
                "(a file cut short, or another kind of file under a media name)"), _REEXPORT
    if isinstance(error, av.error.EOFError):
        return "ends before its first complete picture or sound: the file is cut short", \
               "download or copy it again, or export it again"
    if isinstance(error, (av.error.DecoderNotFoundError, av.error.DemuxerNotFoundError, av.error.PatchWelcomeError)):
        return "uses a format or codec FFmpeg cannot decode", \
               "convert it to a common format (H.264 MP4 for video, PNG or JPEG for images, WAV for sound)"
    if isinstance(error, av.FFmpegError):
        words = (error.strerror or "unknown error").rstrip(".")
        return f"could not be read as media (FFmpeg: {words[:1].lower() + words[1:]})", _REEXPORT
    if isinstance(error, ValueError):
        # PyAV's resampler refuses a frame whose format changed mid-stream.
        return "changes its audio format partway through, which cannot be read as one soundtrack", \
               "export the audio again as one WAV file"
    if isinstance(error, OSError):
        return f"cannot be read: {error.strerror or error}", "check the file and the disk it is on"
    return f"could not be read as media ({type(error).__name__}: {error})", _REEXPORT


# ----------------------------------------------------------------------------- PPM frames

def _read_ppm_header(handle) -> tuple[int, int, int]:
    """Parse a binary PPM header (P6, whitespace separated, `#` comments); return (w, h, maxval)."""
    tokens: list[bytes] = []
    token = b""
    while len(tokens) < 4:
        char = handle.read(1)
        if not char:
            raise MediaError("truncated PPM header")
        if char == b"#" and not token:
            while char not in (b"\n", b""):
                char = handle.read(1)
            continue
        if char.isspace():
            if token:
                tokens.append(token)
                token = b""
            continue
        token += char
    if tokens[0] != b"P6":
        raise MediaError(f"not a binary PPM (magic {tokens[0]!r})")
    try:
        width, height, maxval = (int(t) for t in tokens[1:])
    except ValueError:
        raise MediaError("malformed PPM header") from None
    return width, height, maxval


def read_ppm_into(path: Path, out: np.ndarray) -> None:
    """Read one P6 frame directly into `out` (uint8 [H, W, 3], C-contiguous), no extra copy."""
    try:
        _read_ppm_into(path, out)
    except OSError as error:
        raise MediaError(f"cannot read the frame {path}: {error.strerror or error}",
                         hint="the engine's frame output is incomplete; see its log") from None


def _read_ppm_into(path: Path, out: np.ndarray) -> None:
    with open(path, "rb") as handle:
        width, height, maxval = _read_ppm_header(handle)
        if (height, width, 3) != out.shape or maxval != 255:
            raise MediaError(f"{path.name}: {width}x{height} maxval {maxval}, expected "
                             f"{out.shape[1]}x{out.shape[0]} maxval 255")
        view = memoryview(out).cast("B")
        filled = 0
        while filled < len(view):
            count = handle.readinto(view[filled:])
            if not count:
                raise MediaError(f"{path.name}: truncated pixel data ({filled} of {len(view)} bytes)")
            filled += count


def read_frames_dir(directory: Path, frame_count: int, width: int, height: int,
                    *, delete: bool = True) -> np.ndarray:
    """Read `frame-0000.ppm` ... into ONE preallocated uint8 [F, H, W, 3] array.

    With `delete`, each PPM is removed right after it is read, so the frames never
    exist as two full copies (disk + memory) at once.
    """
    present = sorted(p.name for p in directory.glob("frame-*.ppm"))
    expected = [PPM_NAME.format(index=i) for i in range(frame_count)]
    if present != expected:
        raise MediaError(f"the engine wrote {len(present)} frames to {directory}, expected {frame_count}",
                         hint="the engine's frame output is incomplete; see its log")
    frames = np.empty((frame_count, height, width, 3), dtype=np.uint8)
    for index, name in enumerate(expected):
        path = directory / name
        read_ppm_into(path, frames[index])
        if delete:
            path.unlink()
    return frames


# ----------------------------------------------------------------------------- MP4 frames

def decode_video_frames(path: Path, frame_count: int, width: int, height: int) -> np.ndarray:
    """Decode the first video stream of `path` into ONE preallocated uint8 [F, H, W, 3] RGB array.

    For engines that cannot hand over raw frames (h3's interactive session ignores
    `--frames-dir`, h3_cli.c `generate`): these are the H.264-compressed frames, not the
    engine's exact RGB. The stream must hold exactly `frame_count` frames of `width`x`height`.
    """
    frames = np.empty((frame_count, height, width, 3), dtype=np.uint8)
    decoded = 0
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"{path} has no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if decoded >= frame_count:
                    decoded += 1
                    break
                if (frame.width, frame.height) != (width, height):
                    raise MediaError(f"{path} is {frame.width}x{frame.height}, expected {width}x{height}")
                frames[decoded] = frame.to_ndarray(format="rgb24")
                decoded += 1
    except (av.FFmpegError, OSError) as error:
        raise media_read_error(path, error) from None
    if decoded != frame_count:
        raise MediaError(f"{path} holds {'more than ' if decoded > frame_count else ''}"
                         f"{min(decoded, frame_count)} frames, expected {frame_count}",
                         hint="the engine's MP4 is incomplete; see its log")
    return frames


def decode_frames_at(path: Path, indices: list[int]) -> list[np.ndarray]:
    """Only the frames at `indices` (0-based, ascending) of `path`'s first video stream, as uint8
    [H, W, 3] RGB; the others are decoded and dropped, so a long clip never sits in memory whole
    (a contact sheet wants four frames of each take)."""
    wanted = sorted(set(indices))
    found: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"{path} has no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for number, frame in enumerate(container.decode(stream)):
                if len(found) == len(wanted):
                    break
                if number == wanted[len(found)]:
                    found.append(frame.to_ndarray(format="rgb24"))
    except (av.FFmpegError, OSError) as error:
        raise media_read_error(path, error) from None
    if len(found) != len(wanted):
        raise MediaError(f"{path} holds fewer than {wanted[-1] + 1} frames", hint="the engine's MP4 is incomplete; see its log")
    return found


# ----------------------------------------------------------------------------- audio

def decode_audio(path: Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Decode the first audio stream of `path` as float32 [channels, samples] at `sample_rate`."""
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise MediaError(f"{path} has no audio stream")
            stream = container.streams.audio[0]
            layout = stream.layout.name if stream.layout else "stereo"
            resampler = av.AudioResampler(format="fltp", layout=layout, rate=sample_rate)
            chunks: list[np.ndarray] = []
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray())
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray())
            # Read while the container is open: after close, the stream's fields are freed
            # memory (reading them returned garbage, now and then a zero duration).
            declared = _seconds(stream.duration, stream.time_base)
            channels = stream.channels or 2
    except (av.FFmpegError, OSError, ValueError) as error:
        # ValueError: PyAV's resampler refuses a frame whose format changed mid-stream.
        raise media_read_error(path, error) from None
    if not chunks:
        return np.zeros((channels, 0), dtype=np.float32)
    audio = np.concatenate(chunks, axis=1)
    # AAC pads its last 1024-sample frame; the container's stream duration is the real
    # length (h3 writes exactly its waveform's samples), so trim the padding off.
    if declared is not None:
        audio = audio[:, :max(0, round(declared * sample_rate))]
    return np.ascontiguousarray(audio, dtype=np.float32)


# ----------------------------------------------------------------------------- probing

@dataclass(frozen=True)
class MediaInfo:
    """What request validation needs to know about an input file."""

    has_video: bool
    has_audio: bool
    width: int | None
    height: int | None
    frames_at_24fps: int | None     # video length resampled to 24 fps (FFmpeg `fps=24`), None for no video
    audio_samples: int | None       # audio length in 32 kHz samples, None for no audio (capped, see probe_media)


# The largest picture an input may hold, in pixels: 4096x4096 (16.8 megapixels), twice on each
# side the most h3 ever reads of one (a 2048-pixel short edge, `--ref-image-size max`; anchors and
# other references are scaled to the <= 1344-pixel canvas). Checking a picture decodes it, twice
# (FFmpeg decodes one while it opens the file, in avformat_find_stream_info): a 0.7 MiB PNG
# declaring 16000x16000 cost 737 MiB, one of 8192x8192 387 MiB, one of 4096x4096 100 MiB.
# FFmpeg's own `max_pixels` option makes its decoders refuse a larger picture from its header,
# before a byte of it is allocated.
MAX_INPUT_SIDE = 4096
MAX_INPUT_PIXELS = MAX_INPUT_SIDE * MAX_INPUT_SIDE
_MAX_PIXELS_OPTION = {"max_pixels": str(MAX_INPUT_PIXELS)}
_SCALE_DOWN = (f"scale it down first, e.g. `ffmpeg -i FILE -vf scale={MAX_INPUT_SIDE}:{MAX_INPUT_SIDE}:"
               f"force_original_aspect_ratio=decrease "
               f"smaller.png` (or smaller.mp4 for a video)")


def _open_input(path: Path) -> "av.container.InputContainer":
    """`path` opened for reading, its decoders (the one FFmpeg runs while opening it, too) refusing
    any picture over MAX_INPUT_PIXELS."""
    return av.open(str(path), options=_MAX_PIXELS_OPTION)


_DECLARED_SIZE = re.compile(r"Picture size (\d+)x(\d+) exceeds")
_log_capture = threading.Lock()      # FFmpeg's log level is process-wide: one capture at a time


def _declared_picture_size(path: Path) -> tuple[int, int] | None:
    """The size a picture FFmpeg refused under max_pixels declares, from FFmpeg's own message
    ("Picture size WxH exceeds specified max pixel count", libavutil/imgutils.c), read by
    opening the file once more with FFmpeg's errors captured (cheap: the picture is refused
    from its header). None when FFmpeg said no such thing."""
    import av.logging
    with _log_capture:
        previous, skipped = av.logging.get_level(), av.logging.get_skip_repeated()
        av.logging.set_level(av.logging.ERROR)
        av.logging.set_skip_repeated(False)     # PyAV drops a message repeating the last one
        try:
            with av.logging.Capture(local=True) as logs:
                try:
                    with _open_input(path):
                        pass
                except (av.FFmpegError, OSError, ValueError):
                    pass
        finally:
            av.logging.set_skip_repeated(skipped)
            av.logging.set_level(previous)
    for _level, _name, message in logs:
        match = _DECLARED_SIZE.search(message)
        if match:
            return int(match[1]), int(match[2])
    return None


def _picture_too_large(path: Path) -> MediaError | None:
    """The MediaError for an input whose picture is over MAX_INPUT_PIXELS, or None when that is not
    why FFmpeg refused it."""
    size = _declared_picture_size(path)
    if size is None:
        return None
    width, height = size
    return MediaError(f"{path} holds a picture of {width}x{height} pixels ({width * height / 1e6:.1f} megapixels); "
                      f"inputs may hold at most {MAX_INPUT_PIXELS / 1e6:.1f} megapixels ({MAX_INPUT_SIDE}x{MAX_INPUT_SIDE}): h3 "
                      f"never reads more than a 2048-pixel short edge of one", hint=_SCALE_DOWN)


def _seconds(value: int | None, time_base: Fraction | None) -> float | None:
    if value is None or time_base is None:
        return None
    return float(value * time_base)


def probe_media(path: Path, *, audio_cap_samples: int = SAMPLE_RATE * 16) -> MediaInfo:
    """Open `path` with PyAV and measure it as h3's FFmpeg reads would.

    The first video frame is decoded (proves the file is real media). Video length at
    24 fps comes from the video packets' time span, as FFmpeg's `fps=24` filter (h3_ffmpeg.c
    `h3_ffmpeg_read_video_f32`) emits about duration*24 frames (see _frames_at_24fps). Audio is decoded and
    resampled to 32 kHz like `h3_ffmpeg_read_audio_f32`, stopping once `audio_cap_samples`
    is passed (anything that long is over every limit anyway). A picture over MAX_INPUT_PIXELS
    is refused from its header, never decoded.
    """
    try:
        return _probe_open_media(path, audio_cap_samples)
    except MediaError:
        raise
    except av.error.ArgumentError as error:     # EINVAL: what a decoder's max_pixels refusal returns
        raise _picture_too_large(path) or media_read_error(path, error) from None
    except (av.FFmpegError, OSError, ValueError) as error:
        # Damaged input fails anywhere: opening, decoding the first frame, seeking, or (ValueError)
        # PyAV's resampler meeting a frame whose format changed mid-stream.
        raise media_read_error(path, error) from None


def _frames_at_24fps(path: Path) -> int:
    """How many frames FFmpeg's `fps=24` filter makes of the first video stream, as h3 counts
    them (h3_ffmpeg.c `h3_ffmpeg_read_video_f32` keeps what it receives): the span from the first
    packet's time (or the container's start, see below) to the end of the last, read from the
    packets (demuxed, not decoded). Stream
    and container metadata are not trusted: live WebM recordings have none, Matroska often has
    only the container's, which can be the audio's, and a single still frame can last seconds.
    Stops once past h3's longest clip (MAX_FRAMES), since h3 reads no further."""
    with _open_input(path) as container:
        video = container.streams.video[0]
        time_base = video.time_base
        start = end = None
        limit = None if time_base is None else (MAX_FRAMES + 1) / FPS / time_base
        for packet in container.demux(video):
            if packet.pts is None:
                continue
            stop = packet.pts + (packet.duration or 0)
            start = packet.pts if start is None else min(start, packet.pts)
            end = stop if end is None else max(end, stop)
            if limit is not None and end - start > limit:
                break
        if start is None or end is None or time_base is None:
            # No timestamps at all (a raw elementary stream): FFmpeg makes them up; use what is declared.
            seconds = _seconds(video.duration, video.time_base)
            return max(1, int(seconds * FPS + 0.5)) if seconds else max(1, video.frames or 1)
        # FFmpeg's CLI shifts every stream by the container's start time and, writing constant-rate
        # raw video, repeats the first frame back to that origin: a video that starts 23 ms after
        # its audio still yields frames from time 0.
        origin = container.start_time / av.time_base if container.start_time is not None else start * time_base
        return max(1, int(float(end * time_base - origin) * FPS + 0.5))


def _probe_open_media(path: Path, audio_cap_samples: int) -> MediaInfo:
    with _open_input(path) as container:
        video = container.streams.video[0] if container.streams.video else None
        audio = container.streams.audio[0] if container.streams.audio else None
        width = height = frames24 = samples = None
        if video is not None:
            # av.open's options reached only the decoder FFmpeg ran while opening; this one too.
            if video.codec_context is not None:      # None: no decoder for it (decode() then says so)
                video.codec_context.options = dict(_MAX_PIXELS_OPTION)
            first = next(container.decode(video), None)
            if first is None:
                raise MediaError(f"{path} has a video stream but not one picture that can be decoded "
                                 "(damaged, or cut short)", hint=_REEXPORT)
            width, height = first.width, first.height
            del first                    # before _frames_at_24fps opens the file again
            frames24 = _frames_at_24fps(path)
        if audio is not None:
            container.seek(0)
            resampler = av.AudioResampler(format="flt", layout="stereo", rate=SAMPLE_RATE)
            samples = 0
            for frame in container.decode(audio):
                for out in resampler.resample(frame):
                    samples += out.samples
                if samples > audio_cap_samples:
                    break
            else:
                for out in resampler.resample(None):
                    samples += out.samples
    return MediaInfo(has_video=video is not None, has_audio=audio is not None, width=width, height=height,
                     frames_at_24fps=frames24, audio_samples=samples)


def remove_quietly(path: Path | str | None) -> None:
    """Delete a file we created, ignoring that it may already be gone.

    Runs in cleanup paths (`finally`), so a failure to delete never replaces the error
    that is being reported."""
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass
