"""The libh3 double (h3bridge/sim/double) through h3bridge.libh3, as the library engine uses it:
h3_load_dir's checks, h3_generate's validation in upstream's order, phases, cancellation by a
callback's return value, previews, final frames byte-identical to h3-sim --frames-dir and
identical audio, the caches, and h3-sim's fault variables."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from h3bridge import libh3
from h3bridge.media.decode import decode_audio

from double_helpers import Recorder, double_library_path, generate, small_params
from sim_helpers import make_audio, make_image, make_model, progress_records, read_ppm, run_sim

METAL_FAILURE = "Metal command buffer failed: Internal Error (0000000e:Internal Error)"


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    return libh3.load_library(double_library_path())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("double-model") / "H3")


@pytest.fixture
def ctx(lib: ctypes.CDLL, model: Path):
    context = lib.h3_load_dir(os.fsencode(model))
    assert context, lib.h3_last_error(None)
    yield context
    lib.h3_free(context)


# ---------------------------------------------------------------- h3_load_dir


def test_load_dir_failures_leave_upstreams_message_in_the_global_error(lib: ctypes.CDLL, tmp_path: Path) -> None:
    for argument, message in ((None, "model directory is required"),
                              (b"", "model directory is required"),
                              (os.fsencode(tmp_path), "missing required model file: "
                               f"{tmp_path}/FL2VA/transformer/config.json")):
        assert not lib.h3_load_dir(argument)
        assert lib.h3_last_error(None).decode() == message
    # The tokenizer is checked second (h3.c:431-432).
    broken = make_model(tmp_path / "no-tokenizer")
    (broken / "FL2VA/tokenizer/tokenizer.json").unlink()
    assert not lib.h3_load_dir(os.fsencode(broken))
    assert lib.h3_last_error(None).decode() == \
        f"missing required model file: {broken}/FL2VA/tokenizer/tokenizer.json"


def test_load_dir_fills_device_and_model(lib: ctypes.CDLL, ctx, monkeypatch: pytest.MonkeyPatch) -> None:
    device = lib.h3_device(ctx).contents
    assert device.name == b"Apple M5 Max" and device.metal4 == 1 and device.unified_memory == 1
    assert device.recommended_working_set == device.physical_memory * 3 // 4
    info = lib.h3_model(ctx).contents
    assert info.text_encoder.files >= 1 and info.fl2va_transformer.tensors >= 1
    assert info.ref2va_transformer.files >= 1     # the fixture has the Ref2VA index
    assert not lib.h3_device(None) and not lib.h3_model(None)
    assert lib.h3_last_error(ctx) == b""


def test_load_dir_without_metal(lib: ctypes.CDLL, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_NO_METAL", "1")
    assert not lib.h3_load_dir(os.fsencode(model))
    assert lib.h3_last_error(None) == b"no Metal device available"


# ---------------------------------------------------------------- validation, in upstream's order

# (fields, message): each case also breaks every later rule it can, so the first failing
# rule's message is what must come back (h3.c:848-870, h3_valid_params :481-637).
VALIDATION = [
    ({"width": 100, "steps": 1}, "width and height must be multiples of 32 and at least 32"),
    ({"width": 1344, "height": 800, "steps": 1}, "canvas exceeds the released 768*1344 pixel limit"),
    ({"render_width": 32, "steps": 1}, "render width and height must be set together"),
    ({"render_width": 32, "render_height": 64, "steps": 1},
     "internal render canvas must be same-aspect multiples of 32 no larger than the output canvas"),
    ({"frames": 4, "steps": 1}, "frames must align within the released 5..362 range"),
    ({"steps": 1, "denoise_reuse": 0}, "denoising steps must be in [2, 1000]"),
    ({"denoise_reuse": 4, "dit_layers": 10}, "denoise reuse must be in [1, 3]"),
    ({"dit_layers": 34, "core_reuse": 0}, "DiT layers must be in [35, 50]"),
    ({"core_reuse": 7, "token_reduction": 2}, "core reuse must be in [1, 6]"),
    ({"token_reduction": 2, "use_int8_row_fc2": 2}, "token reduction must be zero or one"),
    ({"use_int8_row_fc2": 2}, "int8 row FC2 must be zero or one"),
    ({"use_reference_rope": 2}, "reference RoPE must be zero or one"),
    ({"ssd_streaming": 2}, "SSD streaming must be zero or one"),
    ({"ssd_streaming": 1, "use_int8_row_fc2": 1},
     "SSD streaming uses original BF16 weights and cannot be combined with int8 row FC2"),
    ({"use_int8_row_fc2": 1, "use_slower_bf16_mlp": 1}, "int8 row FC2 cannot be combined with the BF16 MLP"),
    ({"preview_denoise": 2, "core_reuse": 2, "denoise_reuse": 2}, "denoising preview must be zero or one"),
    ({"preview_denoise": 1, "core_reuse": 2, "denoise_reuse": 2}, "denoising preview requires a frame callback"),
    ({"core_reuse": 2, "denoise_reuse": 2, "reference_count": 1},
     "core reuse and denoiser reuse cannot be combined"),
    ({"reference_count": 1, "reference_image_size": 5}, "reference_count is nonzero but references is NULL"),
    ({"reference_image_size": 5, "first_frame": b"a.png"}, "unknown reference image sizing policy"),
    ({"frames": 5}, "generation requires at least one trained 22-frame decoder chunk"),
]


@pytest.mark.parametrize("fields,message", VALIDATION, ids=[case[1][:40] for case in VALIDATION])
def test_validation_messages_in_upstreams_order(lib: ctypes.CDLL, ctx, fields, message) -> None:
    recorder = Recorder()
    params = recorder.attach(small_params(**fields), frames=False)
    assert generate(lib, ctx, b"a prompt", params) == (None, message)
    assert recorder.progress == []          # refused before any work


def test_prompt_and_params_come_first(lib: ctypes.CDLL, ctx) -> None:
    broken = small_params(width=1)
    assert generate(lib, ctx, None, broken) == (None, "prompt must not be empty")
    assert generate(lib, ctx, b"", broken) == (None, "prompt must not be empty")
    assert generate(lib, ctx, b"x", None) == (None, "generation parameters are required")


def _references(*items: tuple[int, bytes | None, bytes | None, int]) -> ctypes.Array:
    array = (libh3.h3_reference * len(items))()
    for slot, (kind, path, audio, embedded) in zip(array, items):
        slot.kind, slot.path, slot.audio_path, slot.include_embedded_audio = kind, path, audio, embedded
    return array


def test_reference_rules(lib: ctypes.CDLL, ctx) -> None:
    def refused(array: ctypes.Array, **fields: object) -> str:
        params = small_params(references=ctypes.cast(array, ctypes.POINTER(libh3.h3_reference)),
                              reference_count=len(array), **fields)
        result, error = generate(lib, ctx, b"x", params)
        assert result is None
        return error

    image = (libh3.H3_REFERENCE_IMAGE, b"i.png", None, 0)
    assert refused(_references(*[image] * 13)) == "Ref2VA supports at most 12 references"
    assert refused(_references(image), last_frame=b"l.png") == \
        "full references cannot be combined with frame anchors"
    assert refused(_references(image, (libh3.H3_REFERENCE_IMAGE, b"", None, 0))) == "reference 2 has no input path"
    assert refused(_references((libh3.H3_REFERENCE_VIDEO_AUDIO, b"v.mp4", None, 0))) == \
        "video+audio reference 1 has no soundtrack path"
    assert refused(_references((9, b"x", None, 0))) == "reference 1 has an unknown type"
    assert refused(_references(*[image] * 10)) == "Ref2VA limits are 9 images, 3 videos, and 3 audio inputs"
    assert refused(_references((libh3.H3_REFERENCE_AUDIO, b"a.wav", None, 0))) == \
        "reference audio requires an image or video reference"


# ---------------------------------------------------------------- a run


def test_a_run_reports_h3_sims_phases_and_delivers_its_frames_and_audio(
        lib: ctypes.CDLL, ctx, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompt = "a red fox in the snow, 🦊"
    library_mp4 = tmp_path / "library" / "clip.mp4"
    recorder = Recorder()
    params = recorder.attach(small_params(output_path=os.fsencode(library_mp4)))
    result, error = generate(lib, ctx, prompt.encode(), params)
    assert error == "" and result == {"width": 64, "height": 64, "frames": 22, "fps": 24,
                                      "sample_rate": 32000, "seed": 7}
    frames_dir = tmp_path / "frames"
    cli_mp4 = tmp_path / "cli.mp4"
    run = run_sim(capsys, "-d", str(model), "-p", prompt, "--width", "64", "--height", "64",
                  "--frames", "22", "--steps", "3", "--seed", "7", "-o", str(cli_mp4),
                  "--frames-dir", str(frames_dir))
    assert run.code == 0, run.err
    # Same phases and totals as the CLI prints (its progress is this callback, main.c:156-172;
    # the CLI drops repeats of the same report).
    deduplicated = [record for index, record in enumerate(recorder.progress)
                    if index == 0 or record != recorder.progress[index - 1]]
    assert deduplicated == progress_records(run.err)
    assert recorder.progress[0] == ("tokenizer", 0, 1) and recorder.progress[-1] == ("FFmpeg", 22, 22)
    # Final frames: in order, exact RGB24, byte-identical to --frames-dir.
    assert recorder.previews == []
    finals = recorder.finals
    assert [frame["frame_index"] for frame in finals] == list(range(22))
    for frame in finals:
        assert (frame["width"], frame["height"], frame["stride"], frame["frame_count"],
                frame["denoise_steps"]) == (64, 64, 192, 22, 0)
        _, pixels = read_ppm(frames_dir / f"frame-{frame['frame_index']:04d}.ppm")
        assert np.array_equal(frame["rgb"], pixels)
    assert len(list(frames_dir.iterdir())) == 22
    # The MP4 went through FFmpeg and carries the same audio.
    library_audio, cli_audio = decode_audio(library_mp4), decode_audio(cli_mp4)
    assert library_audio.size > 0 and np.array_equal(library_audio, cli_audio)


def _frames_dir(directory: Path) -> list[np.ndarray]:
    return [read_ppm(path)[1] for path in sorted(directory.glob("frame-*.ppm"))]


def test_anchors_and_references_reach_the_engine_as_the_cli_passes_them(
        lib: ctypes.CDLL, ctx, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    red, blue = make_image(tmp_path / "red.png", "red"), make_image(tmp_path / "blü e.png", "blue")
    audio = make_audio(tmp_path / "voice.wav", 2.5)
    common = ["-d", str(model), "-p", "x", "--width", "64", "--height", "64", "--frames", "22",
              "--steps", "2", "--seed", "7", "-o", ""]
    anchored = Recorder()
    params = anchored.attach(small_params(steps=2, first_frame=os.fsencode(red), last_frame=os.fsencode(blue)))
    result, error = generate(lib, ctx, b"x", params)
    assert result is not None, error
    run = run_sim(capsys, *common, "--first-frame", str(red), "--last-frame", str(blue),
                  "--frames-dir", str(tmp_path / "anchored"))
    assert run.code == 0, run.err
    cli_frames = _frames_dir(tmp_path / "anchored")
    assert [f["rgb"].tobytes() for f in anchored.finals] == [f.tobytes() for f in cli_frames]

    referenced = Recorder()
    array = _references((libh3.H3_REFERENCE_IMAGE, os.fsencode(red), None, 0),
                        (libh3.H3_REFERENCE_AUDIO, os.fsencode(audio), None, 0))
    params = referenced.attach(small_params(steps=2, reference_count=2,
                                            references=ctypes.cast(array, ctypes.POINTER(libh3.h3_reference))))
    result, error = generate(lib, ctx, b"x", params)
    assert result is not None, error
    run = run_sim(capsys, *common, "--ref-image", str(red), "--ref-audio", str(audio),
                  "--frames-dir", str(tmp_path / "referenced"))
    assert run.code == 0, run.err
    assert [f["rgb"].tobytes() for f in referenced.finals] == \
        [f.tobytes() for f in _frames_dir(tmp_path / "referenced")]
    phases = {phase for phase, _, _ in referenced.progress}
    assert {"Qwen vision", "video VAE encoder", "audio VAE encoder"} <= phases
    assert not np.array_equal(referenced.finals[0]["rgb"], anchored.finals[0]["rgb"])


def test_a_different_seed_gives_different_frames(lib: ctypes.CDLL, ctx) -> None:
    first, second = Recorder(), Recorder()
    generate(lib, ctx, b"x", first.attach(small_params()))
    generate(lib, ctx, b"x", second.attach(small_params(seed=8)))
    assert not np.array_equal(first.finals[0]["rgb"], second.finals[0]["rgb"])


def test_previews_once_per_step_then_the_final_frames(lib: ctypes.CDLL, ctx) -> None:
    recorder = Recorder()
    result, error = generate(lib, ctx, b"x", recorder.attach(small_params(steps=4, preview_denoise=1,
                                                                          width=96, height=64)))
    assert result is not None, error
    previews = recorder.previews
    assert [frame["denoise_step"] for frame in previews] == [0, 1, 2, 3]
    assert {(f["denoise_steps"], f["width"], f["height"], f["stride"], f["frame_count"])
            for f in previews} == {(4, 96, 64, 288, 22)}
    assert len({f["frame_index"] for f in previews}) == 1     # one representative frame
    assert recorder.frames[:4] == previews                      # all previews before the finals
    assert len(recorder.finals) == 22
    # Each preview arrives after its step's progress, before the next step's.
    phases = [phase for phase, _, _ in recorder.progress]
    assert "preview VAE load" in phases and phases.index("preview VAE load") < phases.index("denoise enqueue")


def test_prompts_empty_long_emoji_and_invalid_utf8(lib: ctypes.CDLL, ctx) -> None:
    assert generate(lib, ctx, b"", small_params()) == (None, "prompt must not be empty")
    for prompt in ("🎬 ünïcode 🦊".encode(), b"long " * 20_000):
        result, error = generate(lib, ctx, prompt, small_params())
        assert result is not None, error
    recorder = Recorder()
    assert generate(lib, ctx, b"caf\xe9", recorder.attach(small_params(), frames=False)) == \
        (None, "prompt is not valid UTF-8")


# ---------------------------------------------------------------- cancellation


def _phases_of_a_full_run(lib: ctypes.CDLL, ctx, tmp_path: Path) -> list[tuple[str, int, int]]:
    recorder = Recorder()
    params = recorder.attach(small_params(preview_denoise=1, output_path=os.fsencode(tmp_path / "full.mp4")))
    assert generate(lib, ctx, b"x", params)[0] is not None
    firsts: dict[str, tuple[str, int, int]] = {}
    for record in recorder.progress:
        firsts.setdefault(record[0], record)
    return list(firsts.values())


def test_cancel_by_return_value_in_every_phase(lib: ctypes.CDLL, ctx, tmp_path: Path) -> None:
    phases = _phases_of_a_full_run(lib, ctx, tmp_path)
    assert [phase for phase, _, _ in phases] == [
        "tokenizer", "text encoder", "refine text", "precompute AdaLN", "load transformer core",
        "preview VAE load", "denoise enqueue", "denoise", "audio VAE", "FFmpeg"]
    for phase, completed, _ in phases:
        output = tmp_path / f"{phase}.mp4"
        recorder = Recorder(cancel_at=(phase, completed))
        params = recorder.attach(small_params(preview_denoise=1, output_path=os.fsencode(output)))
        result, error = generate(lib, ctx, b"x", params)
        if phase == "FFmpeg":
            # h3.c:1669-1679: no cancellation check after "FFmpeg" 0/F; the clip is written and
            # the run succeeds, its error text saying the cancel came too late (as upstream's
            # libh3 does: bench/differential_cases.py capi-0170 to capi-0173).
            assert result is not None and output.is_file()
            assert error == "generation cancelled during FFmpeg"
            continue
        assert (result, error) == (None, f"generation cancelled during {phase}")
        assert not output.exists()
        # The callback is not called again once it asked to cancel.
        assert recorder.progress[-1] == (phase, completed, recorder.progress[-1][2])


def test_cancel_from_the_frame_callback(lib: ctypes.CDLL, ctx) -> None:
    preview = Recorder(cancel_frame=(1, 11))
    params = preview.attach(small_params(preview_denoise=1))
    assert generate(lib, ctx, b"x", params) == (None, "generation cancelled during denoising preview 2")
    assert preview.finals == []
    final = Recorder(cancel_frame=(-1, 5))
    assert generate(lib, ctx, b"x", final.attach(small_params())) == \
        (None, "generation cancelled while delivering frame 5")
    assert len(final.finals) == 6


# ---------------------------------------------------------------- caches


def test_cache_hits_on_the_second_call(lib: ctypes.CDLL, ctx, capfd: pytest.CaptureFixture[str]) -> None:
    info = libh3.h3_cache_info()
    lib.h3_cache_get_info(ctx, ctypes.byref(info))
    assert (info.embedding_entries, info.prepared_dit, info.video_decoder) == (0, 0, 0)
    lib.h3_cache_set_enabled(ctx, 1)
    first, second = Recorder(), Recorder()
    assert generate(lib, ctx, b"warm", first.attach(small_params()))[0] is not None
    capfd.readouterr()
    assert generate(lib, ctx, b"warm", second.attach(small_params()))[0] is not None
    stderr = capfd.readouterr().err
    assert "h3: conditioning cache hit" in stderr and "h3: prepared DiT cache hit" in stderr
    assert "h3: video VAE cache hit" in stderr
    skipped = {"tokenizer", "text encoder", "refine text", "precompute AdaLN", "load transformer core"}
    assert skipped <= {phase for phase, _, _ in first.progress}
    assert not skipped & {phase for phase, _, _ in second.progress}
    assert [f["rgb"].tobytes() for f in first.finals] == [f["rgb"].tobytes() for f in second.finals]
    lib.h3_cache_get_info(ctx, ctypes.byref(info))
    assert (info.embedding_entries, info.prepared_dit, info.video_decoder) == (1, 1, 1)
    assert info.embedding_bytes > 0
    lib.h3_cache_clear(ctx)
    lib.h3_cache_get_info(ctx, ctypes.byref(info))
    assert (info.embedding_entries, info.embedding_bytes, info.prepared_dit, info.video_decoder) == (0, 0, 0, 0)
    generate(lib, ctx, b"warm", Recorder().attach(small_params()))
    lib.h3_cache_set_enabled(ctx, 0)          # disabling also clears (h3.c:66-70)
    lib.h3_cache_get_info(ctx, ctypes.byref(info))
    assert (info.embedding_entries, info.prepared_dit, info.video_decoder) == (0, 0, 0)
    lib.h3_cache_get_info(None, ctypes.byref(info))   # NULL context: zeroed, no crash


# ---------------------------------------------------------------- faults


def test_fail_phase_gives_the_metal_message(lib: ctypes.CDLL, ctx, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "audio VAE:3")
    recorder = Recorder()
    assert generate(lib, ctx, b"x", recorder.attach(small_params())) == (None, METAL_FAILURE)
    assert recorder.progress[-1] == ("audio VAE", 3, 7)
    monkeypatch.setenv("H3_SIM_FAIL_MESSAGE", "MTLCommandBuffer error: out of memory")
    assert generate(lib, ctx, b"x", small_params()) == (None, "MTLCommandBuffer error: out of memory")


DRIVER = textwrap.dedent("""
    import ctypes, os, sys
    sys.path.insert(0, {tests!r})
    from h3bridge import libh3
    from double_helpers import Recorder, small_params
    lib = libh3.load_library({library!r})
    ctx = lib.h3_load_dir({model!r})
    recorder = Recorder()
    params = recorder.attach(small_params())
    run = lambda: lib.h3_generate(ctx, b"x", ctypes.byref(params))
    if os.environ.get("DRIVER_THREAD"):
        import threading
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    else:
        run()
    print("returned", lib.h3_last_error(ctx).decode(), len(recorder.finals))
""")


def _driver(tmp_path: Path, model: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=str(Path(__file__).parent), library=str(double_library_path()),
                                    model=os.fsencode(model)))
    return subprocess.Popen([sys.executable, str(script)], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@pytest.mark.parametrize("thread", ["", "1"], ids=["main thread", "other thread"])
def test_crash_phase_kills_the_process_with_sigsegv(model: Path, tmp_path: Path, thread: str) -> None:
    process = _driver(tmp_path, model, {"H3_SIM_CRASH_PHASE": "denoise enqueue:1", "DRIVER_THREAD": thread})
    out, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGSEGV and "returned" not in out, err


def test_a_generation_on_another_thread(model: Path, tmp_path: Path) -> None:
    process = _driver(tmp_path, model, {"DRIVER_THREAD": "1"})
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and out == "returned  22\n", err


def test_hang_phase_goes_silent_after_writing_the_notice(model: Path, tmp_path: Path) -> None:
    notice = tmp_path / "hung"
    process = _driver(tmp_path, model, {"H3_SIM_HANG_PHASE": "audio VAE:2",
                                        "H3_SIM_HANG_NOTICE": str(notice)})
    try:
        deadline = time.monotonic() + 60      # a safety net: the notice comes within a second
        while not notice.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the hang fault never fired"
            time.sleep(0.05)
        assert notice.read_text().strip() == str(process.pid)
        assert process.poll() is None        # hung, not finished
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
