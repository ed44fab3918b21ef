"""The H3 Storyboard ComfyUI node, called in-process. Needs ComfyUI importable, so it runs in
ComfyUI's own python (torch, comfy_api) with the checkout on sys.path; skipped otherwise. The
logic is tested in test_story.py.

    PATH=.venv/bin:$PATH COMFYUI_DIR=/path/to/ComfyUI /path/to/comfyui/python -m pytest -q \
        tests/test_story_nodes.py
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from comfy_helpers import require_comfyui_in_process

torch = require_comfyui_in_process()

from h3bridge.comfy.adapter import EngineHandle, ONE_SHOT  # noqa: E402
from h3bridge.comfy.story_nodes import STORY_NODES, H3StoryboardNode  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402


def test_every_input_has_a_tooltip_and_the_node_is_registered() -> None:
    import asyncio

    from h3bridge.comfy.nodes import comfy_entrypoint
    listed = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    assert H3StoryboardNode in listed
    for node in STORY_NODES:
        assert all(item.tooltip for item in node.define_schema().inputs), node


def test_storyboard_node_renders_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import folder_paths
    monkeypatch.setattr(folder_paths, "get_output_directory", lambda: str(tmp_path / "output"))
    monkeypatch.setattr(folder_paths, "get_temp_directory", lambda: str(tmp_path / "temp"))
    sim = shutil.which("h3-sim") or str(Path(sys.executable).with_name("h3-sim"))
    if not Path(sim).exists():
        pytest.skip("h3-sim is not installed in this python")
    log = tmp_path / "sim.jsonl"
    monkeypatch.setenv("H3_SIM_LOG", str(log))
    handle = EngineHandle(Path(sim), write_fixture_model(tmp_path / "model"), ONE_SHOT, None)
    shots = "[22f]\nfirst shot\n\n[22f anchor]\nsecond shot"
    values = dict(engine=handle, shots=shots, preset="preview", width=64, height=32, seed=3, job_name="test-film")
    video, audio, image, summary, takes = H3StoryboardNode.execute(**values).result
    assert tuple(image.shape) == (43, 32, 64, 3)          # outside the executor every output is built
    assert audio["sample_rate"] == 32000 and tuple(audio["waveform"].shape) == (1, 2, 43 * 32000 // 24)
    # The film once, in temp (Save Video keeps it in output); the output folder holds the shots only.
    assert (tmp_path / "temp" / "h3bridge" / "stories" / "test-film.mp4").is_file()
    assert not (tmp_path / "output" / "h3bridge" / "stories" / "test-film.mp4").exists()
    assert not (tmp_path / "output" / "h3bridge" / "stories" / "test-film" / ".lock").exists()
    assert "rendered 2" in summary and len(log.read_text().splitlines()) == 2
    again = H3StoryboardNode.execute(**values).result
    assert "rendered 0, kept 2" in again[3] and len(log.read_text().splitlines()) == 2


def test_a_memory_refusal_names_the_nodes_inputs_and_ssd_streaming_or_force_run_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 2: the node said `--ssd-streaming` / `--force` (CLI flags) and had no way to
    force; 24-32 GB Macs need SSD streaming for most stories."""
    import folder_paths

    from h3bridge.errors import MemoryPlanError
    from h3bridge.model.memory import MachineFacts
    monkeypatch.setattr(folder_paths, "get_output_directory", lambda: str(tmp_path / "output"))
    monkeypatch.setattr(folder_paths, "get_temp_directory", lambda: str(tmp_path / "temp"))    # the film: never ComfyUI's own
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: MachineFacts.mac(24, "Apple M4 Pro")))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    sim = shutil.which("h3-sim") or str(Path(sys.executable).with_name("h3-sim"))
    if not Path(sim).exists():
        pytest.skip("h3-sim is not installed in this python")
    log = tmp_path / "sim.jsonl"
    monkeypatch.setenv("H3_SIM_LOG", str(log))
    realistic = write_fixture_model(tmp_path / "model", realistic=True, ref2va=False)
    handle = EngineHandle(Path(sim), realistic, ONE_SHOT, None)
    values = dict(engine=handle, shots="[22f]\nfirst shot\n\n[22f anchor]\nsecond shot", preset="preview",
                  width=864, height=480, seed=3, job_name="memory-film")
    with pytest.raises(MemoryPlanError) as refused:
        H3StoryboardNode.execute(**values)
    said = str(refused.value)
    assert "does not fit" in said and "the ssd_streaming input to true" in said and "force input" in said, said
    assert "--" not in said and "force=True" not in said, said
    assert not log.exists(), "nothing may render before the refusal"
    with_streaming = H3StoryboardNode.execute(**values, ssd_streaming=True).result
    assert "rendered 2" in with_streaming[3]
    assert all("--ssd-streaming" in line for line in log.read_text().splitlines())
    forced = H3StoryboardNode.execute(**{**values, "job_name": "forced-film"}, force=True).result
    assert "rendered 2" in forced[3]


def test_the_new_inputs_come_last_and_are_optional_so_saved_workflows_keep_their_values() -> None:
    inputs = H3StoryboardNode.define_schema().inputs
    assert [item.id for item in inputs[-5:]] == ["ssd_streaming", "force", "takes", "pick", "background"]
    assert all(item.optional for item in inputs[-5:])
