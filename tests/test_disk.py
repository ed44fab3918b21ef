"""A full or read-only disk is named as such, before the render when it can be told and after
one it stopped; never "install FFmpeg" (h3 reports a broken pipe to FFmpeg, whose own error says
"No space left on device"). Both engines, one wording (engine.disk_error)."""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from core_helpers import fast_request, model_dir, sim_engine_path, sim_invocations, sim_log  # noqa: F401
from h3bridge import OneShotEngine
from h3bridge.cli.main import main
from h3bridge.engines.disk import expected_clip_bytes, expected_frames_bytes
from h3bridge.errors import DiskError
from h3bridge.engines.session import SessionEngine

FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2", "--quiet"]
Usage = collections.namedtuple("Usage", "total used free")


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def free_space(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    """Every disk reports `free` bytes available (the pre-flight's view; writes are real)."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(1 << 40, (1 << 40) - free, free))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs: real FFmpeg fails on it with ENOSPC. Needs mount (root); skipped otherwise."""
    mount_point = tmp_path / "tiny-disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount_point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def ffmpeg_out_of_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An FFmpeg that fails the way real FFmpeg does on a full disk: it prints the OS's words
    about its output file and exits 1 before reading its input, so h3's writer meets a broken
    pipe ("cannot stream generated A/V to FFmpeg: Broken pipe", h3_ffmpeg.c)."""
    program = tmp_path / "bin" / "ffmpeg"
    program.parent.mkdir()
    program.write_text('#!/bin/sh\nfor last in "$@"; do :; done\n'
                       'echo "[out#0/mp4 @ 0x600000c0c000] Error opening output $last: No space left on device" >&2\n'
                       'exit 1\n')
    program.chmod(0o755)
    monkeypatch.setenv("H3_FFMPEG", str(program))
    return program


# ----------------------------------------------------------------------------- before the render

def test_a_disk_too_full_for_the_clip_is_refused_before_the_engine_starts(
        model_dir: Path, tmp_path: Path, sim_log: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    free_space(monkeypatch, 200 * 1024)
    output = tmp_path / "clips" / "fox.mp4"
    status = main(["generate", "-p", "fox", *FAST_FLAGS, "-o", str(output), "--engine-path",
                   str(sim_engine_path()), "--model-dir", str(model_dir)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"the output folder {tmp_path} has 200.0 KiB free" in err and "needs about 1.0 MiB" in err
    assert "fix: free at least" in err and "FFmpeg" not in err and "Traceback" not in err
    assert sim_invocations(sim_log) == [] and not (tmp_path / "clips").exists()


def test_the_estimate_covers_a_real_clip_with_room_to_spare(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    request = fast_request(width=512, height=512, frames=56)
    result = OneShotEngine(sim_engine_path(), model_dir).generate(request, tmp_path / "fox.mp4", want_frames=False)
    assert result.video_path.stat().st_size * 3 < expected_clip_bytes(request)
    # ... and stays modest: the largest clip needs tens of MB, not gigabytes.
    assert expected_clip_bytes(fast_request(width=1344, height=768, frames=362)) < 64 << 20
    assert expected_frames_bytes(request) == 56 * (512 * 512 * 3 + 32)


def test_reading_the_frames_back_also_needs_room(model_dir: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    request = fast_request(width=512, height=512, frames=56)
    # Room for the MP4 but not for the PPM frames beside it (one disk here: they add up).
    free_space(monkeypatch, expected_clip_bytes(request) + 1024)
    engine = OneShotEngine(sim_engine_path(), model_dir)
    with pytest.raises(DiskError) as caught:
        engine.generate(request, tmp_path / "fox.mp4", want_frames=True)
    error = caught.value
    assert error.before_start and error.needed == expected_clip_bytes(request) + expected_frames_bytes(request)
    assert "MiB in h3bridge's temporary folder (frames)" in error.message and "TMPDIR" in (error.hint or "")
    assert f"MiB in the output folder {tmp_path}" in error.message
    assert sim_invocations(sim_log) == []
    assert engine.generate(request, tmp_path / "fox.mp4", want_frames=False).video_path.is_file()


def test_an_output_folder_that_takes_no_files_is_refused_before_the_engine_starts(
        model_dir: Path, sim_log: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """/proc passes os.access for root, but no file can be created there: the probe finds out."""
    if not os.access("/proc", os.W_OK):
        pytest.skip("needs a folder that os.access calls writable but that refuses new files")
    status = main(["generate", "-p", "fox", *FAST_FLAGS, "-o", "/proc/fox.mp4", "--engine-path",
                   str(sim_engine_path()), "--model-dir", str(model_dir)])
    err = capsys.readouterr().err
    assert status == 2 and "the output folder /proc does not take new files" in err, err
    assert "not on a writable file system" in err and sim_invocations(sim_log) == []


def test_a_read_only_output_disk_is_named_before_the_engine_starts(
        model_dir: Path, tiny_disk: Path, sim_log: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    status = main(["generate", "-p", "fox", *FAST_FLAGS, "-o", str(tiny_disk / "fox.mp4"), "--engine-path",
                   str(sim_engine_path()), "--model-dir", str(model_dir)])
    err = capsys.readouterr().err
    assert status == 2 and "read-only" in err and str(tiny_disk) in err and "FFmpeg" not in err, err
    assert sim_invocations(sim_log) == []


def test_the_probe_leaves_nothing_behind(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    OneShotEngine(sim_engine_path(), model_dir).generate(fast_request(), tmp_path / "fox.mp4", want_frames=False)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["fox.mp4"]
    assert not list(Path(tempfile.gettempdir()).glob(".h3bridge-probe-*"))


# ----------------------------------------------------------------------------- when a render still meets it

def test_a_disk_that_fills_during_the_render_is_named_not_ffmpeg(
        model_dir: Path, tiny_disk: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """The pre-flight saw room (another program filled the disk meanwhile): real FFmpeg then
    fails on the 16 KiB tmpfs, and the message says the disk is full, with no truncated clip
    published (this FFmpeg even exits 0 after "Error writing trailer")."""
    free_space(monkeypatch, 1 << 40)
    status = main(["generate", "-p", "fox", *FAST_FLAGS, "-o", str(tiny_disk / "fox.mp4"), "--engine-path",
                   str(sim_engine_path()), "--model-dir", str(model_dir)])
    err = capsys.readouterr().err
    assert status == 1, err
    assert f"the output folder {tiny_disk} is full" in err and "free at least" in err, err
    assert "install FFmpeg" not in err and "engine log: " in err
    assert list(tiny_disk.iterdir()) == []


def test_ffmpeg_out_of_space_mid_render_names_the_disk(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                       ffmpeg_out_of_space: Path) -> None:
    output = tmp_path / "clips" / "fox.mp4"
    with pytest.raises(DiskError) as caught:
        OneShotEngine(sim_engine_path(), model_dir).generate(fast_request(), output)
    error = caught.value
    assert not error.before_start and error.folder == tmp_path and "is full" in error.message
    assert error.engine_message == "cannot stream generated A/V to FFmpeg: Broken pipe"   # h3's words, kept
    assert "No space left on device" in error.stderr and "install FFmpeg" not in str(error)
    assert not (tmp_path / "clips").exists()


def test_the_warm_session_names_the_disk_the_same_way(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                      ffmpeg_out_of_space: Path) -> None:
    """Interactive h3 writes every clip into its own /tmp/h3-XXXXXX folder first."""
    with SessionEngine(sim_engine_path(), model_dir, stall_timeout=120) as session:
        with pytest.raises(DiskError) as caught:
            session.generate(fast_request(), tmp_path / "fox.mp4", want_frames=False)
        error = caught.value
        assert error.folder == session.outputs_dir and "h3's session folder" in error.message
        assert "is full" in error.message and error.engine_message == "cannot stream generated A/V to FFmpeg: Broken pipe"
        assert session.running       # h3 answered in full and waits for the next prompt
    assert not (tmp_path / "fox.mp4").exists()


def test_the_warm_session_checks_the_disks_before_a_job(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                        sim_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free_space(monkeypatch, 4096)
    with SessionEngine(sim_engine_path(), model_dir) as session:
        with pytest.raises(DiskError) as caught:
            session.generate(fast_request(), tmp_path / "fox.mp4")
        assert caught.value.before_start and not session.running
    assert "has 4.0 KiB free" in caught.value.message and sim_invocations(sim_log) == []
