"""What the H3 nodes show and say (issue 9 item 8), tested through the adapter without ComfyUI:
one-line prompts a warm session takes, the node notice when a job cannot go warm, the resolved
settings, messages in node words, and scratch inputs removed when the host is terminated."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from h3bridge.comfy import adapter
from h3bridge.errors import RequestError, SessionUnsupportedError
from h3bridge.media.references import ReferenceItem, ReferenceList, VideoSource
from h3bridge.request import PRESETS, ReferenceKind
from h3bridge.engines.session import session_prompt

from comfy_helpers import fixture_model  # noqa: F401  (pytest fixture)
from test_comfy_adapter import SMALL, RecordingEngine

REPO = Path(__file__).resolve().parents[1]

README_SECTIONS = dict(
    scene="a single red fox in a snow-covered pine forest at dawn.",
    action="the fox walks steadily left to right and looks toward the camera once.",
    camera="medium-height lateral tracking shot, 50 mm lens, stable framing.",
    look="photorealistic fur, cold blue ambient light, warm sunrise rim light.",
    audio="soft footsteps in snow, light wind through pine branches, no music.")


# ----------------------------------------------------------------------------- H3 Prompt goes warm

def test_h3_prompt_output_is_one_line_a_warm_session_takes() -> None:
    text = adapter.compose_prompt(**README_SECTIONS)
    assert "\n" not in text
    assert session_prompt(text) == text          # no join needed: the session sends it as written
    assert text.startswith("Scene: a single red fox") and " Action: the fox walks" in text
    assert text.endswith("Audio: soft footsteps in snow, light wind through pine branches, no music.")
    assert adapter.compose_prompt("a fox", "", "", "", "wind") == "Scene: a fox Audio: wind"


def test_free_text_is_cleaned_onto_one_line_and_capped() -> None:
    assert adapter.compose_prompt("", "", "", "", "", "  A fox\u00a0runs.  \n\n\n\nSnow.  ") == "A fox runs. Snow."
    capped = adapter.compose_prompt(**README_SECTIONS, max_bytes=60)
    assert len(capped.encode()) <= 60 and "\n" not in capped


def test_empty_h3_prompt_is_a_request_error() -> None:
    with pytest.raises(RequestError):
        adapter.compose_prompt("", " ", "", "", "")


# ----------------------------------------------------------------------------- notices on the node

def test_generate_node_shows_the_resolved_settings_before_the_engine_runs(tmp_path: Path, fixture_model: Path) -> None:
    notices: list[str] = []
    handle = adapter.EngineHandle(Path("/bin/h3"), fixture_model)
    settings = adapter.GenerateSettings(prompt="a fox", preset="balanced", width=96, height=64,
                                        length_unit="seconds", seconds=1.0, ssd_streaming="off")
    adapter.run_generate(handle, settings, adapter.GenerateInputs(), scratch_parent=tmp_path / "s",
                         output_dir=tmp_path / "o", want_image=False, on_notice=notices.append, on_progress=lambda event: None,
                         engine_factory=lambda chosen: RecordingEngine())
    preset = PRESETS["balanced"]
    assert notices == [f"one-shot: 96x64, 39 frames (1.625 s), {preset.steps} steps, {preset.layers} layers, "
                       f"reuse {preset.reuse}, SSD streaming off, seed 42"]


def test_model_warnings_are_shown_on_the_node_and_in_the_summary(tmp_path: Path, fixture_model: Path) -> None:
    # An interrupted Ref2VA/ download: text-to-video still runs, but the user must be told.
    model = Path(shutil.copytree(fixture_model, tmp_path / "MiniMax-H3"))
    sorted((model / "Ref2VA/transformer").glob("*.safetensors"))[-1].unlink()
    notices: list[str] = []
    outputs = adapter.run_generate(adapter.EngineHandle(Path("/bin/h3"), model), SMALL, adapter.GenerateInputs(),
                                   scratch_parent=tmp_path / "s", output_dir=tmp_path / "o", want_image=False,
                                   on_notice=notices.append, on_progress=lambda event: None,
                                   engine_factory=lambda chosen: RecordingEngine())
    assert len(notices) == 1
    warning, job = notices[0].split("\n")
    assert warning.startswith(f"WARNING: {model / 'Ref2VA'} is incomplete") and "jobs with references" in warning
    assert job.startswith("one-shot: 96x64, 22 frames")
    assert f"model warning: {model / 'Ref2VA'} is incomplete" in outputs.summary


def test_a_job_that_cannot_go_warm_says_so_on_the_node(tmp_path: Path, fixture_model: Path) -> None:
    class Session(RecordingEngine):
        def generate(self, request, output, **kwargs):
            session_prompt(request.prompt)        # what the warm session checks first
            return super().generate(request, output, **kwargs)

    notices: list[str] = []
    warm = adapter.EngineHandle(Path("/bin/h3"), fixture_model, adapter.SESSION)
    factory = lambda chosen: Session() if chosen.mode == adapter.SESSION else RecordingEngine()  # noqa: E731

    def run(prompt: str) -> adapter.GenerateOutputs:
        notices.clear()
        settings = adapter.GenerateSettings(**{**SMALL.__dict__, "prompt": prompt})
        return adapter.run_generate(warm, settings, adapter.GenerateInputs(), scratch_parent=tmp_path / "s",
                                    output_dir=tmp_path / "o", want_image=False, on_notice=notices.append, on_progress=lambda event: None,
                                    engine_factory=factory)

    # H3 Prompt's own output goes warm, and nothing warns.
    outputs = run(adapter.compose_prompt(**README_SECTIONS))
    assert outputs.summary.startswith("engine: session engine")
    assert len(notices) == 1 and notices[0].startswith("session: ") and "WARNING" not in notices[0]
    # A prompt typed on several lines: one-shot, and the node says why and what to do.
    outputs = run("Scene: a fox.\nAudio: wind.")
    assert outputs.summary.startswith("engine: one-shot engine")
    warning = notices[-1]
    assert warning.startswith("WARNING: not run in session mode: the prompt has several lines")
    assert "ran one-shot instead" in warning and "put the prompt on one line" in warning
    assert warning.splitlines()[-1].startswith("one-shot: 96x64, 22 frames")


# ----------------------------------------------------------------------------- what the node shows

def test_dynamic_combo_values_become_settings() -> None:
    values = {"engine": object(), "preset": {"preset": "quality", "steps": 25, "layers": 48, "reuse": 1},
              "width": 512, "height": 512, "length_unit": {"length_unit": "frames", "frames": 56}, "seed": 9,
              "core_reuse": 1, "render_width": None}
    settings = adapter.settings_from_node_values(values, "a fox")
    assert (settings.preset, settings.steps, settings.layers, settings.reuse) == ("quality", 25, 48, 1)
    assert (settings.length_unit, settings.frames, settings.seed, settings.prompt) == ("frames", 56, 9, "a fox")
    request = adapter.build_request(settings)
    assert (request.steps, request.layers, request.frame_count) == (25, 48, 56)


def test_preset_values_name_what_the_preset_sets() -> None:
    assert adapter.preset_values("balanced") == "20 steps, 45 layers, reuse 2" == (
        f"{PRESETS['balanced'].steps} steps, {PRESETS['balanced'].layers} layers, reuse {PRESETS['balanced'].reuse}")


def test_reuse_shown_with_core_reuse_says_which_to_change() -> None:
    with pytest.raises(RequestError) as info:
        adapter.build_request(adapter.GenerateSettings(prompt="a fox", reuse=2, core_reuse=3))
    assert "reuse=2 and core_reuse=3" in info.value.message and "0 (preset)" not in str(info.value)


def test_model_check_for_the_queue_takes_only_model_dir(tmp_path: Path, fixture_model: Path) -> None:
    assert adapter.check_model_setting(fixture_model.name, [fixture_model.parent]) == fixture_model
    with pytest.raises(Exception) as info:
        adapter.check_model_setting("NoSuchModel", [tmp_path])
    assert "'NoSuchModel' was not found" in str(info.value)


# ----------------------------------------------------------------------------- node words

def _clip(path: Path, seconds: float) -> Path:
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc=s=64x48:r=24:d={seconds}",
                    "-f", "lavfi", "-i", f"sine=d={seconds}:sample_rate=32000", "-c:v", "libx264",
                    "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(path)], check=True)
    return path


def test_reference_video_messages_name_the_users_file_and_the_nodes_options(tmp_path: Path,
                                                                            fixture_model: Path) -> None:
    users_clip = _clip(tmp_path / "my holiday.mp4", 1.25)      # 30 frames: too short for its soundtrack
    source = VideoSource(write=lambda target: shutil.copyfile(users_clip, target), description=str(users_clip))
    references = ReferenceList().appended(ReferenceItem(ReferenceKind.VIDEO, video=source))
    settings = adapter.GenerateSettings(prompt="Continue <Video 1>.", preset="preview", width=96, height=64,
                                        length_unit="frames", frames=56, ssd_streaming="off")
    engine = RecordingEngine()
    with pytest.raises(RequestError) as info:
        adapter.run_generate(adapter.EngineHandle(Path("/bin/h3"), fixture_model), settings,
                             adapter.GenerateInputs(references=references), scratch_parent=tmp_path / "scratch",
                             output_dir=tmp_path / "out", want_image=False, engine_factory=lambda chosen: engine,
                             on_progress=lambda event: None)
    text = str(info.value)
    assert engine.calls == []
    assert f"reference 1 (video with its audio): the video {str(users_clip)!r} is only 30 frames" in text
    assert "ref-01" not in text and "scratch" not in text
    assert "silent_video" not in text and "H3 References kind 'video'" in text
    assert info.value.args == (info.value.message,)


def test_node_words_leave_other_messages_alone() -> None:
    error = RequestError("width=100 is not a multiple of 32", field="width", hint="use width=96")
    assert str(adapter.in_node_words(error, {"/tmp/x/ref-01.mp4": "'clip.mp4'"})) == \
        "width=100 is not a multiple of 32\n  fix: use width=96"


def test_summary_names_reference_kinds_as_the_node_does(tmp_path: Path, fixture_model: Path) -> None:
    clip = _clip(tmp_path / "clip.mp4", 3.0)
    source = VideoSource(write=lambda target: shutil.copyfile(clip, target), description=str(clip))
    references = (ReferenceList()
                  .appended(ReferenceItem(ReferenceKind.SILENT_VIDEO, video=source))
                  .appended(ReferenceItem(ReferenceKind.VIDEO, video=source)))
    settings = adapter.GenerateSettings(prompt="<Video 1> <Video 2>", preset="preview", width=96, height=64,
                                        length_unit="frames", frames=56, ssd_streaming="off")
    outputs = adapter.run_generate(adapter.EngineHandle(Path("/bin/h3"), fixture_model), settings,
                                   adapter.GenerateInputs(references=references), scratch_parent=tmp_path / "s",
                                   output_dir=tmp_path / "o", want_image=False, on_progress=lambda event: None,
                                   engine_factory=lambda chosen: RecordingEngine())
    # H3 References' own kind names (the library's silent_video is the node's 'video').
    assert "references: video, video with its audio" in outputs.summary


# ----------------------------------------------------------------------------- termination

TERMINATED_HOST = textwrap.dedent('''
    import signal, sys, threading
    from pathlib import Path
    import numpy as np
    from h3bridge.comfy import adapter
    from h3bridge.sim.fixture import write_fixture_model

    base = Path(sys.argv[1])
    model = write_fixture_model(base / "model")
    # A ComfyUI started from a terminal: the test runner itself may run under nohup or in the
    # background, where SIGHUP/SIGTERM arrive ignored and the pack rightly leaves them so.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert adapter.install_termination_cleanup()

    class Rendering:       # an engine mid-render: holds the job until the host goes
        def check_supported(self, request):
            pass

        def generate(self, request, output, **options):
            print("RUNNING", request.first_frame, flush=True)
            threading.Event().wait()

    def job():
        adapter.run_generate(
            adapter.EngineHandle(Path("/bin/h3"), model),
            adapter.GenerateSettings(prompt="a fox", preset="preview", width=96, height=64,
                                     length_unit="frames", frames=22, ssd_streaming="off"),
            adapter.GenerateInputs(first_frame=np.zeros((64, 96, 3), np.float32)),
            scratch_parent=base / "inputs", output_dir=base / "outputs", want_image=False,
            engine_factory=lambda handle: Rendering())

    threading.Thread(target=job, daemon=True).start()    # ComfyUI renders in a worker thread
    threading.Event().wait()
''')


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_scratch_inputs_are_removed_when_the_host_is_terminated_mid_render(tmp_path: Path, number: int) -> None:
    host = subprocess.Popen([sys.executable, "-c", TERMINATED_HOST, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        line = host.stdout.readline()
        assert line.startswith("RUNNING "), line
        first_frame = Path(line.split(" ", 1)[1].strip())
        assert first_frame.is_file() and first_frame.name == "first-frame.png"
        host.send_signal(number)
        assert host.wait(60) == -number                  # still dies of the signal, as without the pack
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    assert not first_frame.exists()
    assert list((tmp_path / "inputs").iterdir()) == []


TERMINATED_RENDER = textwrap.dedent('''
    import signal, sys, threading
    from pathlib import Path
    from h3bridge.comfy import adapter
    from h3bridge.sim.fixture import write_fixture_model

    base, engine = Path(sys.argv[1]), Path(sys.argv[2])
    model = write_fixture_model(base / "model")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)      # as started from a terminal (the runner may be nohup'ed)
    assert adapter.install_termination_cleanup()      # what loading the pack in ComfyUI does

    def job():      # a real one-shot h3-sim render, in a worker thread as ComfyUI runs it
        adapter.run_generate(
            adapter.EngineHandle(engine, model),
            adapter.GenerateSettings(prompt="a fox", preset="preview", width=96, height=64,
                                     length_unit="frames", frames=22, ssd_streaming="off"),
            adapter.GenerateInputs(), scratch_parent=base / "inputs", output_dir=base / "outputs",
            want_image=False)

    threading.Thread(target=job, daemon=True).start()
    threading.Event().wait()
''')


def test_a_terminated_host_stops_its_rendering_engine(tmp_path: Path) -> None:
    """The engine runs in its own process group, so the host's death alone leaves it rendering
    (holding tens of GiB on a Mac): the pack's SIGTERM handler stops it first."""
    from core_helpers import assert_group_gone, sim_engine_path, wait_until
    from h3bridge.engines.process import group_alive

    silent = tmp_path.parent / f"{tmp_path.name}-silent"     # the sim's pid, once it wrote its last byte
    host = subprocess.Popen([sys.executable, "-c", TERMINATED_RENDER, str(tmp_path), str(sim_engine_path())],
                            cwd=REPO, env={**os.environ, "H3_SIM_HANG_PHASE": "denoise",
                                           "H3_SIM_HANG_NOTICE": str(silent)})
    try:
        assert wait_until(silent.exists, timeout=120), "the engine never reached its silent phase"
        engine = int(silent.read_text())
        assert group_alive(engine)                        # start_new_session: pgid == pid
        host.send_signal(signal.SIGTERM)
        assert host.wait(60) == -signal.SIGTERM           # the host still dies of the signal
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    try:
        assert_group_gone(engine)
    finally:
        if group_alive(engine):
            os.killpg(engine, signal.SIGKILL)


def test_termination_cleanup_keeps_the_hosts_own_handler_and_an_ignored_signal(tmp_path: Path) -> None:
    calls: list[int] = []
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    previous_usr2 = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        assert adapter.install_termination_cleanup((signal.SIGUSR1, signal.SIGUSR2)) == [signal.SIGUSR1]
        assert adapter.install_termination_cleanup((signal.SIGUSR1,)) == []       # never wrapped twice
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        scratch = tmp_path / "h3-run-x"
        scratch.mkdir()
        (scratch / "first-frame.png").write_bytes(b"png")
        with adapter._live_scratch_guard:
            adapter._live_scratch.add(scratch)
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
        finally:
            with adapter._live_scratch_guard:
                adapter._live_scratch.discard(scratch)
        assert calls == [signal.SIGUSR1] and not scratch.exists()
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
        signal.signal(signal.SIGUSR2, previous_usr2)
