"""H3 Generate's takes, through the adapter (no ComfyUI needed): the takes render once on one warm
engine, the outputs carry the pick, the contact sheet and every take's row of it, and another pick
of the same request renders nothing (engine starts and denoises counted with h3-sim's logs)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core_helpers import model_dir, sim_engine_path, sim_invocations  # noqa: F401
from h3bridge.comfy import adapter
from h3bridge.comfy.takes import TakesCache
from h3bridge.errors import RequestError
from h3bridge.media.decode import decode_audio, decode_video_frames
from h3bridge.media.png import image_from_png

SMALL = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64, seed=20,
                                 length_unit="frames", frames=22, ssd_streaming="off")


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    starts, denoises = tmp_path / "starts.jsonl", tmp_path / "denoises.jsonl"
    monkeypatch.setenv("H3_SIM_LOG", str(starts))
    monkeypatch.setenv("H3_SIM_DENOISE_LOG", str(denoises))
    return starts, denoises


def test_takes_render_once_and_another_pick_renders_nothing(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, denoises = counted
    handle = adapter.EngineHandle(sim_engine_path(), model_dir, adapter.SESSION)
    cache = TakesCache()
    anchor = np.full((64, 96, 3), 0.5, np.float32)          # written to a new scratch name every run

    def run(pick: int, notes: list[str]) -> adapter.GenerateOutputs:
        return adapter.run_generate(handle, SMALL, adapter.GenerateInputs(first_frame=anchor),
                                    scratch_parent=tmp_path / "scratch", output_dir=tmp_path / "out", want_image=True,
                                    on_notice=notes.append, takes=3, pick=pick, takes_cache=cache)

    notes: list[str] = []
    first = run(1, notes)
    assert len(sim_invocations(starts)) == 1 and [e["seed"] for e in sim_invocations(denoises)] == [20, 21, 22]
    assert ["take 1/3 (seed 20)", "take 2/3 (seed 21)", "take 3/3 (seed 22)"] == [n for n in notes if n.startswith("take")]
    assert first.video_path.name.endswith(".take1.mp4") and first.result.seed == 20
    assert first.sheet is not None and first.sheet.shape[0] == 1 and first.sheet.dtype == np.float32
    sheet_png = next((tmp_path / "out").glob("*.takes.png"))
    assert np.array_equal(np.rint(first.sheet[0] * 255).astype(np.uint8), image_from_png(sheet_png.read_bytes()))
    assert first.takes_image is not None and first.takes_image.shape[0] == 3
    assert first.takes_image.shape[2] == first.sheet.shape[2]
    assert "takes: 3 (seeds 20, 21, 22), pick 1" in first.summary

    notes = []
    second = run(2, notes)
    assert len(sim_invocations(starts)) == 1 and len(sim_invocations(denoises)) == 3      # nothing ran
    assert any("nothing runs" in note for note in notes)
    assert second.video_path.name.endswith(".take2.mp4") and second.result.seed == 21
    assert "seed: 21" in second.summary
    frames = decode_video_frames(second.video_path, 22, 96, 64)
    assert np.allclose(second.image, frames.astype(np.float32) / 255.0)
    audio = decode_audio(second.video_path)
    assert np.allclose(second.waveform[0, :, :audio.shape[1]], audio[:, :second.waveform.shape[2]])
    assert np.array_equal(second.takes_image, first.takes_image)
    assert not np.array_equal(first.image, second.image)

    second.video_path.unlink()          # a take's file gone: the takes are rendered again
    run(2, [])
    assert len(sim_invocations(denoises)) == 6


def test_a_pick_beyond_the_takes_is_refused_in_node_words(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, _ = counted
    handle = adapter.EngineHandle(sim_engine_path(), model_dir, adapter.SESSION)
    with pytest.raises(RequestError) as caught:
        adapter.run_generate(handle, SMALL, adapter.GenerateInputs(), scratch_parent=tmp_path / "s",
                             output_dir=tmp_path / "o", want_image=False, takes=2, pick=3, takes_cache=TakesCache())
    assert caught.value.field == "pick" and "takes 1 to 2" in caught.value.message
    assert "set pick from 1 to 2" in caught.value.hint
    assert sim_invocations(starts) == [] and not (tmp_path / "o").exists()
