"""OneShotEngine against h3-sim: results, progress, failures, cancellation, safety of outputs."""
from __future__ import annotations

import threading
from pathlib import Path

import av
import numpy as np
import psutil
import pytest

from core_helpers import (  # noqa: F401  (fixtures)
    assert_group_gone,
    cancel_when_called,
    fast_request,
    media,
    model_dir,
    sim_engine_path,
    sim_invocations,
    sim_log,
)
from h3bridge import (
    CancelToken,
    EngineCrashedError,
    EngineError,
    EngineNotFoundError,
    EngineStalledError,
    GenerationCancelled,
    OneShotEngine,
    OutputExistsError,
    ProgressEvent,
    Reference,
    ReferenceKind,
    locate_engine,
)
from h3bridge.engines.locate import engine_working_directory
from upstream_helpers import BOTH_ENGINES, UPSTREAM, realistic_model, upstream_engine_or_skip  # noqa: F401 (fixture)

T2VA_PHASES = ["tokenizer", "text encoder", "refine text", "precompute AdaLN", "load transformer core",
               "denoise enqueue", "denoise", "audio VAE", "video VAE load", "FFmpeg"]


@pytest.fixture(autouse=True)
def private_temp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """The engine's work folders (tempfile.mkdtemp: frames, audio-only MP4) go to a folder of
    this test's own, which must be empty again after every test: success, failure, crash,
    watchdog or cancel leave nothing in the temp directory."""
    import tempfile
    root = tmp_path_factory.mktemp("engine-temp")
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert files_in(root) == [], "the engine left files in the temp directory"


@pytest.fixture
def engine(request: pytest.FixtureRequest, model_dir: Path) -> OneShotEngine:
    """h3-sim on the tiny fixture; for tests marked `both_engines`, also upstream's own h3 (built
    from H3_UPSTREAM_SOURCE over the portable backend) on the realistic fixture it requires."""
    if getattr(request, "param", None) == UPSTREAM:
        return OneShotEngine(upstream_engine_or_skip().program, request.getfixturevalue("realistic_model"),
                             stall_timeout=60)
    return OneShotEngine(sim_engine_path(), model_dir, stall_timeout=60)


both_engines = pytest.mark.parametrize("engine", BOTH_ENGINES, indirect=True)


def phase_sequence(events: list[ProgressEvent]) -> list[str]:
    phases: list[str] = []
    for event in events:
        if not phases or phases[-1] != event.phase:
            phases.append(event.phase)
    return phases


def check_event_stream(events: list[ProgressEvent]) -> None:
    """Fractions and elapsed never go backwards; counters stay within their totals."""
    assert events
    for before, after in zip(events, events[1:]):
        assert after.fraction >= before.fraction
        assert after.elapsed >= before.elapsed
        if after.phase == before.phase and after.total == before.total:
            # a phase may run once per reference (Qwen vision n/27 per visual): restarts follow a full count
            assert after.done >= before.done or before.done == before.total
    assert all(0 <= e.done <= e.total and 0.0 <= e.fraction <= 1.0 for e in events)
    assert events[-1].fraction == pytest.approx(1.0)


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


# ----------------------------------------------------------------------------- results and progress

@both_engines
def test_t2va_result_and_progress(engine: OneShotEngine, tmp_path: Path) -> None:
    events: list[ProgressEvent] = []
    output = tmp_path / "clips" / "fox.mp4"
    result = engine.generate(fast_request(), output, on_progress=events.append)
    assert phase_sequence(events) == T2VA_PHASES
    check_event_stream(events)
    assert result.video_path == output and files_in(output.parent) == ["fox.mp4"]
    assert result.frames is not None and result.frames.shape == (22, 64, 96, 3) and result.frames.dtype == np.uint8
    # h3: audio_t = llround(22 * 40 / 24) = 37 latents of 800 samples, stereo, 32 kHz.
    assert result.audio is not None and result.audio.dtype == np.float32 and result.audio.shape == (2, 37 * 800)
    assert (result.width, result.height, result.frame_count, result.fps, result.sample_rate) == (96, 64, 22, 24, 32000)
    with av.open(str(output)) as container:
        assert container.streams.video[0].frames == 22 and container.streams.audio[0].rate == 32000
    assert set(T2VA_PHASES) <= set(result.timings) and result.timings["total"] > 0
    command = result.command
    assert command[0] == str(engine.engine_path) and command[command.index("-d") + 1] == str(engine.model_dir)
    assert "--frames-dir" in command and "h3: wrote" in result.engine_log


def test_fl2va_progress_and_anchor_paths(engine: OneShotEngine, media: dict[str, Path], tmp_path: Path,
                                         sim_log: Path) -> None:
    events: list[ProgressEvent] = []
    request = fast_request(first_frame=media["image"], last_frame=media["image2"])
    result = engine.generate(request, tmp_path / "fl.mp4", on_progress=events.append)
    phases = phase_sequence(events)
    assert phases[0] == "tokenizer" and phases[-4:] == ["denoise", "audio VAE", "video VAE load", "FFmpeg"]
    assert {"video VAE encoder", "Qwen vision"} <= set(phases)
    assert phases.index("Qwen vision") < phases.index("text encoder")
    check_event_stream(events)
    argv = sim_invocations(sim_log)[0]["argv"]
    assert argv[argv.index("--first-frame") + 1] == str(media["image"].absolute())
    assert result.frames is not None and result.frames.shape[0] == 22


@both_engines
def test_ref2va_progress(engine: OneShotEngine, media: dict[str, Path], tmp_path: Path) -> None:
    events: list[ProgressEvent] = []
    request = fast_request(frames=56, references=(Reference(ReferenceKind.IMAGE, media["image"]),
                                                  Reference(ReferenceKind.VIDEO, media["video3s"]),
                                                  Reference(ReferenceKind.AUDIO, media["audio3s"])))
    result = engine.generate(request, tmp_path / "ref.mp4", on_progress=events.append)
    phases = phase_sequence(events)
    assert {"audio VAE encoder", "video VAE encoder", "Qwen vision"} <= set(phases)
    assert phases.index("audio VAE encoder") < phases.index("text encoder") < phases.index("denoise")
    check_event_stream(events)
    assert result.frames is not None and result.frames.shape == (56, 64, 96, 3)


def test_frames_only_and_audio_only_leave_no_mp4(engine: OneShotEngine, tmp_path: Path, sim_log: Path) -> None:
    frames_only = engine.generate(fast_request(), None, want_audio=False)
    argv = sim_invocations(sim_log)[-1]["argv"]
    assert argv[argv.index("-o") + 1] == ""           # h3: -o '' writes no MP4
    assert frames_only.video_path is None and frames_only.audio is None and frames_only.frames is not None
    audio_only = engine.generate(fast_request(), None, want_frames=False)
    argv = sim_invocations(sim_log)[-1]["argv"]
    temp_mp4 = Path(argv[argv.index("-o") + 1])
    assert "--frames-dir" not in argv and audio_only.frames is None and audio_only.audio is not None
    assert not temp_mp4.exists() and not temp_mp4.parent.exists()      # private temp dir removed


@both_engines
def test_frames_dir_is_private_and_removed(engine: OneShotEngine, tmp_path: Path) -> None:
    result = engine.generate(fast_request(), tmp_path / "a.mp4")
    frames_dir = Path(result.command[result.command.index("--frames-dir") + 1])
    assert frames_dir.is_absolute() and not frames_dir.exists() and not frames_dir.parent.exists()


@both_engines
def test_determinism(engine: OneShotEngine) -> None:
    first = engine.generate(fast_request(seed=7), None, want_audio=False)
    again = engine.generate(fast_request(seed=7), None, want_audio=False)
    other = engine.generate(fast_request(seed=8), None, want_audio=False)
    np.testing.assert_array_equal(first.frames, again.frames)
    assert not np.array_equal(first.frames, other.frames)


def test_arguments_reach_the_engine_intact(engine: OneShotEngine, media: dict[str, Path], tmp_path: Path,
                                          sim_log: Path) -> None:
    prompt = ("A fox says \"hi\" & 'bye'; $(rm -rf /) `id` | tee > /dev/null < x * ? [a] {b} ~ # %s \\ \n"
              "second line\tTAB — ünïcødé 狐狸 🦊 -p --width 32")
    weird_dir = tmp_path / "out dir $HOME; 'quoted' \"d\" ü 🦊"
    weird_dir.mkdir()
    anchor = weird_dir / "first frame (1) & co.png"
    anchor.write_bytes(media["image"].read_bytes())
    output = weird_dir / "clip `name` $(x).mp4"
    result = engine.generate(fast_request(prompt=prompt, first_frame=anchor), output)
    record = sim_invocations(sim_log)[0]
    assert record["argv"] == result.command[1:] or record["argv"] == result.command
    argv = record["argv"]
    assert argv[argv.index("-p") + 1] == prompt
    assert argv[argv.index("--first-frame") + 1] == str(anchor)
    assert Path(argv[argv.index("-o") + 1]).parent == weird_dir
    assert record["cwd"] == str(engine_working_directory(engine.engine_path))   # shaders by relative path
    assert output.is_file() and files_in(weird_dir) == sorted([anchor.name, output.name])


# ----------------------------------------------------------------------------- outputs are never lost

def test_existing_output_is_never_overwritten(engine: OneShotEngine, tmp_path: Path, sim_log: Path) -> None:
    output = tmp_path / "mine.mp4"
    output.write_bytes(b"precious")
    with pytest.raises(OutputExistsError, match="already exists"):
        engine.generate(fast_request(), output)
    assert output.read_bytes() == b"precious"
    assert sim_invocations(sim_log) == []                      # refused before the engine started
    engine.generate(fast_request(), output, overwrite=True)
    assert output.read_bytes() != b"precious" and files_in(tmp_path) == sorted(["mine.mp4", sim_log.name])


def test_invalid_request_never_starts_the_engine(engine: OneShotEngine, tmp_path: Path, sim_log: Path) -> None:
    from h3bridge import RequestError
    with pytest.raises(RequestError):
        engine.generate(fast_request(frames=23), tmp_path / "x.mp4")
    assert sim_invocations(sim_log) == [] and not (tmp_path / "x.mp4").exists()


# ----------------------------------------------------------------------------- failures

@both_engines
def test_engine_failure_keeps_h3s_message(engine: OneShotEngine, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "audio VAE")
    monkeypatch.setenv("H3_SIM_FAIL_MESSAGE", "Metal said: out of \"resources\" (0x1)")
    output = tmp_path / "out" / "fail.mp4"
    with pytest.raises(EngineError) as caught:
        engine.generate(fast_request(), output)
    error = caught.value
    assert type(error) is EngineError and error.exit_code == 1
    # Deliberate difference: upstream prefixes a failed command buffer with the operation that
    # submitted it ("submit AudioVAE input: <Metal's text>"); h3-sim raises the injected text
    # alone. Either way the engine's line reaches the error verbatim.
    assert error.engine_message.endswith("Metal said: out of \"resources\" (0x1)")
    assert f"h3: {error.engine_message}" in error.stderr and error.command[0] == str(engine.engine_path)
    assert files_in(output.parent) == []


def test_model_load_failure_is_reported_verbatim(tmp_path: Path) -> None:
    empty_model = tmp_path / "empty model"
    empty_model.mkdir()
    engine = OneShotEngine(sim_engine_path(), empty_model)
    with pytest.raises(EngineError) as caught:
        engine.generate(fast_request(), tmp_path / "x.mp4")
    assert caught.value.exit_code == 1 and caught.value.engine_message
    assert f"h3: {caught.value.engine_message}" in caught.value.stderr
    assert not (tmp_path / "x.mp4").exists()


def test_usage_error_exit_2_is_an_engine_error(tmp_path: Path, model_dir: Path) -> None:
    wrapper = tmp_path / "h3"
    wrapper.write_text(f"#!/bin/sh\nexec '{sim_engine_path()}' --no-such-flag \"$@\"\n")
    wrapper.chmod(0o755)
    with pytest.raises(EngineError) as caught:
        OneShotEngine(wrapper, model_dir).generate(fast_request(), tmp_path / "x.mp4")
    assert type(caught.value) is EngineError and caught.value.exit_code == 2
    assert "command line" in caught.value.message


def test_h3_copied_away_from_its_shaders_gets_a_fix_not_gpu_advice(tmp_path: Path, model_dir: Path,  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """h3 compiles h3_shaders.metal from its working directory (h3_gpu.m:353). A symlink to the
    binary still runs from the checkout; a copy cannot, and the error says how to fix it."""
    import shutil
    monkeypatch.setenv("H3_SIM_SHADERS", "1")
    checkout = tmp_path / "h3.c"
    checkout.mkdir()
    binary = checkout / "h3"
    binary.write_text(f"#!/bin/sh\nexec '{sim_engine_path()}' \"$@\"\n")
    binary.chmod(0o755)
    (checkout / "h3_shaders.metal").write_text("// shaders\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "h3").symlink_to(binary)
    assert OneShotEngine(bin_dir / "h3", model_dir).generate(fast_request(), tmp_path / "a.mp4").video_path.is_file()
    copied = tmp_path / "elsewhere" / "h3"
    copied.parent.mkdir()
    shutil.copy2(binary, copied)
    with pytest.raises(EngineError) as caught:
        OneShotEngine(copied, model_dir).generate(fast_request(), tmp_path / "b.mp4")
    assert caught.value.engine_message == ("cannot compile h3_shaders.metal: The file \u201ch3_shaders.metal\u201d "
                                           "couldn\u2019t be opened because there is no such file.")
    assert "h3.c checkout" in (caught.value.hint or "") and "int8" not in (caught.value.hint or "")
    assert not (tmp_path / "b.mp4").exists()


def test_the_result_lists_the_upstream_variables_the_engine_ran_with(engine: OneShotEngine, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """h3 reads H3_* tuning variables (H3_TOKEN_REDUCTION turns token reduction on, h3_dit.c:380):
    a result that only showed the request would misreport such a clip."""
    monkeypatch.setenv("H3_TOKEN_REDUCTION", "1")
    result = engine.generate(fast_request(), tmp_path / "a.mp4", want_frames=False)
    assert result.engine_variables["H3_TOKEN_REDUCTION"] == "1"
    assert Path(result.engine_variables["H3_FFMPEG"]).name == "ffmpeg"      # pinned by h3bridge
    assert all(name.startswith("H3_") for name in result.engine_variables)


@pytest.mark.parametrize("ssd_streaming", [False, True])
def test_a_sigkilled_engine_gets_memory_advice_it_has_not_already_taken(engine: OneShotEngine, tmp_path: Path,
                                                                        sim_log: Path,  # noqa: F811
                                                                        ssd_streaming: bool) -> None:
    """macOS ends a process that runs out of memory with SIGKILL: the hint lists what to try,
    and not SSD streaming when the request already streams."""
    import os
    import signal
    from core_helpers import sim_invocations

    def on_progress(event) -> None:
        if event.phase == "denoise":
            os.kill(sim_invocations(sim_log)[0]["pid"], signal.SIGKILL)

    with pytest.raises(EngineCrashedError) as caught:
        engine.generate(fast_request(ssd_streaming=ssd_streaming), tmp_path / "x.mp4", on_progress=on_progress)
    hint = caught.value.hint or ""
    assert caught.value.exit_code == -signal.SIGKILL and "ran out of memory" in hint
    assert ("ssd_streaming" in hint) is (not ssd_streaming) and "fewer frames" in hint
    assert not (tmp_path / "x.mp4").exists()


def test_a_failed_job_takes_back_the_folders_it_made_for_its_output(engine: OneShotEngine, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "denoise")
    with pytest.raises(EngineError):
        engine.generate(fast_request(), tmp_path / "new" / "deeper" / "x.mp4")
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "mine"
    (kept / "deeper").mkdir(parents=True)
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(EngineError):
        engine.generate(fast_request(), kept / "deeper" / "more" / "x.mp4")
    assert sorted(p.name for p in kept.iterdir()) == ["deeper", "notes.txt"] and list((kept / "deeper").iterdir()) == []


@both_engines
def test_crash_is_typed(engine: OneShotEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_CRASH_PHASE", "denoise")
    with pytest.raises(EngineCrashedError) as caught:
        engine.generate(fast_request(), tmp_path / "x.mp4")
    assert caught.value.exit_code < 0 and "SIGSEGV" in caught.value.message
    assert "denoise" in caught.value.stderr
    assert files_in(tmp_path) == []


def test_watchdog_stops_a_hung_engine(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      sim_log: Path) -> None:
    monkeypatch.setenv("H3_SIM_HANG_PHASE", "tokenizer:1")
    # 5 s, not less: the watchdog also counts h3's silent start-up, which on a loaded machine
    # can outlast a shorter allowance before h3-sim has even logged its pid.
    engine = OneShotEngine(sim_engine_path(), model_dir, stall_timeout=5.0)
    output = tmp_path / "out" / "x.mp4"
    with pytest.raises(EngineStalledError) as caught:
        engine.generate(fast_request(), output)
    assert "no progress for 5 s" in caught.value.message and caught.value.command[0] == str(engine.engine_path)
    assert_groups_gone([record["pid"] for record in sim_invocations(sim_log)])   # pgid == pid (own session)
    assert files_in(output.parent) == []


# ----------------------------------------------------------------------------- cancellation

def assert_groups_gone(pgids: list[int]) -> None:
    assert pgids
    for pgid in set(pgids):
        assert_group_gone(pgid)


REFERENCE_PHASES = ("audio VAE encoder", "video VAE encoder", "Qwen vision")


@both_engines
@pytest.mark.parametrize("phase", ["tokenizer", "text encoder", "refine text", "precompute AdaLN",
                                   "load transformer core", "denoise", "audio VAE", "video VAE load", "FFmpeg",
                                   *REFERENCE_PHASES])
def test_cancel_in_each_phase(engine: OneShotEngine, media: dict[str, Path], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch, phase: str) -> None:
    monkeypatch.setenv("H3_SIM_HANG_PHASE", phase)     # hold the engine inside `phase`
    request = fast_request()
    if phase in REFERENCE_PHASES:      # phases only a Ref2VA job runs
        request = fast_request(frames=56, references=(Reference(ReferenceKind.VIDEO, media["video3s"]),
                                                      Reference(ReferenceKind.AUDIO, media["audio3s"])))
    token = CancelToken()
    pgids: list[int] = []

    def on_progress(event: ProgressEvent) -> None:
        pgids.extend(child.pid for child in psutil.Process().children())
        if event.phase == phase:
            threading.Thread(target=token.cancel).start()    # cancel from another thread
    output = tmp_path / "out" / "cancelled.mp4"
    with pytest.raises(GenerationCancelled):
        engine.generate(request, output, on_progress=on_progress, cancel=token)
    assert_groups_gone(pgids)
    assert files_in(output.parent) == []


def test_cancel_after_the_engine_finished_publishes_nothing(engine: OneShotEngine, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a long clip's frames takes seconds after h3 exits; a cancel then still wins."""
    import h3bridge.engines.oneshot as engine_module
    token = CancelToken()
    cancel_when_called(monkeypatch, engine_module, "read_frames_dir", token)
    with pytest.raises(GenerationCancelled):
        engine.generate(fast_request(), tmp_path / "out" / "x.mp4", cancel=token)
    assert files_in(tmp_path / "out") == []


def test_cancel_token_check_hook(engine: OneShotEngine, tmp_path: Path) -> None:
    """A host's own interrupt flag (ComfyUI) is polled through CancelToken(check=...)."""
    seen: list[str] = []
    token = CancelToken(check=lambda: "denoise" in seen)
    with pytest.raises(GenerationCancelled):
        engine.generate(fast_request(), tmp_path / "x.mp4", on_progress=lambda e: seen.append(e.phase), cancel=token)
    assert "FFmpeg" not in seen and files_in(tmp_path) == []


# ----------------------------------------------------------------------------- locating tools

def test_missing_engine_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("H3_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineNotFoundError) as caught:
        locate_engine()
    # issue 30: the pinned commit and build-engine, as the README says (not an unpinned clone && make)
    hint = caught.value.hint or ""
    assert "antirez/h3.c" in hint and "checkout 8974cc0" in hint and "build-engine DIR" in hint and "h3-sim" in hint
    assert "&& make" not in hint
    with pytest.raises(EngineNotFoundError, match="does not exist"):
        locate_engine(tmp_path / "nope" / "h3")


def test_engine_from_env_and_checkout_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_BIN", str(sim_engine_path()))
    assert locate_engine() == sim_engine_path().absolute()
    checkout = tmp_path / "h3.c"
    checkout.mkdir()
    (checkout / "h3").write_text("#!/bin/sh\n")
    (checkout / "h3").chmod(0o755)
    assert locate_engine(checkout) == checkout / "h3"
    (checkout / "h3").chmod(0o644)
    with pytest.raises(EngineNotFoundError, match="not executable"):
        locate_engine(checkout)


def test_missing_ffmpeg_is_reported_before_starting(engine: OneShotEngine, tmp_path: Path, sim_log: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("H3_FFMPEG", raising=False)
    monkeypatch.delenv("H3_FFPROBE", raising=False)
    with pytest.raises(EngineNotFoundError) as caught:
        engine.generate(fast_request(), tmp_path / "x.mp4")
    assert "FFmpeg was not found" in caught.value.message and "brew install ffmpeg" in caught.value.hint
    assert sim_invocations(sim_log) == []
    # A job that needs no FFmpeg (no MP4, no audio, no media inputs) still runs.
    result = engine.generate(fast_request(), None, want_audio=False)
    assert result.frames is not None


def test_ffmpeg_paths_are_pinned_absolute(engine: OneShotEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         sim_log: Path) -> None:
    monkeypatch.setenv("H3_FFMPEG", "ffmpeg")        # a bare name, as a user might set it
    from h3bridge.engines.locate import engine_environment, locate_media_tools
    env = engine_environment(locate_media_tools())
    assert Path(env["H3_FFMPEG"]).is_absolute() and Path(env["H3_FFPROBE"]).is_absolute()
    engine.generate(fast_request(), tmp_path / "x.mp4")


def test_engine_runs_from_its_real_directory(model_dir: Path, tmp_path: Path, sim_log: Path) -> None:
    """A symlinked h3 (~/bin/h3 -> ~/h3.c/h3) still runs where its shaders are."""
    link_dir = tmp_path / "bin"
    link_dir.mkdir()
    (link_dir / "h3").symlink_to(sim_engine_path())
    engine = OneShotEngine(link_dir / "h3", model_dir)
    engine.generate(fast_request(), None, want_audio=False, want_frames=False)
    record = sim_invocations(sim_log)[0]
    assert record["cwd"] == str(sim_engine_path().resolve().parent) != str(link_dir)


# ----------------------------------------------------------------------------- validation agrees with the engine

AGREEMENT_CASES = {
    # name: (frames, references as (kind, media key[, audio key])), engine accepts?
    "short audio": (22, [("image", "image"), ("audio", "audio1s")], False),
    "long audio": (22, [("image", "image"), ("audio", "audio16s")], False),
    "audio over 15 s in total": (22, [("image", "image"), ("audio", "audio6s"), ("audio", "audio6s"),
                                      ("audio", "audio6s")], False),
    "soundtrack with 39 frames": (39, [("video", "video3s")], False),
    "soundtrack of a 1 s video": (56, [("video_audio", "video1s", "audio3s")], False),
    "image and 3 s audio": (22, [("image", "image"), ("audio", "audio3s")], True),
    "video soundtrack at 56 frames": (56, [("video", "video3s")], True),
}


@pytest.mark.parametrize("case", list(AGREEMENT_CASES))
def test_file_rules_agree_with_the_engine(case: str, engine: OneShotEngine, media: dict[str, Path]) -> None:
    """What validate() refuses, the engine itself refuses too (run directly, bypassing validation)."""
    import subprocess

    from h3bridge import RequestError
    frames, specs, engine_accepts = AGREEMENT_CASES[case]
    references = tuple(Reference(ReferenceKind(kind), media[key], media[rest[0]] if rest else None)
                       for kind, key, *rest in specs)
    request = fast_request(frames=frames, references=references)
    try:
        request.validate()
        accepted = True
    except RequestError:
        accepted = False
    done = subprocess.run(engine.command(request, "", None), capture_output=True, text=True, timeout=60,
                          cwd=engine_working_directory(engine.engine_path))
    assert (done.returncode == 0) == engine_accepts == accepted, done.stderr[-500:]


def test_output_that_appears_while_rendering_is_kept_and_so_is_the_new_clip(tmp_path: Path) -> None:
    """Another program wrote the output name mid-render: neither file is lost or replaced."""
    from h3bridge.engines.output import _publish
    from h3bridge.errors import OutputExistsError
    output = tmp_path / "clip.mp4"
    output.write_bytes(b"the user's own file")
    (tmp_path / "clip-2.mp4").write_bytes(b"an older keep")
    rendered = tmp_path / ".clip.mp4.abc.partial.mp4"
    rendered.write_bytes(b"new render")
    with pytest.raises(OutputExistsError, match="kept as .*clip-3.mp4"):
        _publish(rendered, output, overwrite=False)
    assert output.read_bytes() == b"the user's own file"
    assert (tmp_path / "clip-2.mp4").read_bytes() == b"an older keep"
    assert (tmp_path / "clip-3.mp4").read_bytes() == b"new render"
    assert not rendered.exists()


def test_output_folder_that_cannot_exist_is_refused_before_starting(engine: OneShotEngine, tmp_path: Path,
                                                                   sim_log: Path) -> None:
    """An output below a file (or in a folder we cannot write) fails now, typed, not after the render."""
    from h3bridge import RequestError
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    with pytest.raises(RequestError, match="not a writable folder") as caught:
        engine.generate(fast_request(), blocker / "sub" / "x.mp4")
    assert caught.value.field == "output"
    assert sim_invocations(sim_log) == [] and blocker.read_text() == "a file, not a folder"


def test_publish_failure_is_a_media_error_and_the_render_is_not_lost(tmp_path: Path) -> None:
    """The output name became a folder between the check and the rename: typed error, not OSError."""
    from h3bridge.engines.output import _publish
    from h3bridge.errors import MediaError
    output = tmp_path / "clip.mp4"
    output.mkdir()
    (output / "inside").write_text("x")
    rendered = tmp_path / ".clip.mp4.abc.partial.mp4"
    rendered.write_bytes(b"new render")
    with pytest.raises(MediaError, match="cannot move the finished clip"):
        _publish(rendered, output, overwrite=True)
    assert (output / "inside").read_text() == "x"


# ----------------------------------------------------------------------------- what failures say

@both_engines
def test_a_crash_names_the_phase_and_a_fix_without_python_names(engine: OneShotEngine, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_CRASH_PHASE", "text encoder:3")
    with pytest.raises(EngineCrashedError) as caught:
        engine.generate(fast_request(), tmp_path / "x.mp4")
    error = caught.value
    assert "crashed (SIGSEGV) during text encoder (last report 3/50)" in error.message
    assert "see the engine log" in error.hint and "Error." not in error.hint and ".stderr" not in error.hint


def test_a_stall_names_the_phase_it_stopped_in(model_dir: Path, tmp_path: Path,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_HANG_PHASE", "load transformer core:7")
    engine = OneShotEngine(sim_engine_path(), model_dir, stall_timeout=120)

    def shorten_the_watchdog_at_the_hang(event: ProgressEvent) -> None:
        # A short watchdog from the start could fire while a loaded machine starts the engine.
        if (event.phase, event.done) == ("load transformer core", 7):
            engine.stall_timeout = 1.0
    with pytest.raises(EngineStalledError) as caught:
        engine.generate(fast_request(), tmp_path / "x.mp4", on_progress=shorten_the_watchdog_at_the_hang)
    assert "no progress for 1 s during load transformer core (last report 7/50)" in caught.value.message
    assert "stall_timeout" in caught.value.hint


@both_engines
def test_no_metal_device_gets_advice_about_metal(engine: OneShotEngine, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """h3_metal.m: "no Metal device available" means no usable GPU, not a memory or int8 problem."""
    monkeypatch.setenv("H3_SIM_NO_METAL", "1")
    with pytest.raises(EngineError) as caught:
        engine.generate(fast_request(), tmp_path / "x.mp4")
    hint = caught.value.hint or ""
    assert caught.value.engine_message == "no Metal device available"
    assert "Apple Silicon" in hint and "Rosetta" in hint and "virtual machine" in hint
    assert "int8" not in hint and "plan" not in hint


def test_a_gpu_failure_blames_int8_only_when_the_request_uses_it(engine: OneShotEngine, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "denoise")
    with pytest.raises(EngineError) as caught:
        engine.generate(fast_request(), tmp_path / "x.mp4")
    assert "int8" not in caught.value.hint and "h3bridge plan" in caught.value.hint
    with pytest.raises(EngineError) as caught:
        engine.generate(fast_request(int8_row_fc2=True), tmp_path / "x.mp4")
    assert "drop int8_row_fc2" in caught.value.hint


def test_informational_h3_lines_are_never_the_engine_message() -> None:
    """Upstream's cache notices, profile and display lines come after the error sometimes."""
    from h3bridge.engines.h3_command import engine_message_from
    informational = ["h3: prepared DiT cache miss; model retained", "h3: conditioning cache hit",
                     "h3: video VAE cache miss; decoder retained", "h3: conditioning cache miss; stored exact BF16",
                     "h3: warning: could not retain prepared DiT key", "h3: wrote /tmp/x.mp4",
                     "h3: wrote frames to /tmp/f", "h3: preview 3/20", "h3: frame 4/56 via kitty",
                     "h3: denoise preview 1/20, video frame 1/56 via kitty", "h3: graphical output uses kitty",
                     "h3: display disabled: no terminal", "h3: selected GPU reuse schedule has 12 evaluations",
                     "h3: GPU sampler encode window is bounded; internal split enabled",
                     "h3: BF16 SSD stream 1.000 GiB read in 0.100s (10.000 GiB/s), unhidden wait 0.000s",
                     "h3: resident video VAE tiles 2x2 at 512 pixels", "h3: gate-ranked DiT skips 3(0.1)",
                     "h3: Metal live allocation at GPU teardown: 0.000 GiB", "h3: TensorOps compile failed: x"]
    assert engine_message_from("\n".join(["h3: the real error", *informational])) == "the real error"
    assert engine_message_from("\n".join(informational)) is None


def test_a_prompt_over_the_argument_limit_is_refused_with_the_alternative(engine: OneShotEngine, tmp_path: Path,
                                                                          sim_log: Path) -> None:  # noqa: F811
    """exec refuses an argument over MAX_ARG_STRLEN (128 KiB on Linux) with E2BIG; that is not a
    missing engine. The warm session takes the prompt over stdin instead."""
    from h3bridge import RequestError
    prompt = ("a red fox runs through deep snow at dawn " * 4000).strip()       # ~160 KiB
    with pytest.raises(RequestError) as caught:
        engine.generate(fast_request(prompt), tmp_path / "x.mp4")
    error = caught.value
    assert error.field == "prompt" and f"the prompt is {len(prompt)} bytes" in error.message
    # the fix names the warm session as data (h3bridge.fixes): SessionEngine in Python, --engine session on the CLI
    from h3bridge.cli.engine import cli_words
    assert "MAX_ARG_STRLEN" in error.message and "warm session (SessionEngine)" in error.hint
    assert "(--engine session)" in error.hint_in(cli_words)
    assert sim_invocations(sim_log) == [] and files_in(tmp_path) == []


def test_e2big_from_exec_is_the_same_clear_error(engine: OneShotEngine, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Should the up-front check ever miss (a limit it does not know), the kernel's E2BIG says
    the same, never "build h3 on a Mac"."""
    import h3bridge.engines.oneshot as engine_module
    from h3bridge import RequestError
    monkeypatch.setattr(engine_module, "check_argument_limits", lambda argv, env, prompt: None)
    # 150 KB: one argument over the kernel's 128 KiB MAX_ARG_STRLEN (E2BIG), yet under h3's own
    # prompt limit (request.MAX_PROMPT_BYTES, 167,772 bytes), which refuses longer ones first
    prompt = "snow " * 30000
    with pytest.raises(RequestError) as caught:
        engine.generate(fast_request(prompt.strip()), tmp_path / "x.mp4")
    assert caught.value.field == "prompt" and "command-line argument" in caught.value.message
    assert "build h3" not in str(caught.value)


def test_an_output_that_appeared_while_rendering_is_not_a_refusal(tmp_path: Path) -> None:
    """Exit 2 is for refusals before anything ran; a clip kept beside a file that appeared
    meanwhile came from a render that ran (exit 1)."""
    from h3bridge.engines.output import _publish, resolve_output
    output = tmp_path / "clip.mp4"
    output.write_bytes(b"appeared meanwhile")
    rendered = tmp_path / ".h3bridge-abc.partial.mp4"
    rendered.write_bytes(b"new render")
    with pytest.raises(OutputExistsError) as caught:
        _publish(rendered, output, overwrite=False)
    assert not caught.value.before_start and (tmp_path / "clip-2.mp4").read_bytes() == b"new render"
    with pytest.raises(OutputExistsError) as caught:
        resolve_output(output, overwrite=False)
    assert caught.value.before_start


def test_a_read_only_disk_at_publish_time_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os
    from h3bridge.engines.output import _publish
    from h3bridge.errors import DiskError

    def read_only(source: object, target: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(os, "replace", read_only)
    rendered = tmp_path / ".h3bridge-abc.partial.mp4"
    rendered.write_bytes(b"new render")
    with pytest.raises(DiskError) as caught:
        _publish(rendered, tmp_path / "clip.mp4", overwrite=True)
    assert f"the output folder {tmp_path} is on a read-only file system" in caught.value.message
    assert rendered.read_bytes() == b"new render"
