"""H3 Generate's and H3 Storyboard's takes, the nodes called in-process. Needs ComfyUI importable,
so it runs in ComfyUI's own python (torch, comfy_api) with the checkout on sys.path; skipped
otherwise. The logic is tested in test_comfy_takes.py and test_takes.py.

    PATH=.venv/bin:$PATH COMFYUI_DIR=/path/to/ComfyUI /path/to/comfyui/python -m pytest -q \
        tests/test_comfy_takes_nodes.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from comfy_helpers import require_comfyui_in_process

torch = require_comfyui_in_process()

from h3bridge.comfy.adapter import EngineHandle, SESSION  # noqa: E402
from h3bridge.comfy.nodes import H3GenerateNode  # noqa: E402
from h3bridge.comfy.story_nodes import H3StoryboardNode  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[EngineHandle, Path, Path]:
    """(a session engine handle over h3-sim, its starts log, its denoises log), ComfyUI's folders in tmp_path."""
    import folder_paths
    monkeypatch.setattr(folder_paths, "get_output_directory", lambda: str(tmp_path / "output"))
    monkeypatch.setattr(folder_paths, "get_temp_directory", lambda: str(tmp_path / "temp"))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    # this checkout's simulator (bin/h3-sim runs it in ComfyUI's python): its denoise log is counted
    sim = Path(__file__).resolve().parents[1] / "bin" / "h3-sim"
    monkeypatch.setenv("H3BRIDGE_PYTHON", sys.executable)
    starts, denoises = tmp_path / "starts.jsonl", tmp_path / "denoises.jsonl"
    monkeypatch.setenv("H3_SIM_LOG", str(starts))
    monkeypatch.setenv("H3_SIM_DENOISE_LOG", str(denoises))
    return EngineHandle(Path(sim), write_fixture_model(tmp_path / "model"), SESSION, None), starts, denoises


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_takes_inputs_and_output_are_on_both_nodes() -> None:
    for node in (H3GenerateNode, H3StoryboardNode):
        schema = node.define_schema()
        inputs = {item.id: item for item in schema.inputs}
        assert inputs["takes"].tooltip and inputs["pick"].tooltip and inputs["takes"].optional
        assert schema.outputs[-1].display_name == "takes"


def test_generate_node_takes_and_a_pick_that_renders_nothing(bed) -> None:
    handle, starts, denoises = bed
    values = dict(engine=handle, prompt="a red fox", preset={"preset": "preview", "steps": 2, "layers": 35, "reuse": 1},
                  width=96, height=64, length_unit={"length_unit": "frames", "frames": 22}, seed=30,
                  ssd_streaming="off", takes=3)
    first = H3GenerateNode.execute(**values, pick=1)
    video, image, audio, summary, takes = first.result
    assert len(lines(denoises)) == 3 and len(lines(starts)) == 1
    assert tuple(takes.shape)[0] == 3 and takes.shape[-1] == 3          # a picture per take
    shown = first.ui.as_dict()["images"]           # the contact sheet, shown on the node
    assert len(shown) == 1 and (Path(bed[0].model_dir).parents[0] / "temp" / shown[0]["subfolder"]
                                / shown[0]["filename"]).is_file()
    assert "seed: 30" in summary and video.get_stream_source().endswith(".take1.mp4")
    second = H3GenerateNode.execute(**values, pick=3)
    video2, _, audio2, summary2, takes2 = second.result
    assert len(lines(denoises)) == 3 and len(lines(starts)) == 1             # nothing ran
    assert "seed: 32" in summary2 and video2.get_stream_source().endswith(".take3.mp4")
    assert torch.equal(takes, takes2) and not torch.equal(audio["waveform"], audio2["waveform"])


def test_storyboard_node_takes_and_a_pick_that_renders_nothing(bed) -> None:
    handle, starts, denoises = bed
    values = dict(engine=handle, shots="[22f]\nfirst shot\n\n[22f takes=1]\nsecond shot", preset="preview",
                  width=64, height=32, seed=3, job_name="takes-film", takes=2)
    video, audio, image, summary, takes = H3StoryboardNode.execute(**values).result
    assert len(lines(denoises)) == 3 and "shot 1 take 1 of 2" in summary
    assert tuple(takes.shape)[0] == 2                  # shot 1's two takes (shot 2 has one)
    output = Path(bed[0].model_dir).parent / "output" / "h3bridge" / "stories" / "takes-film"
    assert (output / "takes.png").is_file()
    again = H3StoryboardNode.execute(**values, pick="1=2").result
    assert len(lines(denoises)) == 3 and "shot 1 take 2 of 2" in again[3] and "rendered 0" in again[3]
    assert not torch.equal(audio["waveform"], again[1]["waveform"])
    with pytest.raises(Exception) as refused:
        H3StoryboardNode.execute(**values, pick="1=3")
    assert "pick" in str(refused.value) and "1 to 2" in str(refused.value)
