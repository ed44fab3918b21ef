"""The `h3bridge` command line: generate (flags, --json, errors, Ctrl-C) and doctor."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from core_helpers import assert_group_gone, media, model_dir, not_regular_outputs, sim_engine_path, sim_invocations, sim_log  # noqa: F401
from h3bridge.cli.main import build_parser, main, request_from_args
from h3bridge import Reference, ReferenceKind, SlowerPath

FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]


def cli(*args: str, model: Path, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed console script the way a user would."""
    command = [sys.executable, "-m", "h3bridge.cli", *args, "--engine-path", str(sim_engine_path()),
               "--model-dir", str(model)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=120, **kwargs)


def test_generate_json(model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "fox.mp4"
    done = cli("generate", "-p", "a red fox", *FAST_FLAGS, "-o", str(output), "--json", model=model_dir)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["video_path"] == str(output) and output.is_file()
    assert result["frames_shape"] is None and result["audio_shape"] == [2, 29600]   # the MP4 is the result
    assert result["fps"] == 24 and result["seed"] == 42 and result["timings"]["total"] > 0
    # Progress goes to stderr; without a terminal, one line per phase instead of bar redraws.
    assert "h3bridge: denoise (overall" in done.stderr and "\r" not in done.stderr
    again = cli("generate", "-p", "a red fox", *FAST_FLAGS, "-o", str(tmp_path / "b.mp4"), "--json",
                "--read-frames", model=model_dir)
    assert json.loads(again.stdout)["frames_shape"] == [22, 64, 96, 3]


def test_flags_map_to_the_request(tmp_path: Path) -> None:
    args = build_parser().parse_args([
        "generate", "-p", "x", "--preset", "balanced", "--steps", "9", "--seconds", "2.5", "--seed", "5",
        "--ref-image", "a.png", "--ref-audio", "b.wav", "--ref-video-audio", "v.mp4", "s.wav", "--ref-image", "c.png",
        "--slower-paths", "bf16-qkv", "--token-reduction", "--ref-image-size", "max", "--core-reuse", "1"])
    request = request_from_args(args)
    assert (request.steps, request.layers, request.reuse) == (9, 45, 2)      # preset, explicit steps win
    assert request.seconds == 2.5 and request.frames is None and request.seed == 5
    assert request.references == (Reference(ReferenceKind.IMAGE, Path("a.png")),
                                  Reference(ReferenceKind.AUDIO, Path("b.wav")),
                                  Reference(ReferenceKind.VIDEO_AUDIO, Path("v.mp4"), Path("s.wav")),
                                  Reference(ReferenceKind.IMAGE, Path("c.png")))
    assert request.slower_paths == frozenset({SlowerPath.BF16_QKV}) and request.token_reduction
    assert request.reference_image_size.value == "max"


def test_bad_values_exit_2_with_the_fix(model_dir: Path, tmp_path: Path) -> None:
    done = cli("generate", "-p", "fox", "--width", "96", "--height", "64", "--frames", "23", "-o",
               str(tmp_path / "x.mp4"), model=model_dir)
    assert done.returncode == 2
    assert "--frames 23 is not a legal H3 length; the next legal lengths are 22 and 39" in done.stderr
    assert "fix:" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(SystemExit) as caught:
        main(["generate", "--frames", "22"])          # argparse: -p is required
    assert caught.value.code == 2


def test_existing_output_exit_2_and_kept(model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "mine.mp4"
    output.write_bytes(b"keep me")
    done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", str(output), model=model_dir)
    assert done.returncode == 2 and "already exists" in done.stderr and "--overwrite" in done.stderr
    assert output.read_bytes() == b"keep me"
    done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", str(output), "--overwrite", "--quiet", model=model_dir)
    assert done.returncode == 0 and output.read_bytes() != b"keep me"


def test_engine_failure_exit_1_with_h3s_words(model_dir: Path, tmp_path: Path) -> None:
    done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", str(tmp_path / "x.mp4"), model=model_dir,
               env={"H3_SIM_FAIL_PHASE": "denoise", "H3_SIM_FAIL_MESSAGE": "GPU fell over"})
    assert done.returncode == 1 and "h3 failed: GPU fell over" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.mp4").exists()


def test_missing_engine_exit_2_with_build_hint(tmp_path: Path, model_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "generate", "-p", "x", "--engine-path",
                           str(tmp_path / "h3"), "--model-dir", str(model_dir)], capture_output=True, text=True)
    assert done.returncode == 2 and "github.com/antirez/h3.c" in done.stderr and "h3-sim" in done.stderr


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_ctrl_c_kill_or_hangup_cancels_cleanly(model_dir: Path, tmp_path: Path, sim_log: Path,
                                               signum: int, status: int) -> None:
    """Ctrl-C, `kill` and a closed terminal all stop the engine (its own process group would
    otherwise keep rendering and holding the model) and leave nothing behind."""
    output = tmp_path / "never.mp4"
    hung = tmp_path.parent / f"{tmp_path.name}-hung"
    command = [sys.executable, "-m", "h3bridge.cli", "generate", "-p", "fox", *FAST_FLAGS, "-o", str(output),
               "--engine-path", str(sim_engine_path()), "--model-dir", str(model_dir)]
    # As from a terminal: the signal is not ignored. (Run in the background, pytest inherits an
    # ignored SIGINT from the shell, and the CLI rightly keeps a signal its caller ignores.)
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL),
                               env={**os.environ, "H3_SIM_HANG_PHASE": "denoise", "H3_SIM_HANG_NOTICE": str(hung)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not hung.exists():     # the engine sits in its hung denoise
            assert process.poll() is None, "the CLI ended before the engine hung"
            time.sleep(0.01)
        engine_pids = [record["pid"] for record in sim_invocations(sim_log)]
        assert hung.exists() and engine_pids, "the engine never reached the denoise phase"
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == status
    assert "Traceback" not in stderr and "cancelled" in stderr
    for pid in engine_pids:
        assert_group_gone(pid)            # h3 ran as its own group leader: pgid == pid
    assert list(tmp_path.glob("*.mp4")) == [] and list(tmp_path.glob(".*")) == []


def test_doctor_reports_what_is_there(model_dir: Path) -> None:
    done = cli("doctor", "--json", model=model_dir)
    report = json.loads(done.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["engine"]["ok"] and checks["ffmpeg"]["ok"] and checks["model"]["ok"]
    assert "GiB total" in checks["memory"]["detail"]
    assert done.returncode == 0 and report["ok"]


def test_doctor_says_which_code_folds_loras_and_how_to_get_the_faster_one(model_dir: Path) -> None:
    from h3bridge.lora import compiled
    checks = {c["check"]: c for c in json.loads(cli("doctor", "--json", model=model_dir).stdout)["checks"]}
    if compiled.available():
        assert checks["lora fold"]["detail"] == f"compiled kernels ({compiled.name()})"
    without = subprocess.run([sys.executable, "-m", "h3bridge.cli", "doctor", "--json", "--model-dir", str(model_dir)],
                             capture_output=True, text=True, env={**os.environ, compiled.ENVIRONMENT: "numpy"})
    detail = {c["check"]: c for c in json.loads(without.stdout)["checks"]}["lora fold"]["detail"]
    assert detail.startswith(f"numpy (no compiled kernels: ImportError: {compiled.ENVIRONMENT}=numpy)")
    assert "pip install 'h3bridge[fast-fold]'" in detail


def test_doctor_says_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "doctor", "--engine-path", str(tmp_path / "h3"),
                           "--model-dir", str(tmp_path)], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "H3_MODEL_DIR"})
    assert done.returncode == 1
    assert "MISSING engine" in done.stdout and "MISSING model" in done.stdout
    assert "FL2VA/transformer/config.json" in done.stdout and "fix:" in done.stdout
    assert psutil.virtual_memory().total > 0


def test_doctor_uses_the_model_inventory(tmp_path: Path) -> None:
    """doctor flags what h3's own inventory would let through (AppleDouble shards), with the fix."""
    from h3bridge.sim.fixture import write_fixture_model
    model = write_fixture_model(tmp_path / "model", ref2va=False)
    (model / "FL2VA/transformer/._model-00001-of-00007.safetensors").write_bytes(b"\0\5\26\7" + bytes(60))
    done = cli("doctor", "--json", model=model)
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == 1 and not checks["model"]["ok"]
    assert "AppleDouble" in checks["model"]["detail"] and "._*" in checks["model"]["fix"]


def test_no_mp4_and_no_frames(model_dir: Path, tmp_path: Path) -> None:
    done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", "", "--no-frames", "--json", "--quiet", model=model_dir,
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["video_path"] is None and result["frames_shape"] is None and result["audio_shape"] == [2, 29600]
    assert list(tmp_path.iterdir()) == []


def test_output_names_that_would_fail_after_the_render_are_refused_before(model_dir: Path, tmp_path: Path) -> None:
    longest = tmp_path / ("b" * 251 + ".mp4")                 # 255 bytes: the temporary name must still fit
    done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", str(longest), "--quiet", model=model_dir)
    assert done.returncode == 0, done.stderr
    assert longest.is_file()
    cases = {
        "b" * 252 + ".mp4": "over this file system's 255",
        "clip.mkv": "does not end in .mp4",
        "newdir/": "names a folder",
    }
    dangling = tmp_path / "link.mp4"
    dangling.symlink_to(tmp_path / "nowhere" / "t.mp4")
    cases["link.mp4"] = "already exists"
    for name, words in cases.items():
        done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", str(tmp_path) + "/" + name, model=model_dir)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, (name, done.stderr)
    assert dangling.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == sorted([longest.name, "link.mp4"])


def test_a_closed_stderr_does_not_cost_the_render(model_dir: Path, tmp_path: Path) -> None:
    """Progress is a courtesy: `h3bridge generate ... 2>&1 | head -c5` must still give the clip."""
    output = tmp_path / "fox.mp4"
    command = [sys.executable, "-m", "h3bridge.cli", "generate", "-p", "fox", *FAST_FLAGS, "-o", str(output),
               "--engine-path", str(sim_engine_path()), "--model-dir", str(model_dir)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    process.stderr.close()                                  # the reader went away
    assert process.wait(120) == 0 and output.is_file()


def test_a_failed_engine_leaves_its_log_where_the_hint_says(model_dir: Path, tmp_path: Path) -> None:
    done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", str(tmp_path / "x.mp4"), model=model_dir,
               env={"H3_SIM_CRASH_PHASE": "denoise", "H3BRIDGE_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 1 and "engine log: " in done.stderr
    log = Path(done.stderr.split("engine log: ")[1].split()[0])
    assert log.parent == tmp_path / "cache" / "logs" and "denoise" in log.read_text()


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5", "lots"])
def test_plan_refuses_a_memory_size_that_is_not_one(value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "plan", "--memory-gb", value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a memory size" in done.stderr and "Traceback" not in done.stderr


def test_fixes_name_the_flags_the_user_typed(model_dir: Path) -> None:
    """The library says `core_reuse=6`; on the command line that is `--core-reuse 6`."""
    done = cli("generate", "-p", "fox", "--width", "96", "--height", "64", "--frames", "22", "--reuse", "2",
               "--core-reuse", "3", model=model_dir)
    assert done.returncode == 2 and "--core-reuse" in done.stderr and "core_reuse" not in done.stderr
    done = cli("generate", "-p", "fox", "--width", "95", "--height", "64", "--frames", "22", model=model_dir)
    assert done.returncode == 2 and "use --width 96" in done.stderr


def test_flag_words_never_touch_paths_or_file_names() -> None:
    """The CLI says an error's settings (its Fix, h3bridge.fixes) as flags and leaves its text alone:
    a path that looks like a setting stays the path."""
    from h3bridge import RequestError
    from h3bridge.cli.main import cli_error_text
    from h3bridge.fixes import Fix, changes, given, literal
    for text in ("the first frame /Users/me/clips/first_frame.png does not exist",
                 "the output /out/width=512.mp4 already exists", "my-last_frame.mp4 is not readable"):
        assert cli_error_text(RequestError(text)) == text
        assert cli_error_text(RequestError(Fix(literal(text) + "; use {}", (changes(core_reuse=6),)))) == \
            f"{text}; use --core-reuse 6"
    error = RequestError("no", hint=Fix("use {}, or set {}", (changes(core_reuse=6), given("render_height"))))
    assert cli_error_text(error) == "no\n  fix: use --core-reuse 6, or set --render-height"


def test_a_hangup_the_caller_ignores_does_not_stop_the_render(model_dir: Path, tmp_path: Path) -> None:
    """`nohup h3bridge generate ... &` then closing the terminal: the render goes on."""
    output = tmp_path / "fox.mp4"
    command = [sys.executable, "-m", "h3bridge.cli", "generate", "-p", "fox", *FAST_FLAGS, "-o", str(output),
               "--engine-path", str(sim_engine_path()), "--model-dir", str(model_dir)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
                               env={**os.environ, "H3_SIM_TIME_SCALE": "0.05"})
    line = process.stderr.readline()          # the first phase line: the run is under way
    assert line.startswith("h3bridge: ")
    process.send_signal(signal.SIGHUP)
    process.stderr.read()
    assert process.wait(120) == 0 and output.is_file()


PYTHON_NAMES = re.compile(r"\b[A-Z]\w*(?:Error|Engine|Result)\.\w+|\b[a-z]+_[a-z_]+=|\bengine_path\b|\bmodel_dir\b")


@pytest.mark.parametrize("fault, words", [
    ({"H3_SIM_CRASH_PHASE": "text encoder:3"}, "the engine crashed (SIGSEGV) during text encoder (last report 3/50)"),
    ({"H3_SIM_NO_METAL": "1"}, "no Metal device available"),
    ({"H3_SIM_FAIL_PHASE": "audio VAE", "H3_SIM_FAIL_MESSAGE": "Metal command buffer failed"}, "h3 failed"),
])
def test_failure_messages_speak_cli_not_python(model_dir: Path, tmp_path: Path, fault: dict[str, str],
                                               words: str) -> None:
    done = cli("generate", "-p", "fox", *FAST_FLAGS, "-o", str(tmp_path / "x.mp4"), "--quiet", model=model_dir,
               env={**fault, "H3BRIDGE_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 1 and words in done.stderr and "fix: " in done.stderr, done.stderr
    assert not PYTHON_NAMES.search(done.stderr), done.stderr
    if "H3_SIM_NO_METAL" in fault:      # Metal advice, not the memory / int8 one
        assert "Rosetta" in done.stderr and "int8" not in done.stderr


def test_a_prompt_too_long_for_the_command_line_exits_2_and_goes_warm_with_session(
        model_dir: Path, tmp_path: Path, sim_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In-process: the CLI's own argv could not carry 160 KiB either (same kernel limit)."""
    prompt = ("a red fox runs through deep snow at dawn " * 4000).strip()
    args = ["generate", "-p", prompt, *FAST_FLAGS, "--quiet", "--engine-path", str(sim_engine_path()),
            "--model-dir", str(model_dir)]
    assert main([*args, "-o", str(tmp_path / "one-shot.mp4")]) == 2
    err = capsys.readouterr().err
    assert "the prompt is" in err and "(--engine session)" in err and "SessionEngine" not in err
    assert "build h3" not in err and sim_invocations(sim_log) == []
    assert main([*args, "-o", str(tmp_path / "warm.mp4"), "--engine", "session"]) == 0
    assert (tmp_path / "warm.mp4").is_file()


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_an_output_that_is_not_a_regular_file_is_refused_before_the_engine_and_kept(
        model_dir: Path, tmp_path: Path, sim_log: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        overwrite: list[str]) -> None:
    """With --overwrite, a FIFO, a device node or a dangling link at -o was replaced by the clip after
    the render (issue 29): exit 2 naming what it is, before the engine starts, and left as it was."""
    made = not_regular_outputs(tmp_path, ".mp4")
    names, folder = list(made.values()), made["folder"]
    before = {path: (os.lstat(path).st_mode, os.lstat(path).st_ino) for path in names}
    for path in names:
        status = main(["generate", "-p", "fox", *FAST_FLAGS, "-o", str(path), *overwrite, "--quiet",
                       "--engine-path", str(sim_engine_path()), "--model-dir", str(model_dir)])
        err = capsys.readouterr().err
        assert status == 2 and f"{path} already exists and is a" in err and "Traceback" not in err, (path, err)
    assert sim_invocations(sim_log) == []
    assert {path: (os.lstat(path).st_mode, os.lstat(path).st_ino) for path in names} == before
    assert sorted(tmp_path.iterdir()) == sorted(names) and list(folder.iterdir()) == []
