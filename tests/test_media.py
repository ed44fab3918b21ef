"""media/decode.py: PPM frames straight into one array, audio decode, input probing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core_helpers import media  # noqa: F401  (fixture)
from h3bridge.errors import MediaError
from h3bridge.media.decode import decode_audio, probe_media, read_frames_dir, read_ppm_into


def write_ppm(path: Path, frame: np.ndarray, header: bytes | None = None) -> None:
    height, width, _ = frame.shape
    path.write_bytes((header or b"P6\n%d %d\n255\n" % (width, height)) + frame.tobytes())


def test_frames_dir_is_read_into_one_array_and_emptied(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    clip = rng.integers(0, 256, (5, 6, 10, 3), dtype=np.uint8)
    for index, frame in enumerate(clip):
        write_ppm(tmp_path / f"frame-{index:04d}.ppm", frame)
    frames = read_frames_dir(tmp_path, 5, 10, 6)
    assert frames.dtype == np.uint8 and frames.shape == (5, 6, 10, 3) and frames.flags.c_contiguous
    np.testing.assert_array_equal(frames, clip)
    assert list(tmp_path.iterdir()) == []


def test_ppm_header_comments_and_whitespace(tmp_path: Path) -> None:
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    write_ppm(tmp_path / "f.ppm", frame, header=b"P6 # made by hand\n3\t2\n255\n")
    out = np.zeros_like(frame)
    read_ppm_into(tmp_path / "f.ppm", out)
    np.testing.assert_array_equal(out, frame)


@pytest.mark.parametrize("header, data_bytes, fragment", [
    (b"P6\n4 2\n255\n", 24, "expected 3x2"),          # wrong size
    (b"P6\n3 2\n65535\n", 18, "maxval 65535"),        # 16-bit PPM
    (b"P5\n3 2\n255\n", 18, "not a binary PPM"),      # greyscale
    (b"P6\n3 2\n255\n", 10, "truncated"),             # short pixel data
    (b"P6\n3", 0, "truncated PPM header"),
])
def test_bad_ppm_files_raise_media_error(tmp_path: Path, header: bytes, data_bytes: int, fragment: str) -> None:
    (tmp_path / "f.ppm").write_bytes(header + bytes(data_bytes))
    with pytest.raises(MediaError, match=fragment):
        read_ppm_into(tmp_path / "f.ppm", np.zeros((2, 3, 3), dtype=np.uint8))


def test_missing_frames_are_reported(tmp_path: Path) -> None:
    frame = np.zeros((2, 2, 3), dtype=np.uint8)
    write_ppm(tmp_path / "frame-0000.ppm", frame)
    write_ppm(tmp_path / "frame-0002.ppm", frame)
    with pytest.raises(MediaError, match="wrote 2 frames .* expected 3"):
        read_frames_dir(tmp_path, 3, 2, 2)


def test_decode_audio_is_float32_channels_by_samples_at_32k(media: dict[str, Path]) -> None:
    audio = decode_audio(media["audio3s"])
    assert audio.dtype == np.float32 and audio.shape[0] == 2
    assert abs(audio.shape[1] - 96000) < 32000 * 0.05
    assert 0.05 < float(np.abs(audio).max()) <= 1.0     # lavfi sine (amplitude 1/8), not silence


def test_decode_audio_without_audio_stream(media: dict[str, Path]) -> None:
    with pytest.raises(MediaError, match="no audio stream"):
        decode_audio(media["silent3s"])


def test_probe_media(media: dict[str, Path]) -> None:
    image = probe_media(media["image"])
    assert image.has_video and not image.has_audio and (image.width, image.height) == (64, 64)
    video = probe_media(media["video3s"])
    assert video.has_video and video.has_audio and abs(video.frames_at_24fps - 72) <= 1
    assert abs(video.audio_samples - 96000) < 32000 * 0.05
    audio = probe_media(media["audio16s"])
    assert not audio.has_video and audio.audio_samples > 15 * 32000
    with pytest.raises(MediaError):
        probe_media(media["text"])


def test_unreadable_media_is_a_sentence_naming_the_file_not_pyav_text(media: dict[str, Path], tmp_path: Path) -> None:
    """Not PyAV's raw "[Errno 1094995529] Invalid data found when processing input: '...'"."""
    from h3bridge.media.decode import decode_video_frames
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(media["video3s"].read_bytes()[:64])
    for read, path in ((probe_media, media["text"]), (decode_audio, media["text"]),
                       (lambda p: decode_video_frames(p, 72, 64, 64), cut)):
        with pytest.raises(MediaError) as caught:
            read(path)
        message = caught.value.message
        assert message.startswith(f"{path} ") and "Errno" not in message and "Invalid data found" not in message
        assert "damaged or is not a picture, video or sound file" in message
        assert "export it again" in (caught.value.hint or "")
    with pytest.raises(MediaError) as caught:
        probe_media(tmp_path / "missing.png")
    assert caught.value.message == f"{tmp_path / 'missing.png'} does not exist" and caught.value.hint == "check the path"


def test_damaged_media_raises_media_error_only(media: dict[str, Path], tmp_path: Path) -> None:
    """Truncated and byte-mutated videos give MediaError, never a raw PyAV/ValueError (probe_media
    feeds request validation and ComfyUI reference checks; decode_video_frames reads session MP4s)."""
    import random

    from h3bridge.media.decode import decode_video_frames
    original = media["video3s"].read_bytes()
    variants = [original[:cut] for cut in (64, 1000, len(original) // 2, len(original) - 300)]
    generator = random.Random(1)
    for _ in range(24):
        mutated = bytearray(original)
        for _ in range(20):
            mutated[generator.randrange(len(mutated))] = generator.randrange(256)
        variants.append(bytes(mutated))
    failures = 0
    damaged = tmp_path / "damaged.mp4"
    for data in variants:
        damaged.write_bytes(data)
        for read in (lambda: probe_media(damaged), lambda: decode_video_frames(damaged, 72, 64, 64)):
            try:
                read()
            except MediaError:
                failures += 1
    assert failures >= len(variants)     # most variants are refused, each one as MediaError


def test_unreadable_frame_is_a_media_error(tmp_path: Path) -> None:
    (tmp_path / "frame-0000.ppm").mkdir()          # a folder where h3 writes a frame file
    with pytest.raises(MediaError, match="cannot read the frame"):
        read_frames_dir(tmp_path, 1, 4, 2)


def _frames_h3_decodes(path: Path) -> int:
    """The oracle: the frames upstream's reference-video read gets (h3_ffmpeg.c
    h3_ffmpeg_read_video_f32: fps=24, scaled, at most 362 frames, raw RGB on a pipe)."""
    import subprocess
    out = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:v:0", "-an", "-vf",
                          "fps=24,scale=32:32:flags=lanczos,setsar=1", "-frames:v", "362", "-f", "rawvideo",
                          "-pix_fmt", "rgb24", "pipe:1"], capture_output=True, check=True)
    return len(out.stdout) // (32 * 32 * 3)


def _make(path: Path, *args: str) -> Path:
    import subprocess
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args, str(path)], check=True)
    return path


def test_video_length_is_counted_as_h3_decodes_it_whatever_the_metadata_says(tmp_path: Path) -> None:
    """Metadata misleads: a piped WebM (a browser or live recording) has no duration at all, a
    Matroska file with longer audio reports the audio's length, a single still frame can last
    seconds, and a video that starts after its audio is still read from time 0."""
    import subprocess
    live = tmp_path / "live.webm"
    piped = subprocess.run(["ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=s=64x48:r=25:d=4",
                            "-c:v", "libvpx", "-f", "webm", "pipe:1"], capture_output=True, check=True)
    live.write_bytes(piped.stdout)
    cases = {
        "live": live,
        "longer audio": _make(tmp_path / "a.mkv", "-f", "lavfi", "-i", "testsrc=s=64x48:r=30:d=2", "-f", "lavfi",
                              "-i", "sine=d=10", "-c:v", "libx264", "-bf", "2", "-c:a", "aac"),
        "still frame": _make(tmp_path / "one.mp4", "-f", "lavfi", "-i", "color=c=red:s=64x48:r=1/3:d=3",
                             "-c:v", "libx264"),
        "late video": _make(tmp_path / "late.mkv", "-f", "lavfi", "-i", "sine=d=3", "-itsoffset", "0.5", "-f",
                            "lavfi", "-i", "testsrc=s=64x48:r=24:d=2", "-map", "1:v", "-map", "0:a",
                            "-c:v", "libx264", "-c:a", "aac"),
        "ordinary": _make(tmp_path / "plain.mp4", "-f", "lavfi", "-i", "testsrc=s=64x48:r=30:d=3", "-c:v", "libx264"),
    }
    counted = {name: min(probe_media(path).frames_at_24fps, 362) for name, path in cases.items()}
    decoded = {name: _frames_h3_decodes(path) for name, path in cases.items()}
    assert counted == decoded
    assert decoded["live"] > 24 and decoded["still frame"] > 24 and decoded["longer audio"] < 24 * 3
