"""The FFmpeg/FFprobe process boundary of upstream h3_ffmpeg.c, reproduced for h3-sim.

The simulator spawns the same programs with the same argument vectors and pipes as h3
does, so anything a caller arranges around the real engine (H3_FFMPEG / H3_FFPROBE
overrides, PATH, a missing ffmpeg, output parents) behaves the same against the sim.

- program lookup: `H3_FFMPEG` / `H3_FFPROBE` when set and non-empty, else `ffmpeg` /
  `ffprobe` through PATH with posix_spawnp (h3_ffmpeg.c:17-25); argv[0] is always the
  plain name.
- `probe_visual_size`      = h3_ffprobe_visual_size   (:74-151)
- `read_image`             = h3_ffmpeg_read_image_f32 (:153-264), STRETCH and COVER filters
- `read_video`             = h3_ffmpeg_read_video_f32 (:266-387), trimmed to 5 + 17n frames
- `read_audio`             = h3_ffmpeg_read_audio_f32 (:389-505)
- `write_av`               = h3_ffmpeg_write_av_rgb24_f32 (:613-755): make_parents (:35-54),
  raw rgb24 on stdin, f32le interleaved audio on fd max(pipe fds)+1, two writer threads,
  libx264 fast/CRF 18/yuv420p, AAC 192k, +faststart.
Every failure raises MediaFailure carrying upstream's message.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Iterable

import numpy as np

from .libc import strerror


class MediaFailure(Exception):
    """h3_ffmpeg.c's `detail` text for a failed media operation."""


FIT_STRETCH, FIT_COVER = 0, 1   # h3_image_fit


def ffmpeg_program() -> str:
    override = os.environ.get("H3_FFMPEG")
    return override if override else "ffmpeg"


def ffprobe_program() -> str:
    override = os.environ.get("H3_FFPROBE")
    return override if override else "ffprobe"


def _spawn(program: str, argv: list[str], actions: list[tuple]) -> int:
    """posix_spawnp with file actions; raises OSError(errno) like posix_spawnp's code."""
    return os.posix_spawnp(program, argv, os.environ, file_actions=actions)


def _exit_status(pid: int) -> int | None:
    """waitpid; the exit code, or None when the child did not exit normally."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else None


def _read_up_to(descriptor: int, limit: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < limit:
        try:
            data = os.read(descriptor, min(limit - len(chunks), 1 << 20))
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        chunks += data
    return bytes(chunks)


def _read_child_stdout(program: str, argv: list[str], limit: int,
                       start_error: str) -> tuple[bytes, bool, int | None]:
    """Run a decoder with stdout on a pipe; read up to `limit` bytes plus one trailing
    byte, close, wait (the read loops in h3_ffmpeg.c). Returns (data, trailing, status)."""
    read_end, write_end = os.pipe()
    try:
        pid = _spawn(program, argv, [(os.POSIX_SPAWN_DUP2, write_end, 1),
                                     (os.POSIX_SPAWN_CLOSE, read_end),
                                     (os.POSIX_SPAWN_CLOSE, write_end)])
    except OSError as error:
        os.close(read_end)
        os.close(write_end)
        raise MediaFailure(f"{start_error}: {strerror(error.errno or 0)}") from None
    os.close(write_end)
    data = _read_up_to(read_end, limit)
    trailing = bool(_read_up_to(read_end, 1))
    os.close(read_end)
    return data, trailing, _exit_status(pid)


def probe_visual_size(path: str) -> tuple[int, int]:
    if not path:
        raise MediaFailure("invalid FFprobe visual-size arguments")   # h3_ffmpeg.c:79-83
    argv = ["ffprobe", "-v", "error", "-select_streams", "v:0",
            "-show_entries", "stream=width,height", "-of", "csv=p=0:s=x", path]
    read_end, write_end = os.pipe()
    try:
        pid = _spawn(ffprobe_program(), argv, [(os.POSIX_SPAWN_DUP2, write_end, 1),
                                               (os.POSIX_SPAWN_CLOSE, read_end),
                                               (os.POSIX_SPAWN_CLOSE, write_end)])
    except OSError as error:
        os.close(read_end)
        os.close(write_end)
        raise MediaFailure(f"cannot start FFprobe: {strerror(error.errno or 0)}") from None
    os.close(write_end)
    output = bytearray()
    while True:   # upstream keeps 127 bytes and flags overflow, but drains everything
        data = os.read(read_end, 65536)
        if not data:
            break
        output += data
    os.close(read_end)
    status = _exit_status(pid)
    overflow = len(output) > 127
    text = output[:127].decode("latin-1")
    parsed = _scan_size(text)
    if overflow or status != 0 or parsed is None:
        raise MediaFailure(f"FFprobe could not inspect visual stream {path}")
    width, height, rest = parsed
    if rest.strip(" \t\r\n"):
        raise MediaFailure("FFprobe returned an invalid visual size")
    if width < 1 or height < 1:
        raise MediaFailure(f"visual stream has invalid dimensions {width}x{height}")
    return width, height


def _scan_size(text: str) -> tuple[int, int, str] | None:
    """sscanf(output, "%dx%d%n"): optional leading whitespace and sign per integer."""
    import re
    match = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)x[ \t\n\v\f\r]*([+-]?[0-9]+)", text)   # C isspace/isdigit
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), text[match.end():]


def read_image(path: str, width: int, height: int, fit: int) -> np.ndarray:
    """HxWx3 uint8 (upstream converts to channel-major float; the bytes are the same)."""
    if not path or width < 1 or height < 1 or fit not in (FIT_STRETCH, FIT_COVER):
        raise MediaFailure("invalid FFmpeg image input arguments")   # h3_ffmpeg.c:158-162
    if fit == FIT_STRETCH:
        video_filter = f"scale={width}:{height}:flags=lanczos"
    else:
        video_filter = (f"scale={width}:{height}:force_original_aspect_ratio=increase:"
                        f"flags=lanczos,crop={width}:{height}")
    argv = ["ffmpeg", "-v", "error", "-i", path, "-frames:v", "1", "-vf", video_filter,
            "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    expected = width * height * 3
    data, trailing, status = _read_child_stdout(ffmpeg_program(), argv, expected,
                                                "cannot start FFmpeg")
    if status != 0 or len(data) != expected or trailing:
        if status != 0:
            raise MediaFailure(f"FFmpeg could not decode image {path} "
                               f"(status {-1 if status is None else status})")
        received = len(data) + (1 if trailing else 0)
        raise MediaFailure(f"FFmpeg decoded {received} bytes for {width}x{height} image, "
                           f"expected {expected}")
    return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)


def read_video(path: str, width: int, height: int, max_frames: int) -> np.ndarray:
    """TxHxWx3 uint8, T trimmed down to 5 + 17n (h3_ffmpeg.c:360)."""
    argv = ["ffmpeg", "-v", "error", "-i", path, "-map", "0:v:0", "-an", "-vf",
            f"fps=24,scale={width}:{height}:flags=lanczos,setsar=1",
            "-frames:v", str(max_frames), "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    frame_bytes = width * height * 3
    data, trailing, status = _read_child_stdout(ffmpeg_program(), argv,
                                                max_frames * frame_bytes, "cannot start FFmpeg")
    if status != 0 or trailing or len(data) % frame_bytes:
        raise MediaFailure(f"FFmpeg could not decode bounded video {path}")
    count = len(data) // frame_bytes
    if count < 5:
        raise MediaFailure("reference videos require at least 5 decoded frames")
    while count % 17 != 5:
        count -= 1
    return np.frombuffer(data, dtype=np.uint8)[:count * frame_bytes].reshape(count, height, width, 3)


def read_audio(path: str, max_samples: int, truncate_at_limit: bool) -> np.ndarray:
    """Channel-major float32 [2, samples] at 32 kHz."""
    rate, channels, minimum = 32000, 2, 64000
    if max_samples < minimum or max_samples > rate * 15:
        raise MediaFailure("invalid FFmpeg audio input arguments")
    seconds = max_samples / rate
    if not truncate_at_limit:
        seconds += 1.0 / rate
    argv = ["ffmpeg", "-v", "error", "-i", path, "-map", "0:a:0", "-vn", "-ac", "2",
            "-ar", "32000", "-t", f"{seconds:.9f}", "-f", "f32le", "pipe:1"]
    data, trailing, status = _read_child_stdout(ffmpeg_program(), argv,
                                                max_samples * channels * 4, "cannot start FFmpeg")
    if not truncate_at_limit and trailing:
        raise MediaFailure("reference audio exceeds the 15 second total limit")
    if status != 0 or len(data) % (channels * 4):
        raise MediaFailure(f"FFmpeg could not decode a stereo soundtrack from {path}")
    samples = len(data) // (channels * 4)
    if samples < minimum:
        raise MediaFailure("reference audio requires at least 2 seconds at 32 kHz")
    interleaved = np.frombuffer(data, dtype="<f4").reshape(samples, channels)
    return np.ascontiguousarray(interleaved.T)


def make_parents(path: str) -> None:
    """make_parents (h3_ffmpeg.c:35-54): mkdir every '/'-terminated prefix after the first char."""
    for index in range(1, len(path)):
        if path[index] != "/":
            continue
        prefix = path[:index]
        try:
            os.mkdir(prefix, 0o755)
        except FileExistsError:
            pass
        except OSError as error:
            raise MediaFailure(f"cannot create output directory {prefix}: "
                               f"{strerror(error.errno or 0)}") from None


class _StreamWriter(threading.Thread):
    """stream_thread (h3_ffmpeg.c:586-605): write everything, then close the pipe."""

    def __init__(self, descriptor: int, chunks: Iterable[bytes]) -> None:
        super().__init__(daemon=True)
        self.descriptor = descriptor
        self.chunks = chunks
        self.errno = 0

    def run(self) -> None:
        try:
            for chunk in self.chunks:
                view = memoryview(chunk)
                while view:
                    try:
                        written = os.write(self.descriptor, view)
                    except InterruptedError:
                        continue
                    except OSError as error:
                        self.errno = error.errno or 5
                        return
                    view = view[written:]
        finally:
            os.close(self.descriptor)


def write_av(path: str, frames: Iterable[np.ndarray], frame_count: int, width: int,
             height: int, fps: int, pcm: np.ndarray, sample_rate: int) -> None:
    """Mux frames (an iterator of HxWx3 uint8, consumed once) and channel-major PCM."""
    channels, samples = pcm.shape
    if (not path or frame_count < 1 or width < 2 or height < 2 or fps < 1 or width % 2
            or height % 2 or samples < 1 or channels < 1 or sample_rate < 1):
        raise MediaFailure("invalid FFmpeg A/V output arguments")
    make_parents(path)
    interleaved = np.ascontiguousarray(pcm.T, dtype="<f4").tobytes()
    video_read, video_write = os.pipe()
    audio_read, audio_write = os.pipe()
    descriptors = (video_read, video_write, audio_read, audio_write)
    audio_target = max(descriptors) + 1
    argv = ["ffmpeg", "-y", "-loglevel", "error",
            "-f", "rawvideo", "-pixel_format", "rgb24",
            "-video_size", f"{width}x{height}", "-framerate", str(fps),
            "-i", "pipe:0",
            "-f", "f32le", "-ar", str(sample_rate), "-ac", str(channels),
            "-i", f"pipe:{audio_target}",
            "-map", "0:v:0", "-map", "1:a:0",
            "-c:v", "libx264", "-preset", "fast", "-crf", "18",
            "-pix_fmt", "yuv420p", "-c:a", "aac", "-b:a", "192k",
            "-movflags", "+faststart", path]
    actions: list[tuple] = [(os.POSIX_SPAWN_DUP2, video_read, 0),
                            (os.POSIX_SPAWN_DUP2, audio_read, audio_target)]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in descriptors if fd not in (0, audio_target)]
    try:
        pid = _spawn(ffmpeg_program(), argv, actions)
    except OSError as error:
        for fd in descriptors:
            os.close(fd)
        raise MediaFailure(f"cannot start FFmpeg: {strerror(error.errno or 0)}") from None
    os.close(video_read)
    os.close(audio_read)
    # SIGPIPE is ignored only while streaming (h3_ffmpeg.c:705-709, 730); h3-sim runs with the
    # C default otherwise. signal() is main-thread only; other threads keep what they have.
    try:
        previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    except ValueError:
        previous = None
    video = _StreamWriter(video_write, (np.ascontiguousarray(frame).tobytes() for frame in frames))
    audio = _StreamWriter(audio_write, (interleaved,))
    video.start()
    audio.start()
    video.join()
    audio.join()
    if previous is not None:
        signal.signal(signal.SIGPIPE, previous)
    status = _exit_status(pid)
    if video.errno or audio.errno:
        raise MediaFailure("cannot stream generated A/V to FFmpeg: "
                           f"{strerror(video.errno or audio.errno)}")
    if status != 0:
        raise MediaFailure(f"FFmpeg exited with status {-1 if status is None else status}")
