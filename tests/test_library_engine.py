"""LibraryEngine against the libh3 double (h3bridge/sim/double: h3.h's ABI over h3-sim's engine).

Everything here runs the real code path: the worker process loads the double through
h3bridge.libh3, exactly as it would load libh3.dylib on a Mac. Clips are tiny (FAST) so the
whole file stays quick; synchronisation is on callbacks, files and process state, never sleeps.
"""
from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import psutil
import pytest

from core_helpers import assert_group_gone, fast_request, model_dir, sim_engine_path  # noqa: F401 (fixture)
from double_helpers import double_library_path
from h3bridge import (
    CancelToken,
    Engine,
    EngineCrashedError,
    EngineError,
    GenerationCancelled,
    LibraryEngine,
    ModelError,
    OneShotEngine,
    RequestError,
)
from h3bridge import libh3
from h3bridge.engines import library as library_engine_module
from h3bridge.engines.library import machine_facts_from_device
from h3bridge.engines.library_wire import h3_params_fields, h3_references
from h3bridge.errors import LibraryLoadError
from h3bridge.request import Reference, ReferenceKind, SlowerPath
from upstream_helpers import BOTH_ENGINES, SIM, UPSTREAM, realistic_model, upstream_engine_or_skip  # noqa: F401

CACHE_HITS = ("h3: conditioning cache hit", "h3: prepared DiT cache hit", "h3: video VAE cache hit")


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder of the test's own, so "nothing left behind" can be checked exactly."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    return folder


@pytest.fixture(scope="module")
def library() -> Path:
    return double_library_path()


def engine_kind(request: pytest.FixtureRequest) -> str:
    """SIM, or UPSTREAM for the upstream case of the `both_engines` and `both_libraries` tests."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None:
        return SIM
    return callspec.params.get("engine", callspec.params.get("built", SIM))


@pytest.fixture
def built(request: pytest.FixtureRequest, model_dir: Path) -> tuple[Path, Path]:  # noqa: F811
    """(libh3, model folder): the double on the tiny fixture, or for `both_libraries` tests also
    upstream's own libh3 on the realistic fixture. The portable backend reads h3-sim's
    H3_SIM_* device and fault variables (engine_build/portable/h3_portable_metal.c and
    h3_portable_fault.c), so these tests give upstream's code the same faults and devices."""
    if engine_kind(request) == UPSTREAM:
        return upstream_engine_or_skip().library, request.getfixturevalue("realistic_model")
    return request.getfixturevalue("library"), model_dir


@pytest.fixture
def engine(request: pytest.FixtureRequest, model_dir: Path):  # noqa: F811
    """The double on the tiny fixture; for `both_engines` tests also upstream's own libh3 (built from
    H3_UPSTREAM_SOURCE over the portable backend) on the realistic fixture it requires."""
    if engine_kind(request) == UPSTREAM:
        path, model = upstream_engine_or_skip().library, request.getfixturevalue("realistic_model")
    else:
        path, model = request.getfixturevalue("library"), model_dir
    with LibraryEngine(path, model, idle_timeout=120) as warm:
        yield warm


@pytest.fixture
def cli_engine(request: pytest.FixtureRequest, model_dir: Path) -> OneShotEngine:  # noqa: F811
    """The CLI engine of the same kind as `engine`: h3-sim, or upstream's own h3."""
    if engine_kind(request) == UPSTREAM:
        return OneShotEngine(upstream_engine_or_skip().program, request.getfixturevalue("realistic_model"))
    return OneShotEngine(sim_engine_path(), model_dir)


both_engines = pytest.mark.parametrize("engine", BOTH_ENGINES, indirect=True)
both_libraries = pytest.mark.parametrize("built", BOTH_ENGINES, indirect=True)


def _fail_env(**variables: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(variables)
    return env


# ----------------------------------------------------------------------------- wire and facts

def test_every_field_the_host_sets_is_an_h3_params_field_and_every_enum_name_exists(tmp_path: Path) -> None:
    request = fast_request(references=(Reference(ReferenceKind.VIDEO_AUDIO, tmp_path / "v.mp4", tmp_path / "a.wav"),
                                       Reference(ReferenceKind.SILENT_VIDEO, tmp_path / "s.mp4")),
                           slower_paths=frozenset(SlowerPath))
    fields = h3_params_fields(request, output_path="/x.mp4", preview=True)
    names = {name for name, _ in libh3.h3_params._fields_}
    assert set(fields) <= names
    assert {f"use_slower_{p.value.replace('-', '_')}" for p in SlowerPath} <= set(fields)
    assert fields["preview_denoise"] == 1 and fields["frames"] == request.frame_count
    assert hasattr(libh3, fields["reference_image_size"])
    references = h3_references(request)
    assert [(r["kind"], r["include_embedded_audio"]) for r in references] == [
        ("H3_REFERENCE_VIDEO_AUDIO", 0), ("H3_REFERENCE_VIDEO", 0)]      # main.c --ref-silent-video
    assert all(hasattr(libh3, r["kind"]) for r in references)
    assert references[0]["audio_path"] == str(tmp_path / "a.wav")


@both_libraries
def test_machine_facts_come_from_h3_device(built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    library, model_dir = built
    monkeypatch.setenv("H3_SIM_PHYSICAL_MEMORY", "64G")
    monkeypatch.setenv("H3_SIM_RECOMMENDED_WORKING_SET", "40G")
    monkeypatch.setenv("H3_SIM_DEVICE_NAME", "Apple M4 Max")
    engine = LibraryEngine(library, model_dir)
    facts = engine.machine_facts()
    assert engine.pid is None                       # the probe worker is gone again
    assert facts.total_memory == 64 << 30 and facts.gpu_working_set == 40 << 30 and facts.chip == "Apple M4 Max"
    assert facts.budget == 40 << 30                 # the working set, below 64 GiB less the reserve
    assert machine_facts_from_device({"physical_memory": 64 << 30}).budget == (64 << 30) - int((64 << 30) * 0.2)


@both_libraries
def test_load_errors_are_one_sentence_before_anything_starts(built: tuple[Path, Path], tmp_path: Path) -> None:
    library, model_dir = built
    with pytest.raises(LibraryLoadError) as missing:
        LibraryEngine(tmp_path / "libh3.dylib", model_dir)
    assert "no library at" in missing.value.message and "\n" not in missing.value.message
    archive = tmp_path / "libh3.a"
    archive.write_bytes(b"!<arch>\n" + b"\0" * 64)
    with pytest.raises(LibraryLoadError, match="static archive"):
        LibraryEngine(archive, model_dir)
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ModelError) as bad_model:     # h3_load_dir's h3_last_error(NULL), verbatim
        LibraryEngine(library, empty).generate(fast_request(), None)
    assert "FL2VA/transformer/config.json" in bad_model.value.message


# ----------------------------------------------------------------------------- jobs

@both_engines
def test_warm_second_job_skips_the_loads(engine: LibraryEngine, tmp_path: Path) -> None:
    assert isinstance(engine, Engine) and engine.capabilities.previews and engine.capabilities.exact_frames
    first = engine.generate(fast_request(), tmp_path / "a.mp4")
    pid = engine.pid
    phases: list[str] = []
    second = engine.generate(fast_request(seed=7), tmp_path / "b.mp4", on_progress=lambda e: phases.append(e.phase))
    assert engine.pid == pid and engine.starts == 1 and engine.jobs == 2
    assert not any(line in first.engine_log for line in CACHE_HITS)
    assert all(line in second.engine_log for line in CACHE_HITS)
    assert second.seed == 7 and (tmp_path / "b.mp4").is_file()
    assert "denoise" in phases


@both_engines
def test_previews_once_per_step_with_step_numbers_and_size(engine: LibraryEngine) -> None:
    previews = []
    phases: list[str] = []
    request = fast_request(steps=4)
    result = engine.generate(request, None, want_audio=False, on_preview=previews.append,
                             on_progress=lambda e: phases.append(e.phase))
    assert [p.step for p in previews] == [0, 1, 2, 3]
    assert all(p.total_steps == 4 and p.image.shape == (request.height, request.width, 3)
               and p.image.dtype == np.uint8 and 0 <= p.frame_index < request.frame_count for p in previews)
    assert "preview VAE load" in phases
    assert result.frames is not None and result.frames.shape == (request.frame_count, request.height, request.width, 3)
    phases.clear()
    engine.generate(request, None, want_audio=False, on_progress=lambda e: phases.append(e.phase))
    assert "preview VAE load" not in phases        # off unless asked for


def test_frames_and_audio_are_identical_to_h3_sim_frames_dir(engine: LibraryEngine, model_dir: Path,  # noqa: F811
                                                             tmp_path: Path, _private_tmp: Path) -> None:
    request = fast_request("a lighthouse at night", seed=3)
    library = engine.generate(request, tmp_path / "library.mp4")
    cli = OneShotEngine(sim_engine_path(), model_dir).generate(request, tmp_path / "cli.mp4")   # --frames-dir PPMs
    assert isinstance(library.frames, np.memmap)
    assert library.frames.tobytes() == cli.frames.tobytes()
    assert np.array_equal(library.audio, cli.audio)
    assert list(_private_tmp.iterdir()) == []       # the frames file went once it was mapped


@pytest.mark.parametrize("engine, phase", [
    *((SIM, phase) for phase in ("tokenizer", "text encoder", "load transformer core", "preview VAE load",
                                 "denoise", "audio VAE", "video VAE load", "FFmpeg")),
    *((UPSTREAM, phase) for phase in ("text encoder", "preview VAE load", "denoise", "FFmpeg"))],
    indirect=["engine"])
def test_cancel_in_every_phase(engine: LibraryEngine, tmp_path: Path, _private_tmp: Path, phase: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The job ends, nothing of it is left, and the warm worker survives (issue 30): h3_generate
    returned through upstream's cleanup. The grace is made long so that the outcome never depends
    on how loaded the machine is (test_cancel_in_a_silent_phase_kills_the_group covers the kill)."""
    monkeypatch.setattr(library_engine_module, "CANCEL_GRACE", 600.0)
    # Warm the worker first, at another canvas so that this job reloads the video VAE too.
    engine.generate(fast_request(width=64), None, want_audio=False, want_frames=False)
    pid, starts = engine.pid, engine.starts
    cancel = CancelToken()

    def on_progress(event) -> None:
        if event.phase == phase:
            cancel.cancel()

    with pytest.raises(GenerationCancelled):
        engine.generate(fast_request(prompt="another prompt, so nothing is cached"), tmp_path / "out.mp4",
                        on_progress=on_progress, cancel=cancel,
                        # (with previews on, the preview VAE is the decoder: no "video VAE load")
                        on_preview=(lambda p: None) if phase == "preview VAE load" else None)
    assert cancel.cancelled
    assert engine.pid == pid and engine.starts == starts      # the same warm worker
    assert list(tmp_path.glob("*.mp4")) == [] and list(tmp_path.glob(".h3bridge-*")) == []
    assert list(_private_tmp.iterdir()) == []
    assert engine.generate(fast_request(), tmp_path / "next.mp4").frames is not None    # next job fine
    assert engine.pid == pid and engine.starts == starts      # ... and it loaded nothing again


def test_comfyuis_interrupt_from_a_callback_keeps_the_worker(engine: LibraryEngine, tmp_path: Path,
                                                             _private_tmp: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """ComfyUI raises its interrupt from the progress hook (throw_exception_if_processing_interrupted
    in on_progress), not through the CancelToken: the same cancel, the same warm worker."""
    monkeypatch.setattr(library_engine_module, "CANCEL_GRACE", 600.0)
    engine.generate(fast_request(width=64), None, want_audio=False, want_frames=False)
    pid, starts = engine.pid, engine.starts

    class Interrupted(Exception):
        pass

    def on_progress(event) -> None:
        if event.phase == "denoise":
            raise Interrupted()

    with pytest.raises(Interrupted):
        engine.generate(fast_request(prompt="another prompt"), tmp_path / "out.mp4", on_progress=on_progress)
    assert engine.pid == pid and list(tmp_path.glob("*.mp4")) == [] and list(_private_tmp.iterdir()) == []
    assert engine.generate(fast_request(), None, want_audio=False).frames is not None
    assert engine.pid == pid and engine.starts == starts


def test_a_cancel_that_does_not_come_back_in_time_stops_the_worker(built: tuple[Path, Path], tmp_path: Path,
                                                                    _private_tmp: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Held silent inside a phase (as upstream is inside a DiT load or a denoise), h3_generate cannot
    return: after the grace the group is killed, and the next job starts a new worker."""
    library, model_dir = built
    held, release = tmp_path / "held", tmp_path / "release"
    env = _fail_env(H3_SIM_HOLD_PHASE="text encoder", H3_SIM_HOLD_NOTICE=str(held),
                    H3_SIM_HOLD_RELEASE=str(release))
    monkeypatch.setattr(library_engine_module, "CANCEL_GRACE", 0.0)     # no wait: the release never comes
    with LibraryEngine(library, model_dir, env=env) as engine:
        pids: list[int] = []
        with pytest.raises(GenerationCancelled, match="worker was stopped"):
            engine.generate(fast_request(), tmp_path / "out.mp4", cancel=CancelToken(check=held.exists),
                            on_progress=lambda e: pids.append(engine.pid or 0))
        assert_group_gone(pids[-1])
        assert engine.pid is None and list(_private_tmp.iterdir()) == [] and not (tmp_path / "out.mp4").exists()
        release.touch()
        assert engine.generate(fast_request(), None, want_audio=False).frames is not None
        assert engine.starts == 2


def test_cancel_while_the_worker_starts(engine: LibraryEngine, _private_tmp: Path) -> None:
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(GenerationCancelled):
        engine.generate(fast_request(), None, cancel=cancel)
    assert engine.pid is None and list(_private_tmp.iterdir()) == []


@both_libraries
def test_cancel_in_a_silent_phase_kills_the_group(built: tuple[Path, Path], tmp_path: Path,
                                                  _private_tmp: Path) -> None:
    """The tiled VAE decode reports nothing for minutes: the callback never gets to return 1, so
    the group is killed after the grace period."""
    library, model_dir = built
    notice = tmp_path / "hung"
    env = _fail_env(H3_SIM_HANG_PHASE="video VAE load:36", H3_SIM_HANG_NOTICE=str(notice))
    engine = LibraryEngine(library, model_dir, env=env)
    cancel = CancelToken(check=notice.exists)      # cancelled once the worker has fallen silent
    pids: list[int] = []
    with pytest.raises(GenerationCancelled):
        engine.generate(fast_request(), tmp_path / "out.mp4", cancel=cancel,
                        on_progress=lambda e: pids.append(engine.pid or 0))
    assert_group_gone(pids[-1])
    assert list(tmp_path.glob("*.mp4")) == [] and list(_private_tmp.iterdir()) == []


@both_libraries
def test_a_segfault_in_the_library_leaves_the_host_alive(built: tuple[Path, Path], tmp_path: Path,
                                                          _private_tmp: Path) -> None:
    library, model_dir = built
    crashing = LibraryEngine(library, model_dir, env=_fail_env(H3_SIM_CRASH_PHASE="audio VAE"))
    with pytest.raises(EngineCrashedError) as crashed:
        crashing.generate(fast_request(), tmp_path / "out.mp4")
    assert crashed.value.exit_code == -signal.SIGSEGV
    assert "SIGSEGV" in crashed.value.message and "during audio VAE" in crashed.value.message
    assert crashing.pid is None and list(_private_tmp.iterdir()) == [] and list(tmp_path.glob("*.mp4")) == []
    crashing.env = None          # the fault goes; the next job starts a fresh worker
    assert crashing.generate(fast_request(), tmp_path / "out.mp4").video_path == tmp_path / "out.mp4"
    assert crashing.starts == 2
    crashing.close()


@both_libraries
def test_h3_last_error_is_kept_verbatim_and_the_worker_stays_warm(built: tuple[Path, Path], tmp_path: Path,
                                                                   request: pytest.FixtureRequest) -> None:
    library, model_dir = built
    message = "Metal command buffer failed: Internal Error (0000000e:Internal Error)"
    engine = LibraryEngine(library, model_dir, env=_fail_env(H3_SIM_FAIL_PHASE="audio VAE"))
    with pytest.raises(EngineError) as failed:
        engine.generate(fast_request(), tmp_path / "out.mp4")
    # Deliberate difference (as in test_engine.test_engine_failure_keeps_h3s_message): upstream
    # prefixes a failed command buffer with the operation that submitted it ("submit AudioVAE
    # input: <Metal's text>"); the double raises the injected text alone. Verbatim either way.
    assert type(failed.value) is EngineError and failed.value.engine_message.endswith(message)
    assert engine_kind(request) == UPSTREAM or failed.value.engine_message == message
    pid = engine.pid
    assert pid is not None                          # a refused job leaves the context warm
    with pytest.raises(EngineError):
        engine.generate(fast_request(), tmp_path / "out.mp4")
    assert engine.pid == pid and not (tmp_path / "out.mp4").exists()
    engine.close()


class Boom(Exception):
    pass


@pytest.mark.parametrize("where", ["on_progress", "on_preview"])
def test_an_exception_in_a_callback_is_re_raised(engine: LibraryEngine, tmp_path: Path, where: str) -> None:
    def explode(_value: object) -> None:
        raise Boom(where)

    callbacks = {"on_progress": None, "on_preview": lambda p: None, where: explode}
    with pytest.raises(Boom, match=where):
        engine.generate(fast_request(), tmp_path / "out.mp4", **callbacks)
    assert not (tmp_path / "out.mp4").exists()
    assert engine.generate(fast_request(), None, want_audio=False).frames is not None


# Upstream runs all but the 100 KB prompt: its ~100,000 tokens make the portable backend's real
# element-wise kernels work through text-encoder activations of 100,000 x 5,120 per layer, minutes
# of CPU for a case whose outcome is h3-sim's to mirror, not the portable backend's to time.
@pytest.mark.parametrize("engine, prompt", [
    *((SIM, prompt) for prompt in ("", "x" * 100_000, "🦊 a fox 🌨️ in snow — ünïcødé", "caf\udce9 au lait \udcff")),
    *((UPSTREAM, prompt) for prompt in ("", "🦊 a fox 🌨️ in snow — ünïcødé", "caf\udce9 au lait \udcff"))],
    ids=["empty-h3-sim", "100KB-h3-sim", "emoji-h3-sim", "invalid-utf8-h3-sim",
         "empty-upstream", "emoji-upstream", "invalid-utf8-upstream"], indirect=["engine"])
def test_prompts_give_the_same_outcome_as_the_cli_engine(engine: LibraryEngine, cli_engine: OneShotEngine,
                                                         prompt: str) -> None:
    def outcome(run) -> tuple[str, object]:
        try:
            result = run(fast_request(prompt), None, want_audio=False)
        except (RequestError, EngineError) as error:
            return type(error).__name__, getattr(error, "engine_message", None) or error.message
        return "frames", result.frames.tobytes()

    assert outcome(engine.generate) == outcome(cli_engine.generate)


def test_fifty_warm_jobs_do_not_grow_the_worker(engine: LibraryEngine) -> None:
    request = fast_request(width=32, height=32, steps=2)
    previews: list[object] = []
    engine.generate(request, None, want_audio=False, on_preview=previews.append)
    worker = psutil.Process(engine.pid)
    first = worker.memory_info().rss
    for seed in range(50):
        engine.generate(request.with_changes(seed=seed), None, want_audio=False, on_preview=previews.append)
    assert engine.starts == 1 and worker.pid == engine.pid
    grown = worker.memory_info().rss - first
    assert grown < 8 << 20, f"the worker's RSS grew by {grown / 2**20:.1f} MiB over 50 jobs"


def test_an_idle_library_worker_steps_aside_for_a_one_shot_job(engine: LibraryEngine, model_dir: Path,  # noqa: F811
                                                               tmp_path: Path) -> None:
    engine.generate(fast_request(), None, want_audio=False)
    pid = engine.pid
    assert pid is not None
    OneShotEngine(sim_engine_path(), model_dir).generate(fast_request(), tmp_path / "one-shot.mp4")
    assert engine.pid is None          # it gave the machine-wide lock back (warm.py's rules)
    assert_group_gone(pid)
    engine.generate(fast_request(), None, want_audio=False)
    assert engine.starts == 2


def test_an_exception_inside_a_worker_callback_never_unwinds_through_c(library: Path, model_dir: Path,  # noqa: F811
                                                                       tmp_path: Path) -> None:
    """The worker's own callbacks, run in this process on the double: a frame that does not fit
    the host's frames file raises inside on_frame; the callback returns 1 (upstream cancels), and
    the error is reported after h3_generate returned; the same context then runs the next job."""
    import io

    from h3bridge.engines.library_wire import receive
    from h3bridge.engines.library_worker import Worker

    control = io.BytesIO()
    worker = Worker(control, str(library), str(model_dir))
    assert worker.load()
    request = fast_request()
    frames = tmp_path / "frames.rgb"
    frames.write_bytes(bytes(22 * 32 * 32 * 3))

    def job(number: int, shape: list[int]) -> dict:
        return {"job": number, "prompt": request.prompt, "references": [], "preview": False,
                "fields": h3_params_fields(request, output_path=None, preview=False),
                "frames_path": str(frames), "frame_shape": shape}

    worker.run_job(job(1, [22, 32, 32]))            # the request is 96x64
    frames.write_bytes(bytes(22 * 64 * 96 * 3))
    worker.run_job(job(2, [22, 64, 96]))
    worker.jobs.put(None)
    assert worker.run() == 0                         # h3_free
    stream = io.BytesIO(control.getvalue())
    messages = []
    while (item := receive(stream)) is not None:
        messages.append(item[0])
    ends = [m for m in messages if m["ev"] in ("done", "failed")]
    assert ends[0]["ev"] == "failed" and ends[0]["job"] == 1
    assert "ValueError" in ends[0]["callback_error"] and "expected 22 frames at 32x32" in ends[0]["callback_error"]
    assert ends[0]["message"].startswith("generation cancelled while delivering frame")   # h3_last_error
    assert ends[1]["ev"] == "done" and ends[1]["frames_written"] == 22


def test_a_host_killed_mid_job_leaves_nothing_running_after_the_next_job(library: Path, model_dir: Path,  # noqa: F811
                                                                          tmp_path: Path, _private_tmp: Path) -> None:
    """The host dies (SIGKILL) while libh3 sits in a silent phase: the worker cannot notice, so
    the next job's engine lock takeover stops it (its record names its group and its files)."""
    import subprocess
    import sys
    import textwrap
    import time

    notice = tmp_path / "silent"
    script = textwrap.dedent(f"""
        import os, tempfile
        tempfile.tempdir = {str(_private_tmp)!r}
        from h3bridge import GenerationRequest, LibraryEngine
        env = dict(os.environ, H3_SIM_HANG_PHASE="video VAE load:36", H3_SIM_HANG_NOTICE={str(notice)!r})
        engine = LibraryEngine({str(library)!r}, {str(model_dir)!r}, env=env)
        engine.generate(GenerationRequest("a fox", width=96, height=64, frames=22, steps=2),
                        {str(tmp_path / "host.mp4")!r})
    """)
    host = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120     # a safety net: the loop waits for the notice file
        while not notice.exists() and host.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert notice.exists(), "the host's worker never reached its silent phase"
        worker_pid = int(notice.read_text().split()[0])
        host.kill()
        host.wait(timeout=30)
    finally:
        if host.poll() is None:
            host.kill()
    assert psutil.pid_exists(worker_pid)              # orphaned, still holding the model
    with LibraryEngine(library, model_dir) as engine:
        assert engine.generate(fast_request(), tmp_path / "next.mp4").video_path == tmp_path / "next.mp4"
    assert_group_gone(worker_pid)
    assert not (tmp_path / "host.mp4").exists() and list(tmp_path.glob(".h3bridge-*")) == []
    assert list(_private_tmp.iterdir()) == []


def test_a_job_waiting_for_the_engine_leaves_the_running_jobs_state_alone(library: Path, model_dir: Path,  # noqa: F811
                                                                         tmp_path: Path) -> None:
    """Whether a failed job left the worker warm is the running job's to read (issue 34): a second
    job changed it before it waited for the job guard, so the first could stop a worker it had kept."""
    import threading

    from h3bridge.progress import WAITING_PHASE
    engine = LibraryEngine(library, model_dir)
    engine._guard.acquire()                      # a job of another thread runs ...
    engine._worker_idle_after_failure = True     # ... and its failure left the worker warm
    waiting, cancel = threading.Event(), CancelToken()

    def progress(event) -> None:
        if event.phase == WAITING_PHASE:
            waiting.set()

    def second_job() -> None:
        with pytest.raises(GenerationCancelled):
            engine.generate(fast_request(), tmp_path / "second.mp4", on_progress=progress, cancel=cancel)

    thread = threading.Thread(target=second_job)
    thread.start()
    try:
        assert waiting.wait(60), "the second job never waited for the first"
        assert engine._worker_idle_after_failure is True
    finally:
        cancel.cancel()
        thread.join(60)
        engine._guard.release()
        engine.close()
    assert not thread.is_alive()
