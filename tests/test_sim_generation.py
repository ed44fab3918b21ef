"""h3-sim generation against upstream: progress protocol and phase order per mode (h3.c
h3_generate + stage files), cache semantics, PPM frames (main.c cli_frame), the MP4 written
through ffmpeg (h3_ffmpeg.c) probed with PyAV, fault injection and determinism."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import av
import numpy as np
import pytest

from h3bridge.sim.engine import SimContext, SimError, generate
from h3bridge.sim.params import SimParams, SimReference, ReferenceKind
from sim_helpers import (make_audio, make_image, make_model, make_video, progress_records,
                         read_ppm, run_sim, run_sim_process, sim_program)

TINY = ("--width", "64", "--height", "64", "--steps", "2")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("sim-gen") / "model")


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sim-gen-media")
    return {"red": make_image(root / "red.png", "red"), "blue": make_image(root / "blue.png", "blue"),
            "video": make_video(root / "clip.mp4", 3.0), "audio": make_audio(root / "tone.wav", 2.5)}


@pytest.fixture(scope="module")
def t2va(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One real console-script run: 39 frames at 64x64, MP4 + PPM frames."""
    root = tmp_path_factory.mktemp("sim-gen-run")
    output = root / "nested" / "dir" / "clip.mp4"
    frames = root / "frames"
    result = run_sim_process("-d", str(model), "-p", "A red fox runs through snow", *TINY,
                             "--frames", "39", "-o", str(output), "--frames-dir", str(frames))
    return {"result": result, "output": output, "frames": frames}


def expected_tail(steps: int, frames: int, *,
                  gpu_sampler: bool = True) -> list[tuple[str, int, int]]:
    """From "refine text" to the end, as h3_generate reports it (deduplicated like cli_progress)."""
    records = [("refine text", 0, 1), ("refine text", 1, 1)]
    records += [("precompute AdaLN", n, 50) for n in range(1, 51)]
    records += [("load transformer core", n, 50) for n in range(1, 51)]
    running = "denoise enqueue" if gpu_sampler else "denoise"
    records += [(running, n, steps) for n in range(0, steps + 1)]
    if gpu_sampler:
        records.append(("denoise", steps, steps))
    records += [("audio VAE", n, 7) for n in range(0, 8)]
    records += [("video VAE load", n, 36) for n in range(1, 37)]
    records += [("FFmpeg", 0, frames), ("FFmpeg", frames, frames)]
    return records


TOKENIZER = [("tokenizer", 0, 1), ("tokenizer", 1, 1)]
TEXT = [("text encoder", n, 50) for n in range(0, 51)]
VISION = [("Qwen vision", n, 27) for n in range(1, 28)]


def test_t2va_phase_sequence_and_protocol(t2va: dict[str, object]) -> None:
    result = t2va["result"]
    assert isinstance(result, subprocess.CompletedProcess)
    assert result.returncode == 0, result.stderr
    assert progress_records(result.stderr) == TOKENIZER + TEXT + expected_tail(2, 39)
    # main.c cli_progress: "\r%-25s %4d/%-4d", newline when a phase completes or changes.
    assert result.stderr.startswith("\rtokenizer                    0/1   "
                                    "\rtokenizer                    1/1   \n"
                                    "\rtext encoder                 0/50  ")
    assert result.stderr.endswith(f"\rFFmpeg                       0/39  \rFFmpeg                      39/39  \n"
                                  f"h3: wrote {t2va['output']}\nh3: wrote frames to {t2va['frames']}\n")


def test_cpu_sampler_on_pre_m5_device(capsys: pytest.CaptureFixture[str], model: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_DEVICE_NAME", "Apple M1 Ultra")
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--steps", "3", "--frames", "22",
                  "-o", "")
    assert run.code == 0
    records = progress_records(run.err)
    assert records == TOKENIZER + TEXT + expected_tail(3, 22, gpu_sampler=False)[:-2]
    assert "h3: wrote" not in run.err                     # -o '' writes no MP4


def test_fl2va_phase_sequence(capsys: pytest.CaptureFixture[str], model: Path,
                              media: dict[str, Path]) -> None:
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "",
                  "--first-frame", str(media["red"]), "--last-frame", str(media["blue"]))
    assert run.code == 0, run.err
    # Two anchors: "video VAE encoder" 1/1 twice is deduplicated by cli_progress (main.c:159).
    assert progress_records(run.err) == (TOKENIZER + [("video VAE encoder", 1, 1)] + VISION + VISION
                                         + TEXT + expected_tail(2, 22)[:-2])


def test_visual_encoder_tiles_follow_the_render_canvas(capsys: pytest.CaptureFixture[str],
                                                      model: Path, media: dict[str, Path]) -> None:
    # tile_axis_build (h3_video_encoder.c:611-651): 288 px -> 2 tiles of 256 with >= 64 overlap.
    run = run_sim(capsys, "-d", str(model), "-p", "x", "--width", "288", "--height", "288",
                  "--steps", "2", "--frames", "22", "-o", "", "--first-frame", str(media["red"]))
    assert run.code == 0, run.err
    assert [r for r in progress_records(run.err) if r[0] == "video VAE encoder"] == \
        [("video VAE encoder", n, 4) for n in range(1, 5)]


def test_ref2va_phase_sequence(capsys: pytest.CaptureFixture[str], model: Path,
                               media: dict[str, Path]) -> None:
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "56", "-o", "",
                  "--ref-image", str(media["red"]), "--ref-video", str(media["video"]),
                  "--ref-audio", str(media["audio"]))
    assert run.code == 0, run.err
    audio_encoder = [("audio VAE encoder", n, 7) for n in range(1, 8)]
    # 56 reference frames -> 5 Qwen samples -> 3 two-frame blocks (h3.c:1076-1079).
    assert progress_records(run.err) == (TOKENIZER + audio_encoder * 2 + [("video VAE encoder", 1, 1)]
                                         + VISION * 4 + TEXT + expected_tail(2, 56)[:-2])


def test_show_previews_without_final_vae_load(capsys: pytest.CaptureFixture[str], model: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    quiet = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "", "--show")
    assert "h3: warning: --show needs Kitty, Ghostty, iTerm2, WezTerm, or Konsole\n" in quiet.err
    monkeypatch.setenv("KITTY_WINDOW_ID", "1")
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "", "--show")
    assert run.code == 0
    assert run.err.startswith("h3: graphical output uses Kitty graphics\n")
    phases = [phase for phase, _, _ in progress_records(run.err)]
    assert "preview VAE load" in phases and "video VAE load" not in phases
    assert phases.index("preview VAE load") < phases.index("denoise enqueue")
    assert "h3: denoise preview 2/2, video frame 12/22 via Kitty graphics\n" in run.err
    assert "h3: frame 22/22 via Kitty graphics\n" in run.err


# ---------------------------------------------------------------- PPM frames (main.c cli_frame)

def test_ppm_frames(t2va: dict[str, object]) -> None:
    frames = t2va["frames"]
    assert isinstance(frames, Path)
    names = sorted(p.name for p in frames.iterdir())
    assert names == [f"frame-{index:04d}.ppm" for index in range(39)]
    header, pixels = read_ppm(frames / "frame-0000.ppm")
    assert header == b"P6\n64 64\n255\n" and pixels.shape == (64, 64, 3)
    assert (frames / "frame-0038.ppm").stat().st_size == len(header) + 64 * 64 * 3
    distinct = {read_ppm(frames / name)[1].tobytes() for name in names[:5]}
    assert len(distinct) == 5                      # the pattern moves


def test_frames_deterministic_and_seeded(capsys: pytest.CaptureFixture[str], model: Path,
                                         tmp_path: Path) -> None:
    def render(name: str, *extra: str) -> list[bytes]:
        directory = tmp_path / name
        assert run_sim(capsys, "-d", str(model), "-p", "a fox", *TINY, "--frames", "22", "-o", "",
                       "--frames-dir", str(directory), *extra).code == 0
        return [p.read_bytes() for p in sorted(directory.iterdir())]
    first = render("a", "--seed", "7")
    assert render("b", "--seed", "7") == first
    other = render("c", "--seed", "8")
    assert len(other) == len(first) and all(x != y for x, y in zip(other, first))
    assert render("d", "--seed", "7", "--width", "96")[0] != first[0]


def test_anchors_and_references_shape_the_frames(capsys: pytest.CaptureFixture[str], model: Path,
                                                 media: dict[str, Path], tmp_path: Path) -> None:
    anchored = tmp_path / "anchored"
    assert run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "",
                   "--first-frame", str(media["red"]), "--last-frame", str(media["blue"]),
                   "--frames-dir", str(anchored)).code == 0
    first = read_ppm(anchored / "frame-0000.ppm")[1].reshape(-1, 3).mean(axis=0)
    last = read_ppm(anchored / "frame-0021.ppm")[1].reshape(-1, 3).mean(axis=0)
    assert first[0] > 240 and first[1] < 15 and first[2] < 15
    assert last[2] > 240 and last[0] < 15 and last[1] < 15

    def mean_red(directory: Path, *refs: str) -> float:
        assert run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "",
                       "--frames-dir", str(directory), *refs).code == 0
        return float(read_ppm(directory / "frame-0010.ppm")[1][..., 0].mean())
    plain = mean_red(tmp_path / "plain")
    tinted = mean_red(tmp_path / "tinted", "--ref-image", str(media["red"]))
    assert tinted > plain + 40


def test_unwritable_frames_dir_cancels_generation(capsys: pytest.CaptureFixture[str], model: Path,
                                                  tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")                      # mkdir gives EEXIST, fopen fails
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "",
                  "--frames-dir", str(not_a_dir))
    assert run.code == 1
    assert run.err.endswith(f"h3: cannot write frame 0 to {not_a_dir}\n"
                            "h3: generation cancelled while delivering frame 0\n")


# ---------------------------------------------------------------- MP4 (h3_ffmpeg.c)

def test_mp4_properties(t2va: dict[str, object]) -> None:
    output = t2va["output"]
    assert isinstance(output, Path) and output.is_file()        # make_parents created nested/dir
    with av.open(str(output)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0]
        assert video.codec_context.name == "h264"
        assert (video.codec_context.width, video.codec_context.height) == (64, 64)
        assert video.average_rate == 24
        assert audio.codec_context.name == "aac"
        assert audio.codec_context.sample_rate == 32000
        assert audio.codec_context.channels == 2
        # 39 frames; audio = llround(39 * 40 / 24) latents * 800 samples = 52000 = 1.625 s.
        assert container.duration is not None
        assert abs(container.duration / 1e6 - 39 / 24) < 0.06
        decoded = sum(1 for _ in container.decode(video=0))
    assert decoded == 39
    with av.open(str(output)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(samples - 52000) <= 1024 + 1024      # AAC frames of 1024 samples, priming


def test_default_output_path_relative_to_cwd(capsys: pytest.CaptureFixture[str], model: Path,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22")
    assert run.code == 0 and run.err.endswith("h3: wrote outputs/h3.mp4\n")
    assert (tmp_path / "outputs" / "h3.mp4").stat().st_size > 0


# ---------------------------------------------------------------- engine API and cache (h3.c)

def test_cache_semantics(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    ctx = SimContext.load_dir(str(model))
    params = SimParams(width=64, height=64, frames=22, steps=2)
    seen: list[tuple[str, int, int]] = []

    def record(phase: str, done: int, total: int) -> bool:
        seen.append((phase, done, total))
        return False

    def run(prompt: str, **changes: object) -> tuple[list[str], str]:
        seen.clear()
        capsys.readouterr()
        for name, value in changes.items():
            setattr(params, name, value)
        generate(ctx, prompt, params, on_progress=record)
        return [p for p, _, _ in seen], capsys.readouterr().err

    ctx.set_cache_enabled(True)
    assert ctx.cache_info().embedding_entries == 0
    phases, err = run("a fox")
    assert err == ("h3: conditioning cache miss; stored exact BF16\n"
                   "h3: prepared DiT cache miss; model retained\n"
                   "h3: video VAE cache miss; decoder retained\n")
    # 0/36, the decoder load's 1..36/36, then h3.c:1610-1611 repeats 36/36 for a retained decoder.
    assert seen[-38:] == [("video VAE load", n, 36) for n in range(0, 37)] + [("video VAE load", 36, 36)]
    info = ctx.cache_info()
    assert info.embedding_entries == 1 and info.embedding_bytes > 0
    assert info.prepared_dit and info.video_decoder

    phases, err = run("a fox", seed=9)             # the seed is in no cache key
    assert err == ("h3: conditioning cache hit\nh3: prepared DiT cache hit\n"
                   "h3: video VAE cache hit\n")
    assert set(phases) == {"denoise enqueue", "denoise", "audio VAE", "video VAE load"}
    assert [s for s in seen if s[0] == "video VAE load"] == [("video VAE load", 0, 36),
                                                             ("video VAE load", 36, 36)]
    assert err.count("\n") == 3
    phases, err = run("a fox", steps=3)            # steps: same conditioning, new DiT
    assert err.splitlines() == ["h3: conditioning cache hit",
                                "h3: prepared DiT cache miss; model retained",
                                "h3: video VAE cache hit"]
    assert "tokenizer" not in phases and "refine text" in phases
    phases, err = run("a cat")
    assert "tokenizer" in phases and "conditioning cache miss" in err

    ctx.clear_cache()
    assert ctx.cache_info() == type(info)(0, 0, False, False)
    ctx.set_cache_enabled(False)
    phases, err = run("a cat")
    assert err == "" and seen[-36:] == [("video VAE load", n, 36) for n in range(1, 37)]


def test_progress_cancel_stops_at_the_next_boundary(model: Path) -> None:
    ctx = SimContext.load_dir(str(model))
    with pytest.raises(SimError) as caught:
        generate(ctx, "x", SimParams(width=64, height=64, frames=22, steps=2),
                 on_progress=lambda phase, done, total: phase == "tokenizer")
    assert caught.value.message == "generation cancelled during tokenizer"


def test_engine_reference_validation_matches_cli(model: Path) -> None:
    ctx = SimContext.load_dir(str(model))
    params = SimParams(width=64, height=64, frames=22,
                       references=[SimReference(ReferenceKind.AUDIO, "a.wav")])
    with pytest.raises(SimError, match="^reference audio requires an image or video reference$"):
        generate(ctx, "x", params)
    with pytest.raises(SimError, match="^denoising preview requires a frame callback$"):
        generate(ctx, "x", SimParams(width=64, height=64, frames=22, preview_denoise=1))


# ---------------------------------------------------------------- faults

def test_fail_phase_reports_like_a_failed_generate(capsys: pytest.CaptureFixture[str], model: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "text encoder:3")
    monkeypatch.setenv("H3_SIM_FAIL_MESSAGE", "MTLCommandBuffer failed: out of memory")
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "")
    assert run.code == 1
    assert run.err.endswith("\rtext encoder                 3/50  \n"
                            "h3: MTLCommandBuffer failed: out of memory\n")


def test_crash_phase_dies_with_sigsegv(model: Path) -> None:
    result = run_sim_process("-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "",
                             env={"H3_SIM_CRASH_PHASE": "denoise enqueue:1"})
    assert result.returncode == -signal.SIGSEGV
    assert result.stderr.endswith("\rdenoise enqueue              1/2   ")


def test_hang_phase_stops_progressing(model: Path, tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    notice = tmp_path / "silent"
    env = dict(os.environ, H3_SIM_HANG_PHASE="audio VAE:2", H3_SIM_HANG_NOTICE=str(notice))
    with open(log, "wb") as sink:
        process = subprocess.Popen([sim_program(), "-d", str(model), "-p", "x", *TINY,
                                    "--frames", "22", "-o", ""], stderr=sink, env=env)
    try:
        deadline = time.monotonic() + 60
        while not notice.exists():          # H3_SIM_HANG_NOTICE: the hang fired, nothing more comes
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert notice.read_text() == f"{process.pid}\n"
        seen = log.read_bytes()
        assert seen.endswith(b"\raudio VAE                    2/7   ")
        time.sleep(0.2)                     # and it stays silent (a hang, not a slow phase)
        assert process.poll() is None and log.read_bytes() == seen
    finally:
        process.kill()
        process.wait()


def test_invalid_time_scale_is_reported(capsys: pytest.CaptureFixture[str], model: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_TIME_SCALE", "fast")
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "")
    assert (run.code, run.err) == (1, "h3: H3_SIM_TIME_SCALE must be a number, not 'fast'\n")


FAKE_FFMPEG = """#!{python}
import json, os, sys, threading
with open({log!r}, "w") as handle:
    json.dump(sys.argv, handle)
audio_fd = int(sys.argv[sys.argv.index("-i", sys.argv.index("-i") + 1) + 1].split(":")[1])
sizes = {{}}
def drain(fd, name):
    total = 0
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        total += len(chunk)
    sizes[name] = total
threads = [threading.Thread(target=drain, args=(0, "video")),
           threading.Thread(target=drain, args=(audio_fd, "audio"))]
for thread in threads: thread.start()
for thread in threads: thread.join()
with open({log!r} + ".sizes", "w") as handle:
    json.dump(sizes, handle)
sys.exit({status})
"""


def _fake_ffmpeg(tmp_path: Path, status: int) -> tuple[Path, Path]:
    import sys
    log = tmp_path / "argv.json"
    script = tmp_path / "fake-ffmpeg"
    script.write_text(FAKE_FFMPEG.format(python=sys.executable, log=str(log), status=status))
    script.chmod(0o755)
    return script, log


def test_ffmpeg_spawned_exactly_like_upstream(capsys: pytest.CaptureFixture[str], model: Path,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    script, log = _fake_ffmpeg(tmp_path, 0)
    monkeypatch.setenv("H3_FFMPEG", str(script))
    output = str(tmp_path / "o.mp4")
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", output)
    assert run.code == 0, run.err
    argv = json.loads(log.read_text())
    audio_input = argv[argv.index("-i", argv.index("-i") + 1) + 1]
    assert argv[1:] == [
        "-y", "-loglevel", "error", "-f", "rawvideo", "-pixel_format", "rgb24",
        "-video_size", "64x64", "-framerate", "24", "-i", "pipe:0",
        "-f", "f32le", "-ar", "32000", "-ac", "2", "-i", audio_input,
        "-map", "0:v:0", "-map", "1:a:0", "-c:v", "libx264", "-preset", "fast", "-crf", "18",
        "-pix_fmt", "yuv420p", "-c:a", "aac", "-b:a", "192k", "-movflags", "+faststart", output]
    assert int(audio_input.split(":")[1]) > 2
    sizes = json.loads(Path(str(log) + ".sizes").read_text())
    # 22 raw rgb24 frames; llround(22 * 40 / 24) = 37 audio latents * 800 samples, stereo f32.
    assert sizes == {"video": 22 * 64 * 64 * 3, "audio": 37 * 800 * 2 * 4}


def test_ffmpeg_exit_status_reported(capsys: pytest.CaptureFixture[str], model: Path,
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script, _ = _fake_ffmpeg(tmp_path, 3)
    monkeypatch.setenv("H3_FFMPEG", str(script))
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22",
                  "-o", str(tmp_path / "o.mp4"))
    assert run.code == 1
    assert run.err.endswith("\rFFmpeg                       0/22  \nh3: FFmpeg exited with status 3\n")


def test_profile_lines_use_upstream_format(capsys: pytest.CaptureFixture[str], model: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    monkeypatch.delenv("H3_PROFILE", raising=False)
    run = run_sim(capsys, "-d", str(model), "-p", "x", *TINY, "--frames", "22", "-o", "", "--profile")
    monkeypatch.delenv("H3_PROFILE", raising=False)     # main.c setenv()s it for the process
    assert run.code == 0
    # "%-24s %-14s": padded, never truncated ("GPU Euler denoise" overflows its 14 columns).
    line = re.compile(r"h3 profile: (.{24}) (\S.*?) +wall= *\d+\.\d{3}s encode= *\d+\.\d{3}s "
                      r"wait= *\d+\.\d{3}s root-gpu= *\d+\.\d{3}s peak= *\d+\.\d{3}GiB "
                      r"alloc= *\d+\.\d{3}GiB submissions=\d+ direct=\d+ linear=\d+ conv=\d+ "
                      r"attention=\d+")
    marks = [(m.group(1).rstrip(), m.group(2).rstrip()) for m in line.finditer(run.err)]
    assert marks == [("Qwen text encoder", "total"), ("H3 DiT", "load"),
                     ("H3 DiT", "GPU Euler denoise"), ("H3 DiT", "total"),
                     ("audio VAE decoder", "total"), ("video VAE decoder", "total")]
    assert progress_records(run.err) == TOKENIZER + TEXT + expected_tail(2, 22)[:-2]


def test_profile_tile_plan_lines(capsys: pytest.CaptureFixture[str], model: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # configured_tile_pixels picks the 256..320 tile with the least tiles * area: a 288 canvas
    # fits one 288 tile; 39 frames (12 latents > 7) take the chunked one-shot decoder.
    monkeypatch.setenv("H3_PROFILE", "0")     # getenv() only: any value prints the plan
    run = run_sim(capsys, "-d", str(model), "-p", "x", "--width", "288", "--height", "288",
                  "--steps", "2", "--frames", "39", "-o", "")
    assert "h3: video VAE tiles 1x1 at 288 pixels\n" in run.err
    assert "h3 profile:" not in run.err       # h3_gpu_profile_enabled treats "0" as off
    ctx = SimContext.load_dir(str(model))
    ctx.set_cache_enabled(True)
    capsys.readouterr()
    generate(ctx, "x", SimParams(width=864, height=480, frames=22, steps=2))
    assert "h3: resident video VAE tiles 4x2 at 272 pixels\n" in capsys.readouterr().err
