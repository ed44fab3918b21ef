"""The H3 References node's library side: ordered list, upstream limits, files h3 can read."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from h3bridge.errors import MediaError, RequestError
from h3bridge.media.decode import decode_audio, probe_media
from h3bridge.media.references import (
    AudioClip,
    ReferenceItem,
    ReferenceList,
    RunDirectory,
    VideoSource,
    image_to_uint8,
    materialise_references,
    write_png,
    write_wav,
)
from h3bridge.request import ReferenceKind, check_reference_limits

K = ReferenceKind
PICTURE = np.zeros((8, 8, 3), np.float32)
SOUND = AudioClip(np.zeros((2, 32000 * 3), np.float32), 32000)


def _video(path: Path, *, audio: bool) -> Path:
    args = ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=s=64x48:r=24:d=1"]
    if audio:
        args += ["-f", "lavfi", "-i", "sine=d=1:sample_rate=32000", "-c:a", "aac", "-shortest"]
    subprocess.run([*args, "-c:v", "libx264", "-pix_fmt", "yuv420p", str(path)], check=True)
    return path


def _item(kind: ReferenceKind, video: VideoSource | None = None) -> ReferenceItem:
    if kind is K.IMAGE:
        return ReferenceItem(kind, image=PICTURE)
    if kind is K.AUDIO:
        return ReferenceItem(kind, audio=SOUND)
    source = video or VideoSource(write=lambda target: None)
    return ReferenceItem(kind, video=source, audio=SOUND if kind is K.VIDEO_AUDIO else None)


def _chain(*kinds: ReferenceKind) -> ReferenceList:
    references = ReferenceList()
    for kind in kinds:
        references = references.appended(_item(kind))
    return references


# ----------------------------------------------------------------------------- limits (h3.c h3_valid_params)

def test_limits_allow_exactly_upstreams_maximums() -> None:
    counts = check_reference_limits([K.IMAGE] * 9 + [K.VIDEO, K.SILENT_VIDEO, K.VIDEO_AUDIO])
    assert (counts.total, counts.images, counts.videos, counts.audio_inputs) == (12, 9, 3, 2)
    assert len(_chain(*[K.IMAGE] * 9, K.SILENT_VIDEO, K.SILENT_VIDEO, K.AUDIO)) == 12


@pytest.mark.parametrize(("kinds", "words"), [
    ([K.IMAGE] * 10, "10 reference images given; Ref2VA allows at most 9"),
    ([K.SILENT_VIDEO] * 4, "4 reference videos given; Ref2VA allows at most 3"),
    # A video with its soundtrack is a video AND an audio input.
    ([K.IMAGE, K.VIDEO, K.VIDEO_AUDIO, K.AUDIO, K.AUDIO], "4 reference audio inputs given"),
    ([K.IMAGE] * 9 + [K.SILENT_VIDEO] * 3 + [K.AUDIO], "13 references given; Ref2VA supports at most 12"),
])
def test_limits_reject_one_too_many(kinds: list[ReferenceKind], words: str) -> None:
    with pytest.raises(RequestError) as info:
        check_reference_limits(kinds)
    assert words in str(info.value) and info.value.field == "references"


def test_appending_past_a_limit_fails_at_that_node_and_keeps_the_list() -> None:
    nine = _chain(*[K.IMAGE] * 9)
    with pytest.raises(RequestError):
        nine.appended(_item(K.IMAGE))
    assert len(nine) == 9     # immutable: the earlier list is unchanged (ComfyUI caches it)


def test_order_is_kept() -> None:
    kinds = [K.AUDIO, K.IMAGE, K.SILENT_VIDEO, K.IMAGE]
    references = _chain(*kinds)
    assert [item.kind for item in references] == kinds
    assert references.describe() == "1. audio, 2. image, 3. video, 4. image"


@pytest.mark.parametrize(("kind", "given", "complaint"), [
    (K.IMAGE, {}, "needs its image input"),
    (K.VIDEO_AUDIO, {"video": VideoSource(write=lambda t: None)}, "needs its audio input"),
    (K.AUDIO, {"audio": SOUND, "image": PICTURE}, "does not use the image input"),
])
def test_each_kind_takes_exactly_its_inputs(kind: ReferenceKind, given: dict, complaint: str) -> None:
    with pytest.raises(RequestError, match=complaint):
        ReferenceItem(kind, **given)


# ----------------------------------------------------------------------------- files

def test_png_holds_the_exact_pixels(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    picture = rng.random((1, 20, 30, 3), dtype=np.float32)
    path = write_png(picture, tmp_path / "p.png")
    with av.open(str(path)) as container:
        decoded = next(container.decode(video=0)).to_ndarray(format="rgb24")
    np.testing.assert_array_equal(decoded, image_to_uint8(picture))
    assert probe_media(path).width == 30


def test_image_conversion_handles_grey_alpha_and_uint8() -> None:
    grey = np.full((2, 2, 1), 1.0, np.float32)
    assert image_to_uint8(grey).tolist() == [[[255, 255, 255]] * 2] * 2
    rgba = np.zeros((2, 2, 4), np.uint8)
    assert image_to_uint8(rgba).shape == (2, 2, 3)
    with pytest.raises(MediaError):
        image_to_uint8(np.zeros((2, 2), np.float32))


def test_wav_round_trips_through_pyav(tmp_path: Path) -> None:
    t = np.arange(44100 * 2, dtype=np.float32) / 44100
    wave = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.sin(2 * np.pi * 220 * t)]).astype(np.float32)
    path = write_wav(AudioClip(wave, 44100), tmp_path / "a.wav")
    decoded = decode_audio(path, 44100)
    assert decoded.shape == wave.shape
    assert np.abs(decoded - wave).max() < 1e-3      # 16-bit PCM
    mono = write_wav(AudioClip(wave[:1], 44100), tmp_path / "m.wav")
    assert probe_media(mono).has_audio


def test_surround_audio_keeps_its_centre_channel_through_h3s_stereo_read(tmp_path: Path) -> None:
    """A 5.1 waveform (ComfyUI LoadAudio keeps every channel) is written whole: h3 reads
    references with `-ac 2` (h3_ffmpeg.c), and FFmpeg's downmix keeps the centre, where dialogue is.
    Cutting to the first two channels lost it."""
    import subprocess
    from h3bridge.comfy import adapter
    t = np.arange(48000, dtype=np.float32) / 48000
    surround = np.zeros((1, 6, 48000), np.float32)
    surround[0, 2] = 0.5 * np.sin(2 * np.pi * 440 * t)          # FL FR FC LFE BL BR: centre only
    path = write_wav(adapter.waveform_to_clip(surround, 48000), tmp_path / "dialogue.wav")
    read = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:a:0", "-vn", "-ac", "2", "-ar",
                           "32000", "-f", "f32le", "pipe:1"], capture_output=True, check=True).stdout
    stereo = np.frombuffer(read, np.float32).reshape(-1, 2)
    assert stereo.shape[0] == 32000 and np.abs(stereo).max() > 0.2


def test_materialise_writes_each_kind_in_order(tmp_path: Path) -> None:
    with_audio = _video(tmp_path / "with-audio.mp4", audio=True)
    silent = _video(tmp_path / "silent.mp4", audio=False)
    references = (ReferenceList()
                  .appended(_item(K.IMAGE))
                  .appended(_item(K.VIDEO, VideoSource.from_file(with_audio)))
                  .appended(_item(K.SILENT_VIDEO, VideoSource.from_file(silent)))
                  .appended(_item(K.VIDEO_AUDIO, VideoSource.from_file(silent)))
                  .appended(_item(K.AUDIO)))
    with RunDirectory(tmp_path / "scratch") as directory:
        written = materialise_references(references, directory)
        assert [r.kind for r in written] == [K.IMAGE, K.VIDEO, K.SILENT_VIDEO, K.VIDEO_AUDIO, K.AUDIO]
        assert [r.path.name for r in written] == ["ref-01.png", "ref-02.mp4", "ref-03.mp4", "ref-04.mp4", "ref-05.wav"]
        assert written[3].audio_path is not None and written[3].audio_path.suffix == ".wav"
        assert all(r.path.parent == directory and r.path.is_file() for r in written)
        assert probe_media(written[1].path).has_audio
    assert not directory.exists()


def test_video_with_its_audio_must_have_a_soundtrack(tmp_path: Path) -> None:
    silent = _video(tmp_path / "silent.mp4", audio=False)
    references = ReferenceList().appended(_item(K.VIDEO, VideoSource.from_file(silent)))
    with pytest.raises(MediaError, match="has no audio stream") as info:
        materialise_references(references, tmp_path / "out")
    assert "video plus replacement audio" in (info.value.hint or "")


def test_audio_alone_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="requires an image or video reference"):
        materialise_references(_chain(K.AUDIO), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_host_video_writer_is_used(tmp_path: Path) -> None:
    source = _video(tmp_path / "source.mp4", audio=False)
    calls: list[Path] = []

    def write(target: Path) -> None:          # how the ComfyUI node hands over a VIDEO
        calls.append(target)
        target.write_bytes(source.read_bytes())

    written = materialise_references(ReferenceList().appended(_item(K.SILENT_VIDEO, VideoSource(write=write))),
                                     tmp_path / "out")
    assert calls == [written[0].path] and written[0].path.suffix == ".mp4"


def test_soundtrack_decoding_reads_no_stream_after_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: media.decode_audio read the stream's duration after closing the container
    # (freed memory: now and then the AUDIO output was trimmed to zero samples, which core
    # Save Audio then failed on). A stream proxy that refuses use after close makes it certain.
    import h3bridge.media.decode as media

    real_open = av.open

    class Guarded:
        def __init__(self, inner: Any, owner: "Container") -> None:
            self._inner, self._owner = inner, owner

        def __getattr__(self, name: str) -> Any:
            assert not self._owner.closed, f"stream.{name} read after the container was closed"
            return getattr(self._inner, name)

    class Container:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._inner, self.closed = real_open(*args, **kwargs), False
            audio = [Guarded(stream, self) for stream in self._inner.streams.audio]
            self.streams = type("Streams", (), {"audio": audio, "video": self._inner.streams.video})()

        def decode(self, stream: Any) -> Any:
            return self._inner.decode(stream._inner if isinstance(stream, Guarded) else stream)

        def __enter__(self) -> "Container":
            return self

        def __exit__(self, *exc: object) -> None:
            self._inner.close()
            self.closed = True

    monkeypatch.setattr(media.av, "open", Container)
    clip = _video(tmp_path / "clip.mp4", audio=True)
    assert decode_audio(clip).shape[1] > 30000
