"""What the ComfyUI nodes do, tested through h3bridge.comfy.adapter without ComfyUI or torch."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from h3bridge import OneShotEngine
from h3bridge.cancel import CancelToken
from h3bridge.comfy import adapter
from h3bridge.errors import EngineNotFoundError, ModelError, RequestError
from h3bridge.progress import ProgressEvent
from h3bridge.media.references import ReferenceList
from h3bridge.request import PRESETS, ReferenceKind
from h3bridge.result import GenerationResult

from comfy_helpers import fixture_model, realistic_model  # noqa: F401  (pytest fixtures)


# ----------------------------------------------------------------------------- graph connectivity

def _prompt_with_links(*links: list) -> dict:
    prompt: dict[str, Any] = {"7": {"class_type": "H3Generate", "inputs": {"prompt": "x", "engine": ["3", 0]}}}
    for index, link in enumerate(links):
        prompt[str(20 + index)] = {"class_type": "Consumer", "inputs": {"value": link, "text": "plain"}}
    return prompt


def test_image_output_connected_only_when_a_downstream_input_links_to_it() -> None:
    image = adapter.IMAGE_OUTPUT_INDEX
    assert image == 1    # VIDEO, IMAGE, AUDIO, STRING
    assert adapter.output_is_connected(_prompt_with_links(["7", 1]), "7", image)
    assert not adapter.output_is_connected(_prompt_with_links(["7", 0], ["7", 2]), "7", image)
    assert not adapter.output_is_connected(_prompt_with_links(["8", 1]), "7", image)
    # Node ids may be ints in hand-written prompts.
    assert adapter.output_is_connected({"9": {"inputs": {"images": [7, 1]}}}, "7", image)


def test_unknown_graph_counts_as_connected() -> None:
    assert adapter.output_is_connected(None, "7", 1)
    assert adapter.output_is_connected({}, "7", 1)
    assert adapter.output_is_connected(_prompt_with_links(), None, 1)


# ----------------------------------------------------------------------------- request building

def test_build_request_takes_preset_then_overrides() -> None:
    settings = adapter.GenerateSettings(prompt="a fox", preset="preview", width=512, height=512,
                                        length_unit="frames", frames=22, seed=7)
    request = adapter.build_request(settings)
    preset = PRESETS["preview"]
    assert (request.steps, request.layers, request.reuse) == (preset.steps, preset.layers, preset.reuse)
    assert (request.width, request.height, request.frames, request.seed) == (512, 512, 22, 7)
    request.validate(check_files=False)

    tuned = adapter.build_request(adapter.GenerateSettings(prompt="a fox", preset="balanced", steps=30, layers=40,
                                                           reuse=3, token_reduction=True))
    assert (tuned.steps, tuned.layers, tuned.reuse, tuned.token_reduction) == (30, 40, 3, True)


def test_core_reuse_replaces_preset_reuse_and_conflicts_with_explicit_reuse() -> None:
    request = adapter.build_request(adapter.GenerateSettings(prompt="a fox", preset="balanced", core_reuse=4))
    assert (request.core_reuse, request.reuse) == (4, 1)
    request.validate(check_files=False)
    with pytest.raises(RequestError) as info:
        adapter.build_request(adapter.GenerateSettings(prompt="a fox", core_reuse=4, reuse=2))
    assert info.value.field == "core_reuse"


@pytest.mark.parametrize(("unit", "seconds", "frames", "expected"), [
    ("frames", 0, 23, 39),          # README: "--frames 23 is rounded up to 39"
    ("frames", 0, 22, 22),
    ("frames", 0, 400, 362),        # clamped to the released maximum
    ("frames", 0, 1, 22),
    ("seconds", 10.0, 0, 243),      # README: "--seconds 10 produces 243 frames"
    ("seconds", 0.05, 0, 22),
    ("seconds", 15.083, 0, 362),
])
def test_length_is_snapped_to_legal_h3_lengths(unit: str, seconds: float, frames: int, expected: int) -> None:
    settings = adapter.GenerateSettings(prompt="a fox", length_unit=unit, seconds=seconds, frames=frames)
    request = adapter.build_request(settings)
    assert request.frames == expected == request.frame_count
    request.validate(check_files=False)


def test_bad_choices_are_request_errors_naming_the_field() -> None:
    for settings, name in ((adapter.GenerateSettings(prompt="x", preset="ultra"), "preset"),
                           (adapter.GenerateSettings(prompt="x", length_unit="minutes"), "length_unit"),
                           (adapter.GenerateSettings(prompt="x", seconds=0), "seconds")):
        with pytest.raises(RequestError) as info:
            adapter.build_request(settings)
        assert info.value.field == name
    with pytest.raises(RequestError) as info:
        adapter.decide_ssd_streaming("sometimes", adapter.build_request(adapter.GenerateSettings(prompt="x")),
                                     Path("/nonexistent"))
    assert info.value.field == "ssd_streaming"


def test_explicit_ssd_choice_is_planned_as_given(fixture_model: Path) -> None:
    request = adapter.build_request(adapter.GenerateSettings(prompt="x"))
    for choice, expected in (("on", True), ("off", False)):
        ssd, plan = adapter.decide_ssd_streaming(choice, request, fixture_model)
        assert ssd is expected and plan.request.ssd_streaming is expected and plan.fits


@pytest.mark.parametrize(("gigabytes", "expected"), [(24, True), (32, True), (64, False), (128, False)])
def test_auto_ssd_streaming_follows_the_memory_plan(realistic_model: Path, gigabytes: int, expected: bool) -> None:
    # README "ComfyUI": 24-32 GB Macs need SSD streaming at 864x480; 64 GB and up do not.
    from h3bridge.model.memory import MachineFacts
    request = adapter.build_request(adapter.GenerateSettings(prompt="x", width=864, height=480, seconds=4.0))
    ssd, plan = adapter.decide_ssd_streaming("auto", request, realistic_model, machine=MachineFacts.mac(gigabytes))
    assert ssd is expected and plan.fits and plan.request.ssd_streaming is expected


@pytest.mark.parametrize("choice", ["auto", "on", "off"])
def test_every_ssd_choice_checks_the_shard_headers_first(fixture_model: Path, tmp_path: Path, choice: str) -> None:
    """A truncated shard is refused before a render whatever the SSD choice, 'auto' on a Mac
    where the weights fit included (it used to plan with the checks switched off)."""
    import shutil
    from h3bridge.errors import IntegrityError
    from h3bridge.model.memory import MachineFacts
    model = Path(shutil.copytree(fixture_model, tmp_path / "model"))
    shard = sorted((model / "FL2VA/transformer").glob("*.safetensors"))[0]
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 1)
    request = adapter.build_request(adapter.GenerateSettings(prompt="x"))
    with pytest.raises(IntegrityError, match="truncated|shorter|bytes"):
        adapter.decide_ssd_streaming(choice, request, model, machine=MachineFacts.mac(128))


def test_forced_resident_weights_that_do_not_fit_fail_before_the_engine(realistic_model: Path) -> None:
    from h3bridge.errors import MemoryPlanError
    from h3bridge.model.memory import MachineFacts
    request = adapter.build_request(adapter.GenerateSettings(prompt="x", width=864, height=480, seconds=4.0))
    with pytest.raises(MemoryPlanError) as info:
        adapter.decide_ssd_streaming("off", request, realistic_model, machine=MachineFacts.mac(24))
    # In the node's words (issue 20 item 2): its inputs, not the CLI's flags, and its own way to force.
    assert info.value.hint == "set ssd_streaming on; or set force to true on H3 Generate to try anyway"
    assert "--" not in str(info.value) and "does not fit" in info.value.message
    ssd, plan = adapter.decide_ssd_streaming("off", request, realistic_model, machine=MachineFacts.mac(24),
                                             force=True)
    assert ssd is False and not plan.fits            # forced: planned, not refused


@pytest.mark.parametrize("gigabytes", [12, 18, 20, 24])
def test_every_memory_fix_names_node_inputs_that_make_it_fit(realistic_model: Path, gigabytes: int) -> None:
    """The suggested setting, fed back as the node values the refusal names, fits."""
    import re
    from h3bridge.errors import MemoryPlanError
    from h3bridge.model.memory import MachineFacts
    machine = MachineFacts.mac(gigabytes)
    settings = adapter.GenerateSettings(prompt="x", width=1344, height=768, seconds=15.0, int8_row_fc2=True)
    with pytest.raises(MemoryPlanError) as info:
        adapter.decide_ssd_streaming("off", adapter.build_request(settings), realistic_model, machine=machine)
    hint = info.value.hint or ""
    assert "--" not in str(info.value) and hint.endswith("or set force to true on H3 Generate to try anyway")
    if info.value.plan.suggestion is None:
        return
    changes: dict[str, object] = {}
    if "ssd_streaming on" in hint:
        changes.update(ssd_streaming="on", int8_row_fc2=False)
    assert ("int8_row_fc2 off" in hint) == ("ssd_streaming on" in hint)
    if found := re.search(r"layers (\d+)", hint):
        changes["layers"] = int(found.group(1))
    if found := re.search(r"render_width (\d+) and render_height (\d+)", hint):
        changes.update(render_width=int(found.group(1)), render_height=int(found.group(2)))
    if found := re.search(r"length_unit frames with frames (\d+)", hint):
        changes.update(length_unit="frames", frames=int(found.group(1)))
    assert changes
    fixed = adapter.GenerateSettings(**{**settings.__dict__, "ssd_streaming": "off", **changes})
    ssd, plan = adapter.decide_ssd_streaming(fixed.ssd_streaming, adapter.build_request(fixed), realistic_model,
                                             machine=machine)
    assert plan.fits


def test_memory_plan_text_shows_the_auto_decision(realistic_model: Path) -> None:
    from h3bridge.model.memory import MachineFacts
    handle = adapter.EngineHandle(engine_path=Path("/bin/h3"), model_dir=realistic_model)
    settings = adapter.GenerateSettings(prompt="x", width=864, height=480, seconds=4.0)
    small = adapter.describe_plan(handle, settings, machine=MachineFacts.mac(24))
    assert small.startswith("864x480, 107 frames (4.458 s), preset balanced, SSD streaming on (auto)")
    assert "fits" in small
    large = adapter.describe_plan(handle, settings, machine=MachineFacts.mac(128))
    assert "SSD streaming off (auto)" in large
    # Forced off on a small Mac: shown as not fitting, with the fix, instead of raising.
    forced = adapter.describe_plan(handle, adapter.GenerateSettings(prompt="x", width=864, height=480, seconds=4.0,
                                                                   ssd_streaming="off"),
                                   machine=MachineFacts.mac(24))
    # The fix in the node's inputs (issue 34.3: the plan text said the CLI's --ssd-streaming here)
    assert "does not fit" in forced and forced.endswith(": ssd_streaming on") and "--" not in forced


# ----------------------------------------------------------------------------- engine settings

def test_model_dir_resolves_names_under_model_folders(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    (second / "MiniMax-H3").mkdir(parents=True)
    first.mkdir()
    assert adapter.resolve_model_dir("MiniMax-H3", [first, second]) == (second / "MiniMax-H3").resolve()
    assert adapter.resolve_model_dir(str(second / "MiniMax-H3"), []) == second / "MiniMax-H3"
    with pytest.raises(ModelError) as info:
        adapter.resolve_model_dir("Missing", [first, second])
    assert str(first / "Missing") in str(info.value) and "models/h3" in (info.value.hint or "")
    with pytest.raises(ModelError):
        adapter.resolve_model_dir("   ", [first])
    with pytest.raises(ModelError):
        adapter.resolve_model_dir(str(tmp_path / "nope"), [])


def test_engine_settings_are_checked_without_running_anything(tmp_path: Path, fixture_model: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # "h3-sim" is found on PATH, as a user types it: the suite's own environment's, first (the
    # suite may run as .venv/bin/python without that folder on PATH)
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    handle = adapter.check_engine_settings("h3-sim", fixture_model.name, adapter.ONE_SHOT, [fixture_model.parent])
    assert handle.engine_path.is_absolute() and handle.engine_path.name == "h3-sim"
    assert handle.model_dir == fixture_model.resolve()
    with pytest.raises(EngineNotFoundError):
        adapter.check_engine_settings(str(tmp_path / "no-h3"), str(fixture_model), adapter.ONE_SHOT, [])
    not_a_model = tmp_path / "empty-model"
    not_a_model.mkdir()
    with pytest.raises(ModelError):
        adapter.check_engine_settings("h3-sim", str(not_a_model), adapter.ONE_SHOT, [])
    with pytest.raises(RequestError):
        adapter.check_engine_settings("h3-sim", str(fixture_model), "turbo", [])


# ----------------------------------------------------------------------------- output conversion

def test_frames_become_float_images_in_0_1() -> None:
    frames = np.array([[[[0, 128, 255]]], [[[255, 0, 1]]]], dtype=np.uint8)   # [2, 1, 1, 3]
    image = adapter.frames_to_image_batch(frames)
    assert image.dtype == np.float32 and image.shape == (2, 1, 1, 3)
    np.testing.assert_allclose(image[0, 0, 0], [0.0, 128 / 255, 1.0], rtol=1e-6)
    with pytest.raises(ValueError):
        adapter.frames_to_image_batch(frames.astype(np.float32))


def test_placeholder_is_one_black_frame() -> None:
    placeholder = adapter.placeholder_image(96, 64)
    assert placeholder.shape == (1, 64, 96, 3) and placeholder.dtype == np.float32 and not placeholder.any()


def test_audio_becomes_comfy_waveform() -> None:
    stereo = np.random.default_rng(1).uniform(-1, 1, (2, 100)).astype(np.float32)
    waveform = adapter.audio_to_waveform(stereo)
    assert waveform.shape == (1, 2, 100) and waveform.dtype == np.float32
    np.testing.assert_array_equal(waveform[0], stereo)
    mono = adapter.audio_to_waveform(stereo[:1])
    np.testing.assert_array_equal(mono[0, 0], mono[0, 1])
    silent = adapter.audio_to_waveform(None, 320)
    assert silent.shape == (1, 2, 320) and not silent.any()


def test_comfy_waveform_becomes_audio_clip() -> None:
    batch = np.zeros((2, 2, 48000), dtype=np.float32)
    clip = adapter.waveform_to_clip(batch, 48000)
    assert clip.waveform.shape == (2, 48000) and clip.sample_rate == 48000 and clip.seconds == 1.0


def test_progress_is_overall_and_never_goes_back() -> None:
    seen: list[tuple[int, int]] = []
    forward = adapter.ProgressForwarder(lambda value, total: seen.append((value, total)))
    for phase, fraction in (("text encoder", 0.1), ("denoise", 0.5), ("denoise", 0.4), ("FFmpeg", 0.95)):
        forward(ProgressEvent(phase=phase, done=1, total=2, fraction=fraction, elapsed=0.0))
    forward.finish()
    assert seen == [(100, 1000), (500, 1000), (950, 1000), (1000, 1000)]
    assert forward.last_phase == "FFmpeg"


def test_the_node_says_paused_while_the_engine_is_and_then_goes_back_to_its_text() -> None:
    from h3bridge.comfy.pause import PAUSED_TEXT
    from h3bridge.progress import PAUSED_PHASE
    shown: list[str] = []
    text = adapter.NodeText(shown.append)
    forward = adapter.ProgressForwarder(lambda value, total: None, on_paused=text.paused)
    text.notice("one-shot: 320x192")
    for phase in ("denoise", PAUSED_PHASE, "denoise", "decode"):
        forward(ProgressEvent(phase=phase, done=1, total=2, fraction=0.5, elapsed=0.0))
    assert shown == ["one-shot: 320x192", PAUSED_TEXT + "\none-shot: 320x192", "one-shot: 320x192"]
    assert "memory stays in use" in PAUSED_TEXT


# ----------------------------------------------------------------------------- running (engine stand-in)

@dataclass
class RecordingEngine:
    """Stands in for OneShotEngine to record what the adapter asks for; writes a real MP4."""

    frames: np.ndarray | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    seen_files: list[Path] = field(default_factory=list)
    capabilities = OneShotEngine.capabilities

    def check_supported(self, request) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(self, request, output, *, overwrite, want_frames, want_audio, on_progress, cancel):
        self.calls.append(dict(request=request, output=output, overwrite=overwrite, want_frames=want_frames,
                               want_audio=want_audio, cancel=cancel))
        for path in (request.first_frame, request.last_frame, *(r.path for r in request.references)):
            if path is not None:
                assert Path(path).is_file()
                self.seen_files.append(Path(path))
        on_progress(ProgressEvent(phase="denoise", done=1, total=1, fraction=0.5, elapsed=0.1))
        with av.open(str(output), "w") as container:   # a 1-frame MP4 so the path is real
            stream = container.add_stream("libx264", rate=24)
            stream.width, stream.height, stream.pix_fmt = request.width, request.height, "yuv420p"
            frame = av.VideoFrame.from_ndarray(np.zeros((request.height, request.width, 3), np.uint8), format="rgb24")
            for packet in (*stream.encode(frame), *stream.encode(None)):
                container.mux(packet)
        frames = None
        if want_frames:
            frames = np.full((request.frame_count, request.height, request.width, 3), 51, dtype=np.uint8)
        audio = np.zeros((2, 32000), dtype=np.float32)
        return GenerationResult(request=request, video_path=Path(output), frames=frames, audio=audio,
                                width=request.width, height=request.height, frame_count=request.frame_count,
                                seed=request.seed, timings={"denoise": 1.5, "total": 2.0})


SMALL = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64,
                                 length_unit="frames", frames=22, ssd_streaming="off")


@pytest.fixture
def handle(fixture_model: Path) -> adapter.EngineHandle:
    return adapter.EngineHandle(engine_path=Path("/bin/h3"), model_dir=fixture_model)


def _run(tmp_path: Path, engine: RecordingEngine, *, want_image: bool, inputs: adapter.GenerateInputs | None = None,
         settings: adapter.GenerateSettings = SMALL, handle: adapter.EngineHandle) -> adapter.GenerateOutputs:
    events: list[ProgressEvent] = []
    return adapter.run_generate(handle, settings, inputs or adapter.GenerateInputs(),
                                scratch_parent=tmp_path / "scratch", output_dir=tmp_path / "out",
                                want_image=want_image, on_progress=events.append, cancel=CancelToken(),
                                engine_factory=lambda handle: engine)


def test_unconnected_image_output_builds_no_frames(tmp_path: Path, handle: adapter.EngineHandle) -> None:
    engine = RecordingEngine()
    outputs = _run(tmp_path, engine, want_image=False, handle=handle)
    assert engine.calls[0]["want_frames"] is False and engine.calls[0]["want_audio"] is True
    assert engine.calls[0]["overwrite"] is False
    assert outputs.image_is_placeholder and outputs.image.shape == (1, 64, 96, 3)
    assert "not connected" in outputs.summary
    assert outputs.video_path.is_file() and outputs.video_path.parent == tmp_path / "out"
    assert outputs.waveform.shape == (1, 2, 32000) and outputs.sample_rate == 32000


def test_connected_image_output_gets_every_frame(tmp_path: Path, handle: adapter.EngineHandle) -> None:
    engine = RecordingEngine()
    outputs = _run(tmp_path, engine, want_image=True, handle=handle)
    assert engine.calls[0]["want_frames"] is True
    assert not outputs.image_is_placeholder
    assert outputs.image.shape == (22, 64, 96, 3) and outputs.image.dtype == np.float32
    np.testing.assert_allclose(outputs.image, 0.2, rtol=1e-6)
    summary = outputs.summary
    assert "96x64, 22 frames" in summary and "seed: 42" in summary and "denoise 1.50s" in summary
    assert "prompt: a red fox" in summary


def test_each_run_writes_a_new_mp4(tmp_path: Path, handle: adapter.EngineHandle) -> None:
    first = _run(tmp_path, RecordingEngine(), want_image=False, handle=handle).video_path
    second = _run(tmp_path, RecordingEngine(), want_image=False, handle=handle).video_path
    assert first != second and first.is_file() and second.is_file()


def test_anchor_images_are_written_and_cleaned_up(tmp_path: Path, handle: adapter.EngineHandle) -> None:
    first = np.zeros((1, 64, 96, 3), dtype=np.float32)
    first[..., 0] = 1.0
    last = np.full((64, 96, 4), 0.5, dtype=np.float32)     # RGBA without batch: alpha dropped
    engine = RecordingEngine()
    _run(tmp_path, engine, want_image=False, handle=handle, inputs=adapter.GenerateInputs(first_frame=first, last_frame=last))
    request = engine.calls[0]["request"]
    assert request.first_frame is not None and request.last_frame is not None
    assert [p.suffix for p in engine.seen_files] == [".png", ".png"]
    assert not any(p.exists() for p in engine.seen_files)          # scratch removed after the run
    assert list((tmp_path / "scratch").iterdir()) == []


def test_scratch_files_are_removed_when_the_engine_fails(tmp_path: Path, handle: adapter.EngineHandle) -> None:
    class FailingEngine(RecordingEngine):
        def generate(self, request, output, **kwargs):
            self.seen_files.append(Path(request.first_frame))
            raise RequestError("engine said no")

    engine = FailingEngine()
    with pytest.raises(RequestError, match="engine said no"):
        _run(tmp_path, engine, want_image=True, handle=handle,
             inputs=adapter.GenerateInputs(first_frame=np.zeros((64, 96, 3), np.float32)))
    assert engine.seen_files and not engine.seen_files[0].exists()
    assert list((tmp_path / "scratch").iterdir()) == []


def test_bad_request_fails_before_the_engine_starts(tmp_path: Path, handle: adapter.EngineHandle) -> None:
    engine = RecordingEngine()
    with pytest.raises(RequestError) as info:
        _run(tmp_path, engine, want_image=False, handle=handle,
             settings=adapter.GenerateSettings(prompt="x", width=100, height=64, ssd_streaming="off"))
    assert info.value.field == "width"
    assert engine.calls == []


def test_references_reach_the_engine_in_order(tmp_path: Path, handle: adapter.EngineHandle) -> None:
    from h3bridge.media.references import AudioClip, ReferenceItem
    picture = np.full((40, 48, 3), 0.25, np.float32)
    sound = AudioClip(np.zeros((2, 32000 * 3), np.float32), 32000)
    references = (ReferenceList()
                  .appended(ReferenceItem(ReferenceKind.IMAGE, image=picture))
                  .appended(ReferenceItem(ReferenceKind.AUDIO, audio=sound)))
    engine = RecordingEngine()
    settings = adapter.GenerateSettings(prompt="the fox <Picture 1> with <Audio 1>", preset="preview", width=96,
                                        height=64, length_unit="frames", frames=56, ssd_streaming="off")
    _run(tmp_path, engine, want_image=False, handle=handle, inputs=adapter.GenerateInputs(references=references), settings=settings)
    request = engine.calls[0]["request"]
    assert [r.kind for r in request.references] == [ReferenceKind.IMAGE, ReferenceKind.AUDIO]
    assert [p.suffix for p in engine.seen_files] == [".png", ".wav"]
    assert not any(p.exists() for p in engine.seen_files)




def test_warm_session_falls_back_to_one_shot_when_it_cannot_take_the_request(tmp_path: Path,
                                                                           handle: adapter.EngineHandle) -> None:
    from h3bridge.errors import SessionUnsupportedError

    class Unsupported(RecordingEngine):
        def generate(self, request, output, **kwargs):
            self.calls.append(dict(request=request))
            raise SessionUnsupportedError("the prompt has several lines")

    session, one_shot = Unsupported(), RecordingEngine()
    opened: list[str] = []

    def factory(chosen: adapter.EngineHandle) -> RecordingEngine:
        opened.append(chosen.mode)
        return session if chosen.mode == adapter.SESSION else one_shot

    warm = adapter.EngineHandle(handle.engine_path, handle.model_dir, adapter.SESSION)
    outputs = adapter.run_generate(warm, SMALL, adapter.GenerateInputs(), scratch_parent=tmp_path / "s",
                                   output_dir=tmp_path / "o", want_image=False, engine_factory=factory,
                                   on_progress=lambda event: None)
    assert opened == [adapter.SESSION, adapter.ONE_SHOT]
    assert len(one_shot.calls) == 1 and outputs.video_path.is_file()
    assert outputs.summary.startswith("engine: one-shot engine")
    assert "session: the prompt has several lines; ran one-shot instead" in outputs.summary


def test_internal_canvas_is_passed_and_checked() -> None:
    request = adapter.build_request(adapter.GenerateSettings(prompt="x", width=512, height=512,
                                                             render_width=384, render_height=384))
    assert (request.render_width, request.render_height) == (384, 384)
    request.validate(check_files=False)
    plain = adapter.build_request(adapter.GenerateSettings(prompt="x"))
    assert (plain.render_width, plain.render_height) == (None, None)
    with pytest.raises(RequestError) as info:
        adapter.build_request(adapter.GenerateSettings(prompt="x", width=512, height=512,
                                                       render_width=384)).validate(check_files=False)
    assert info.value.field == "render_height"


def test_each_warm_session_job_uses_its_engine_nodes_watchdog(tmp_path: Path) -> None:
    """shared_session keeps the first caller's options; the node's stall_timeout must still
    apply to every job (the stall error tells users to raise it)."""
    from core_helpers import sim_engine_path
    engine = sim_engine_path()
    first = adapter.open_engine(adapter.EngineHandle(engine, tmp_path, adapter.SESSION, 600.0))
    second = adapter.open_engine(adapter.EngineHandle(engine, tmp_path, adapter.SESSION, 3600.0))
    assert second is first and second.stall_timeout == 3600.0
    never = adapter.open_engine(adapter.EngineHandle(engine, tmp_path, adapter.SESSION, None))
    assert never is first and never.stall_timeout is None
    first.close()


def test_summary_timings_read_well_when_only_the_total_is_known(handle: adapter.EngineHandle) -> None:
    """A remote job reports only its total: 'timings: total 1.67s', not 'timings: ; total 1.67s'."""
    request = adapter.build_request(SMALL)
    for timings, expected in (({"total": 1.67}, "timings: total 1.67s"),
                              ({"denoise": 1.5, "total": 2.0}, "timings: denoise 1.50s, total 2.00s")):
        result = GenerationResult(request=request, video_path=Path("/x.mp4"), frames=None, audio=None, width=96,
                                  height=64, frame_count=22,
                                  seed=request.seed, timings=timings)
        assert expected in adapter.summarise(result, handle).splitlines()


def test_a_remote_job_shows_no_eta_from_this_machines_runs(handle: adapter.EngineHandle) -> None:
    shown: list[str] = []
    remote = adapter.EngineHandle(engine_path=None, model_dir=None, mode=adapter.REMOTE, remote_url="http://x:1")
    for engine in (handle, remote):
        progress, text = adapter.node_progress(engine, lambda value, total: None, shown.append)
        text.notice(f"{engine.mode}: job")
        progress(ProgressEvent(phase="denoise", done=1, total=2, fraction=0.5, elapsed=1.0, eta=30.0))
    assert any("from past runs" in line and line.startswith("one-shot") for line in shown)
    assert [line for line in shown if line.startswith("remote")] == ["remote: job"]


def test_remote_polls_write_no_httpx_line_per_request(caplog: pytest.LogCaptureFixture) -> None:
    """ComfyUI's console shows INFO; httpx logs one INFO line per request, and a remote job polls
    every second. The H3 nodes' server goes quiet; another httpx user's requests still log."""
    import logging

    import httpx
    from h3bridge.comfy.remote import open_remote_engine
    engine = open_remote_engine("http://studio-mac.local:8765")
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    caplog.set_level(logging.INFO, logger="httpx")
    with httpx.Client(transport=transport) as client:
        client.get(engine.base_url.rstrip("/") + "/v1/videos/job-1")
        client.get("http://elsewhere.local:9000/v1/models")
    lines = [record.getMessage() for record in caplog.records if record.name == "httpx"]
    assert lines == ['HTTP Request: GET http://elsewhere.local:9000/v1/models "HTTP/1.1 200 OK"']
