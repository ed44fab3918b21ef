"""The node pack inside a real ComfyUI server (headless, CPU), against h3-sim.

Runs only when COMFYUI_DIR points at a ComfyUI checkout (and COMFYUI_PYTHON at the
python of the environment it is installed in; default: this python). Everything
talks to 127.0.0.1 only.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import psutil
import pytest

from comfy_workflows import build_ui_workflow, ui_to_api
from core_helpers import assert_group_gone
from h3bridge.comfy.adapter import frames_for, settings_from_node_values
from h3bridge.hexgrid import chunk_for_cell, hex_grid
from h3bridge.media.decode import decode_video_frames
from h3bridge.request import PRESETS
from h3bridge.sim.fixture import write_fixture_model

pytestmark = pytest.mark.comfyui

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
COMFYUI_PYTHON = os.environ.get("COMFYUI_PYTHON") or sys.executable
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "example_workflows"
WORKFLOWS = ["h3_text_to_video_audio.json", "h3_first_last_frame.json", "h3_references.json"]
HEX_EXAMPLE = "h3_hex_merge.json"     # two clips merged along hexagon edges: its own test

if not COMFYUI_DIR:
    pytest.skip("set COMFYUI_DIR (and COMFYUI_PYTHON) to run the ComfyUI integration tests",
                allow_module_level=True)


@dataclass
class Server:
    url: str
    base: Path
    process: subprocess.Popen
    object_info: dict
    slow_engine: Path
    failing_engine: Path
    hanging_engine: Path      # parks in the denoiser, silent; hang_notice appears once it is
    hang_notice: Path

    def wait_for_silent_engine(self, timeout: float = 120) -> list[psutil.Process]:
        """Wait until the hanging engine has written its last byte (H3_SIM_HANG_NOTICE), then its processes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.hang_notice.exists():
            time.sleep(0.05)
        assert self.hang_notice.exists(), "the engine never reached its silent phase"
        return self.engine_processes()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.load(response)

    def post(self, path: str, body: dict) -> Any:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                data = response.read()
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{path} answered {error.code}: {error.read().decode()[:4000]}") from None
        return json.loads(data) if data else None

    def queue(self, prompt: dict) -> str:
        return self.post("/prompt", {"prompt": prompt})["prompt_id"]

    def wait(self, prompt_id: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            history = self.get(f"/history/{prompt_id}")
            entry = history.get(prompt_id)
            if entry and entry["status"].get("completed") is not None and entry["status"]["status_str"] in ("success", "error"):
                return entry
            time.sleep(0.25)
        raise AssertionError(f"prompt {prompt_id} did not finish in {timeout} s")

    def engine_processes(self) -> list[psutil.Process]:
        """h3-sim processes started by the server (the engine runs in its own session)."""
        found = []
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if any("h3-sim" in part for part in child.cmdline()):
                    found.append(child)
            except psutil.NoSuchProcess:
                continue
        return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _make_inputs(directory: Path) -> None:
    """Media for the tests that wire Load Image/Audio/Video in; the example workflows need none
    (their old input names, h3_first_frame.png etc., are deliberately absent)."""
    directory.mkdir(parents=True, exist_ok=True)
    run = lambda *args: subprocess.run(["ffmpeg", "-v", "error", "-y", *args], check=True)  # noqa: E731
    run("-f", "lavfi", "-i", "testsrc=s=320x240", "-frames:v", "1", str(directory / "test_picture.png"))
    run("-f", "lavfi", "-i", "sine=d=3:sample_rate=44100", "-ac", "2", str(directory / "test_music.wav"))
    run("-f", "lavfi", "-i", "testsrc=s=160x120:r=24:d=1.25", "-f", "lavfi", "-i", "sine=d=1.25:sample_rate=32000",
        "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(directory / "my short clip.mp4"))
    run("-f", "lavfi", "-i", "testsrc=s=160x120:r=24:d=3", "-f", "lavfi", "-i", "sine=d=3:sample_rate=32000",
        "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(directory / "h3_clip_with_audio.mp4"))
    run("-f", "lavfi", "-i", "testsrc2=s=160x120:r=24:d=3", "-c:v", "libx264", "-pix_fmt", "yuv420p",
        str(directory / "h3_clip_silent.mp4"))


def _wrapper(path: Path, engine: str, *assignments: str) -> Path:
    """A script that runs `engine` with extra environment; arguments pass through untouched."""
    path.write_text(f'#!/bin/sh\n{" ".join(assignments)} exec "{engine}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _start_server(base: Path) -> tuple[Server, Any]:
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "h3bridge").symlink_to(REPO, target_is_directory=True)
    write_fixture_model(base / "models" / "h3" / "MiniMax-H3")
    _make_inputs(base / "input")
    sim = shutil.which("h3-sim")
    assert sim, "h3-sim is not installed (pip install -e .)"
    sim = str(Path(sim).resolve())
    # The same simulator, ~1000x slower, for the interrupt test (the env var reaches only this engine).
    slow = _wrapper(base / "slow-h3-sim", sim, "H3_SIM_TIME_SCALE=2")
    # ... and one that fails in the denoiser like a Metal error (h3: <message>, exit 1).
    failing = _wrapper(base / "failing-h3-sim", sim, "H3_SIM_FAIL_PHASE=denoise",
                       "H3_SIM_FAIL_MESSAGE='Metal command buffer failed: out of memory'")
    # ... and one parked mid-denoise, for the tests that stop a running engine (no timing involved).
    notice = base / "engine-silent"
    hanging = _wrapper(base / "hanging-h3-sim", sim, "H3_SIM_HANG_PHASE=denoise", f"H3_SIM_HANG_NOTICE='{notice}'")
    port = _free_port()
    # Own engine lock file: engines of other test modules never queue behind this server's. Own
    # job history (the module-scoped server starts before conftest's per-test one is set).
    env = dict(os.environ, H3_BIN=sim, H3BRIDGE_LOCK_PATH=str(base / "engine.lock"),
               H3BRIDGE_HISTORY_PATH=str(base / "history.sqlite"))
    log = open(base / "comfyui.log", "wb")
    process = subprocess.Popen(
        [COMFYUI_PYTHON, "main.py", "--cpu", "--disable-api-nodes", "--base-directory", str(base),
         "--listen", "127.0.0.1", "--port", str(port)],
        cwd=COMFYUI_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    info = None
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url + "/object_info", timeout=30) as response:
                info = json.load(response)
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    if info is None:
        process.kill()
        pytest.fail("ComfyUI did not start:\n" + (base / "comfyui.log").read_text(errors="replace")[-4000:])
    return Server(url=url, base=base, process=process, object_info=info, slow_engine=slow,
                  failing_engine=failing, hanging_engine=hanging, hang_notice=notice), log


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    started, log = _start_server(tmp_path_factory.mktemp("comfy-base"))
    yield started
    process = started.process
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    log.close()


def _with_probes(prompt: dict, generate_id: str) -> dict:
    """Add core nodes that report what H3 Generate output: IMAGE size, AUDIO file, summary."""
    prompt = json.loads(json.dumps(prompt))
    prompt["900"] = {"class_type": "GetImageSize", "inputs": {"image": [generate_id, 1]}}
    for slot, name in enumerate(("width", "height", "batch")):
        prompt[f"90{slot + 1}"] = {"class_type": "PreviewAny", "inputs": {"source": ["900", slot]}}
    prompt["910"] = {"class_type": "SaveAudio", "inputs": {"audio": [generate_id, 2], "filename_prefix": "audio/h3"}}
    prompt["920"] = {"class_type": "PreviewAny", "inputs": {"source": [generate_id, 3]}}
    return prompt


def _generate_id(prompt: dict) -> str:
    return next(node_id for node_id, node in prompt.items() if node["class_type"] == "H3Generate")


ENGINE = "H3EngineV2"          # H3 Engine: a dynamic combo of modes, each showing its own inputs


def _engine_id(prompt: dict, class_type: str = ENGINE) -> str:
    return next(node_id for node_id, node in prompt.items() if node["class_type"] == class_type)


def _set_engine(server: Server, prompt: dict, **values: Any) -> str:
    """Set H3 Engine's inputs by name (mode=..., model_dir=...) as the API prompt names them
    (`mode.model_dir`): a changed mode brings its own inputs, kept where the old mode had them,
    else their defaults. Returns the engine's node id."""
    engine_id = _engine_id(prompt)
    inputs = prompt[engine_id]["inputs"]
    mode = values.pop("mode", inputs["mode"])
    before = {key.split(".", 1)[1]: value for key, value in inputs.items() if key.startswith("mode.")}
    option = next(o for o in server.object_info[ENGINE]["input"]["required"]["mode"][1]["options"] if o["key"] == mode)
    children = {name: spec for section in option["inputs"].values() for name, spec in section.items()}
    assert set(values) <= set(children), (mode, values)
    prompt[engine_id]["inputs"] = {"mode": mode, **{
        f"mode.{name}": values.get(name, before.get(name, spec[1].get("default"))) for name, spec in children.items()}}
    return engine_id


def _old_engine(prompt: dict, **values: Any) -> str:
    """The example's engine as the deprecated all-modes H3 Engine (node id H3Engine) saved workflows hold."""
    engine_id = _engine_id(prompt)
    prompt[engine_id] = {"class_type": "H3Engine", "inputs": {
        "engine_path": "", "model_dir": "MiniMax-H3", "mode": "one-shot", "stall_timeout": 600, **values}}
    return engine_id


def _output_file(server: Server, item: dict) -> Path:
    return server.base / item.get("type", "output") / item.get("subfolder", "") / item["filename"]


# ----------------------------------------------------------------------------- schema

def test_object_info_lists_the_nodes_with_their_inputs_and_outputs(server: Server) -> None:
    info = server.object_info
    expected_outputs = {
        "H3EngineV2": ["H3_ENGINE"],
        "H3Engine": ["H3_ENGINE"],
        "H3Generate": ["VIDEO", "IMAGE", "AUDIO", "STRING", "IMAGE"],     # the last: the takes' contact sheet
        "H3References": ["H3_REFERENCES"],
        "H3Prompt": ["STRING"],
        "H3MemoryPlan": ["STRING"],
    }
    for node_id, outputs in expected_outputs.items():
        assert info[node_id]["output"] == outputs
        assert info[node_id]["category"] == "MiniMax-H3 (h3.c)"
    generate = info["H3Generate"]["input"]
    assert generate["required"]["engine"][0] == "H3_ENGINE"
    assert generate["required"]["prompt"][1]["multiline"] is True
    # The preset shows the values it will use (its own steps/layers/reuse widgets), no "0 = preset";
    # only the chosen length unit's widget is shown.
    preset = generate["required"]["preset"]
    assert preset[0] == "COMFY_DYNAMICCOMBO_V3"
    assert [option["key"] for option in preset[1]["options"]] == ["balanced", "preview", "quality", "reference", "turbo"]
    for option in preset[1]["options"]:
        widgets = option["inputs"]["required"]
        values = PRESETS[option["key"]]
        assert {name: spec[1]["default"] for name, spec in widgets.items()} == {
            "steps": values.steps, "layers": values.layers, "reuse": values.reuse}
        assert all(spec[1]["min"] > 0 for spec in widgets.values())
    length = generate["required"]["length_unit"]
    assert length[0] == "COMFY_DYNAMICCOMBO_V3"
    assert {o["key"]: list(o["inputs"]["required"]) for o in length[1]["options"]} == {
        "seconds": ["seconds"], "frames": ["frames"]}
    assert "Snapped UP" in length[1]["options"][1]["inputs"]["required"]["frames"][1]["tooltip"]
    assert not {"steps", "layers", "reuse", "seconds", "frames"} & set(generate["required"])
    plan_preset = info["H3MemoryPlan"]["input"]["required"]["preset"][1]["options"][0]["inputs"]["required"]
    assert set(plan_preset) == {"layers", "reuse"}           # steps change no memory
    assert generate["required"]["seed"][1]["control_after_generate"] is True
    assert generate["required"]["ssd_streaming"][1]["options"] == ["auto", "on", "off"]
    assert {name: spec[0] for name, spec in generate["optional"].items()} == {
        "first_frame": "IMAGE", "last_frame": "IMAGE", "references": "H3_REFERENCES",
        "render_width": "INT", "render_height": "INT", "force": "BOOLEAN", "takes": "INT", "pick": "INT",
        "background": "BOOLEAN"}
    assert set(info["H3Generate"]["input"]["hidden"]) == {"prompt", "unique_id"}
    references = info["H3References"]["input"]
    assert references["required"]["kind"][1]["options"] == [
        "image", "video", "video with its audio", "video plus replacement audio", "audio"]
    assert {name: spec[0] for name, spec in references["optional"].items()} == {
        "previous": "H3_REFERENCES", "image": "IMAGE", "video": "VIDEO", "audio": "AUDIO"}
    assert set(info["H3Prompt"]["input"]["required"]) >= {"scene", "action", "camera", "look", "audio"}
    assert info["H3Engine"]["input"]["required"]["mode"][1]["options"][0] == "one-shot"
    assert info["H3Engine"]["deprecated"] is True and not info[ENGINE].get("deprecated")
    # H3 Engine shows each mode's own inputs (issue 20 item 5): remote mode no model folder
    mode = info[ENGINE]["input"]["required"]["mode"]
    assert mode[0] == "COMFY_DYNAMICCOMBO_V3" and list(info[ENGINE]["input"]["required"]) == ["mode"]
    assert {o["key"]: list(o["inputs"]["required"]) for o in mode[1]["options"]} == {
        "one-shot": ["engine_path", "model_dir", "stall_timeout"],
        "session": ["engine_path", "model_dir", "stall_timeout"],
        "library": ["library_path", "model_dir", "previews", "engine_path", "stall_timeout"],
        "remote": ["remote_url"]}


# ----------------------------------------------------------------------------- example workflows

@pytest.mark.parametrize("name", WORKFLOWS)
def test_example_workflow_runs_and_saves_an_mp4_with_audio(server: Server, name: str) -> None:
    """As shipped: the server's input folder holds none of the files the examples once needed."""
    assert not any((server.base / "input" / old).exists() for old in (
        "h3_first_frame.png", "h3_last_frame.png", "h3_reference.png", "h3_reference_music.wav"))
    workflow = json.loads((EXAMPLES / name).read_text())
    assert {"nodes", "links", "version"} <= set(workflow)            # the frontend's (UI) format
    assert any(node["type"] == "SaveVideo" for node in workflow["nodes"])
    prompt = ui_to_api(workflow, server.object_info)
    generate_id = _generate_id(prompt)
    entry = server.wait(server.queue(_with_probes(prompt, generate_id)))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    outputs = entry["outputs"]

    save_id = next(i for i, node in prompt.items() if node["class_type"] == "SaveVideo")
    saved = _output_file(server, outputs[save_id]["images"][0])
    with av.open(str(saved)) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        size = (video.codec_context.width, video.codec_context.height)
        frames = sum(1 for _ in container.decode(video))
        assert audio.codec_context.sample_rate == 32000 and audio.codec_context.channels == 2
    generate = prompt[generate_id]["inputs"]
    assert size == (generate["width"], generate["height"])
    summary = outputs["920"]["text"][0]
    assert f"{frames} frames at 24 fps" in summary

    width, height, batch = (int(outputs[f"90{i}"]["text"][0]) for i in (1, 2, 3))
    assert (width, height, batch) == (size[0], size[1], frames)     # IMAGE [F, H, W, 3] (connected here)

    flac = _output_file(server, outputs["910"]["audio"][0])
    with av.open(str(flac)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        assert stream.codec_context.sample_rate == 32000 and stream.codec_context.channels == 2
    assert abs(samples - frames / 24 * 32000) < 32000 * 0.1          # AUDIO covers the clip

    if "references" in name:
        assert "references: image, audio" in summary
    if "first_last" in name:
        assert "anchors: first=yes, last=yes" in summary


def test_hex_nodes_are_listed_with_the_other_h3_nodes_and_every_input_has_a_tooltip(server: Server) -> None:
    info = server.object_info
    category = info["H3Generate"]["category"]
    assert info["H3HexGrid"]["category"] == info["H3HexMerge"]["category"] == category
    assert info["H3HexGrid"]["display_name"] == "H3 Hex Grid" and info["H3HexMerge"]["display_name"] == "H3 Hex Merge"
    assert info["H3HexGrid"]["output"] == ["MASK", "IMAGE", "H3_CELLS"]
    assert info["H3HexMerge"]["output"] == ["IMAGE", "AUDIO"]
    assert info["H3HexMerge"]["input"]["required"]["cells"][0] == "H3_CELLS"
    for node_id in ("H3HexGrid", "H3HexMerge"):
        sections = info[node_id]["input"]
        specs = {name: spec for section in ("required", "optional") for name, spec in sections.get(section, {}).items()}
        assert specs, node_id
        for name, spec in specs.items():
            assert len(spec) > 1 and spec[1].get("tooltip"), (node_id, name, spec)


def _hex_example_probes(prompt: dict) -> tuple[dict, list[str]]:
    """The shipped hex example plus a Save Video of each H3 Generate's clip (streams copied, not
    re-encoded): the clips the merge was given. Returns the prompt and the generate node ids in
    the order their frames enter H3 Hex Merge (image_0, image_1, ...)."""
    prompt = json.loads(json.dumps(prompt))
    merge = next(node for node in prompt.values() if node["class_type"] == "H3HexMerge")
    slots = sorted((name for name in merge["inputs"] if name.startswith("images.")),
                   key=lambda name: int(name.rsplit("_", 1)[1]))
    generate_ids = []
    for slot in slots:
        components_id = merge["inputs"][slot][0]           # GetVideoComponents <- H3 Generate's VIDEO
        generate_id = prompt[components_id]["inputs"]["video"][0]
        assert prompt[generate_id]["class_type"] == "H3Generate"
        generate_ids.append(generate_id)
    for number, generate_id in enumerate(generate_ids):
        prompt[f"95{number}"] = {"class_type": "SaveVideo", "inputs": {
            "video": [generate_id, 0], "filename_prefix": f"video/hex_clip_{number}", "format": "auto",
            "codec": "auto"}}
    return prompt, generate_ids


def _deep_inside(weight: np.ndarray, margin: int) -> np.ndarray:
    """bool [H, W]: pixels whose whole (2 margin + 1)^2 neighbourhood has weight 1, i.e. well away
    from every overlap band (where H.264's blocks and chroma subsampling reach no other clip)."""
    full = weight >= 1.0 - 1e-6
    deep = full.copy()
    height, width = full.shape
    for dy in range(-margin, margin + 1):
        for dx in range(-margin, margin + 1):
            shifted = np.zeros_like(full)
            shifted[max(-dy, 0):height - max(dy, 0), max(-dx, 0):width - max(dx, 0)] = \
                full[max(dy, 0):height + min(dy, 0), max(dx, 0):width + min(dx, 0)]
            deep &= shifted
    return deep


def test_hex_merge_example_blends_two_clips_along_hexagon_edges(server: Server) -> None:
    """The shipped example as it is: two H3 clips, an H3 grid, the merge, Save Video. The saved MP4
    has the clips' size and length, and deep inside every cell it shows the clip that cell takes
    (hexgrid.chunk_for_cell over the library's own grid), not the other one."""
    workflow = json.loads((EXAMPLES / HEX_EXAMPLE).read_text())
    assert {"nodes", "links", "version"} <= set(workflow)
    prompt, generate_ids = _hex_example_probes(ui_to_api(workflow, server.object_info))
    assert len(generate_ids) == 2
    entry = server.wait(server.queue(prompt), timeout=300)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    outputs = entry["outputs"]

    settings = [settings_from_node_values(prompt[i]["inputs"]) for i in generate_ids]
    width, height = settings[0].width, settings[0].height
    frames = frames_for(settings[0])
    assert all((s.width, s.height, frames_for(s)) == (width, height, frames) for s in settings)
    grid_node = next(node["inputs"] for node in prompt.values() if node["class_type"] == "H3HexGrid")
    assert (grid_node["width"], grid_node["height"]) == (width, height)

    save_id = next(i for i, node in prompt.items() if node["class_type"] == "SaveVideo" and not i.startswith("95"))
    saved = _output_file(server, outputs[save_id]["images"][0])
    with av.open(str(saved)) as container:
        video = container.streams.video[0]
        assert (video.codec_context.width, video.codec_context.height) == (width, height)
        assert sum(1 for _ in container.decode(video)) == frames
        audio = container.streams.audio[0]          # the first clip's soundtrack, passed through
        assert audio.codec_context.sample_rate == 32000 and audio.codec_context.channels == 2

    merged = decode_video_frames(saved, frames, width, height).astype(np.int16)
    clips = [decode_video_frames(_output_file(server, outputs[f"95{n}"]["images"][0]), frames, width, height)
             .astype(np.int16) for n in range(len(generate_ids))]
    assert np.abs(clips[0] - clips[1]).mean() > 20          # two different clips (prompts and seeds differ)

    grid = hex_grid(width, height, grid_node["resolution"], grid_node["overlap"])
    for number, clip in enumerate(clips):
        other = clips[1 - number]
        weight = np.zeros((height, width), np.float32)
        for cell in range(len(grid)):
            if chunk_for_cell(cell, len(clips)) == number:
                weight += grid.weight_map(cell)
        deep = _deep_inside(weight, margin=4)
        assert deep.mean() > 0.2, f"clip {number} owns almost no pixels outright"
        # Within H.264's error of its own clip ...
        error = np.abs(merged[:, deep] - clip[:, deep])
        assert error.mean() < 4 and np.percentile(error, 99) < 16, (number, error.mean())
        # ... and nothing like the other clip there.
        assert np.abs(merged[:, deep] - other[:, deep]).mean() > 20
    # Every pixel is some blend of the two: the transition is inside the bands, not a third picture.
    low, high = np.minimum(clips[0], clips[1]), np.maximum(clips[0], clips[1])
    outside = np.maximum(low - merged, merged - high)
    assert np.percentile(outside, 99) < 16


def test_examples_are_templates_with_thumbnails(server: Server) -> None:
    """ComfyUI lists example_workflows/*.json as the pack's templates, and the template browser shows
    /api/workflow_templates/<pack>/<name>.jpg beside each (app/custom_node_manager.py, the frontend's
    getTemplateThumbnailUrl for custom-node templates: mediaSubtype jpg)."""
    listed = server.get("/workflow_templates")
    shipped = sorted(path.name for path in EXAMPLES.glob("*.json"))
    assert set(WORKFLOWS) <= set(shipped)
    assert sorted(listed["h3bridge"]) == sorted(Path(name).stem for name in shipped)
    for name in shipped:
        with urllib.request.urlopen(f"{server.url}/api/workflow_templates/h3bridge/{Path(name).stem}.jpg",
                                    timeout=30) as response:
            picture = response.read()
            assert response.headers["Content-Type"] == "image/jpeg"
        assert picture[:3] == b"\xff\xd8\xff" and len(picture) > 2000


@pytest.mark.timeout(900)        # a headless browser on a loaded machine: bounded by the driver's own timeout
def test_example_workflows_load_in_the_real_frontend(server: Server, tmp_path: Path) -> None:
    """Each example opens in ComfyUI's own frontend (headless Chromium) with every node known, and
    the frontend turns it into exactly the API prompt these tests run."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        pytest.skip("no chromium on PATH (apt-get install chromium) for the frontend check")
    script = Path(__file__).with_name("comfy_frontend_load.py")
    names = [*WORKFLOWS, HEX_EXAMPLE]
    # Beside the examples: one saved with the old all-modes H3 Engine (its seven widget values, the
    # way every workflow made before H3EngineV2 holds them), and the new node switched to remote.
    saved = json.loads((EXAMPLES / WORKFLOWS[0]).read_text())
    old_engine = next(node for node in saved["nodes"] if node["type"] == ENGINE)
    old_engine.update(type="H3Engine", properties={"Node name for S&R": "H3Engine"},
                      widgets_values=["", "MiniMax-H3", "one-shot", 600, "", "", True])
    (tmp_path / "saved_with_old_engine.json").write_text(json.dumps(saved))
    remote = json.loads((EXAMPLES / WORKFLOWS[0]).read_text())
    next(node for node in remote["nodes"] if node["type"] == ENGINE)["widgets_values"] = ["remote", "http://127.0.0.1:9"]
    (tmp_path / "engine_in_remote_mode.json").write_text(json.dumps(remote))
    run = subprocess.run([COMFYUI_PYTHON, str(script), server.url, "--screenshots", str(tmp_path),
                          *(str(EXAMPLES / name) for name in names), str(tmp_path / "saved_with_old_engine.json"),
                          str(tmp_path / "engine_in_remote_mode.json")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    # The old node still loads (deprecated) with its values where they were, and runs as before.
    old = report["saved_with_old_engine.json"]
    assert old["missing"] == []
    old_inputs = next(node["inputs"] for node in old["output"].values() if node["class_type"] == "H3Engine")
    assert old_inputs == {"engine_path": "", "model_dir": "MiniMax-H3", "mode": "one-shot", "stall_timeout": 600,
                          "remote_url": "", "library_path": "", "previews": True}
    entry = server.wait(server.queue(old["output"]))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    # Remote mode shows the server's URL and nothing else (issue 20 item 5).
    shown = {entry["type"]: entry["widgets"] for entry in report["engine_in_remote_mode.json"]["widgets"]}
    assert shown[ENGINE] == ["mode", "mode.remote_url"]
    assert {entry["type"]: entry["widgets"] for entry in report[WORKFLOWS[0]]["widgets"]}[ENGINE] == [
        "mode", "mode.engine_path", "mode.model_dir", "mode.stall_timeout"]
    for name in names:
        workflow = json.loads((EXAMPLES / name).read_text())
        loaded = report[name]
        assert loaded["missing"] == [] and loaded["count"] == len(workflow["nodes"])
        frontend = {node_id: (node["class_type"], node["inputs"]) for node_id, node in loaded["output"].items()}
        ours = {node_id: (node["class_type"], node["inputs"]) for node_id, node in
                ui_to_api(workflow, server.object_info).items()}
        assert frontend == ours
        assert (tmp_path / (Path(name).stem + ".png")).stat().st_size > 0
        # Save Video's preview grows downwards when the clip loads: nothing may sit below it.
        boxes = {entry["type"]: entry["box"] for entry in loaded["boxes"]}
        save_x, save_y, save_w, _ = boxes["SaveVideo"]
        for entry in loaded["boxes"]:
            x, y, w, h = entry["box"]
            if entry["type"] != "SaveVideo":
                assert x >= save_x + save_w or x + w <= save_x or y + h <= save_y, (name, entry)
        # No node is drawn over another (H3 Engine is taller than its saved size: issue 20 item 5).
        drawn = loaded["boxes"]
        for index, first in enumerate(drawn):
            for second in drawn[index + 1:]:
                (ax, ay, aw, ah), (bx, by, bw, bh) = first["box"], second["box"]
                assert not (ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah), (name, first, second)
        # Sockets read as the node names them: image_0, not images.image_0 (Autogrow's group path).
        for entry in loaded["sockets"]:
            assert not [label for label in entry["inputs"] if label.startswith(("images.", "audio."))], (name, entry)
        # Every box of H3 Prompt is labelled with its input's name (our frontend extension).
        for entry in loaded["labels"]:
            if entry["type"] == "H3Prompt":
                assert entry["labels"] == ["scene", "action", "camera", "look", "audio", "free_text"]
    assert any(entry["type"] == "H3Prompt" for entry in report[WORKFLOWS[0]]["labels"])


@pytest.mark.timeout(900)
def test_the_frontend_shows_the_nodes_in_chinese_with_the_zh_locale(server: Server, tmp_path: Path) -> None:
    """Issue 24 item 5: ComfyUI serves locales/zh (app/custom_node_manager.py) and its frontend, set to
    Chinese, titles the nodes and labels their widgets from it."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        pytest.skip("no chromium on PATH (apt-get install chromium) for the frontend check")
    zh = json.loads((REPO / "locales" / "zh" / "nodeDefs.json").read_text(encoding="utf-8"))
    assert server.get("/i18n")["zh"]["nodeDefs"][ENGINE] == zh[ENGINE]
    script = Path(__file__).with_name("comfy_frontend_load.py")
    run = subprocess.run([COMFYUI_PYTHON, str(script), server.url, "--locale", "zh", "--screenshots", str(tmp_path),
                          str(EXAMPLES / WORKFLOWS[0])], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = {entry["type"]: entry for entry in json.loads(run.stdout)[WORKFLOWS[0]]["shown"]}
    for node_type in (ENGINE, "H3Generate", "H3Prompt"):
        assert shown[node_type]["title"] == zh[node_type]["display_name"], shown[node_type]
    assert shown[ENGINE]["widgets"] == [zh[ENGINE]["inputs"][key]["name"] for key in
                                        ("mode", "mode_engine_path", "mode_model_dir", "mode_stall_timeout")]
    assert "模型目录 model_dir" in shown[ENGINE]["widgets"]


@pytest.mark.timeout(900)
def test_the_inputs_under_a_choice_show_their_chinese_tooltip(server: Server, tmp_path: Path) -> None:
    """Issue 30: the tooltips of the inputs a mode, preset or length choice shows (mode_model_dir,
    length_unit_seconds) stayed English although the zh file had them: the frontend prefers the
    tooltip the node definition gives such an input, which the pack's extension drops."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        pytest.skip("no chromium on PATH (apt-get install chromium) for the frontend check")
    zh = json.loads((REPO / "locales" / "zh" / "nodeDefs.json").read_text(encoding="utf-8"))
    targets = {f"{ENGINE}:mode.model_dir": zh[ENGINE]["inputs"]["mode_model_dir"]["tooltip"],
               "H3Generate:length_unit.seconds": zh["H3Generate"]["inputs"]["length_unit_seconds"]["tooltip"],
               "H3Generate:preset.steps": zh["H3Generate"]["inputs"]["preset_steps"]["tooltip"]}
    run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_frontend_load.py")), server.url,
                          "--locale", "zh", *(f"--hover={target}" for target in targets), str(EXAMPLES / WORKFLOWS[0])],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = json.loads(run.stdout)[WORKFLOWS[0]]["tooltips"]
    for target, chinese in targets.items():
        assert chinese in shown[target], (target, shown[target])


@pytest.mark.timeout(900)
def test_a_workflow_saved_with_the_old_mode_name_loads_and_runs_as_session(server: Server, tmp_path: Path) -> None:
    """Issue 30: the engine modes are the vocabulary's; "warm session" saved in a workflow (the new
    node's dynamic combo, whose value must be one of its options, and the deprecated node) loads as
    "session" in the real frontend, with that mode's inputs, and runs."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        pytest.skip("no chromium on PATH (apt-get install chromium) for the frontend check")
    saved = json.loads((EXAMPLES / WORKFLOWS[0]).read_text())
    engine = next(node for node in saved["nodes"] if node["type"] == ENGINE)
    assert engine["widgets_values"][0] == "one-shot"
    engine["widgets_values"][0] = "warm session"
    (tmp_path / "saved_warm_session.json").write_text(json.dumps(saved))
    old = json.loads((EXAMPLES / WORKFLOWS[0]).read_text())
    old_engine = next(node for node in old["nodes"] if node["type"] == ENGINE)
    old_engine.update(type="H3Engine", properties={"Node name for S&R": "H3Engine"},
                      widgets_values=["", "MiniMax-H3", "warm session", 600, "", "", True])
    (tmp_path / "saved_warm_session_old_node.json").write_text(json.dumps(old))
    run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_frontend_load.py")), server.url,
                          str(tmp_path / "saved_warm_session.json"), str(tmp_path / "saved_warm_session_old_node.json")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    new = report["saved_warm_session.json"]
    assert {entry["type"]: entry["widgets"] for entry in new["widgets"]}[ENGINE] == [
        "mode", "mode.engine_path", "mode.model_dir", "mode.stall_timeout"]
    new_inputs = next(node["inputs"] for node in new["output"].values() if node["class_type"] == ENGINE)
    assert new_inputs["mode"] == "session" and new_inputs["mode.model_dir"] == "MiniMax-H3"
    old_inputs = next(node["inputs"] for node in report["saved_warm_session_old_node.json"]["output"].values()
                      if node["class_type"] == "H3Engine")
    assert old_inputs["mode"] == "session"
    entry = server.wait(server.queue(new["output"]))          # engine_path empty: the server's H3_BIN (h3-sim)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    # An API prompt saved with the deprecated node and the old name still runs (read as the session).
    api = ui_to_api(old, server.object_info)
    entry = server.wait(server.queue(api))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]


@pytest.mark.timeout(900)
def test_the_frontend_is_told_everything_missing_at_once_before_anything_runs(server: Server, tmp_path: Path) -> None:
    """Issue 30: the Run button on a graph whose engine and model are both missing is refused by
    ComfyUI's input validation (nothing runs), with one message naming both, each with its fix."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        pytest.skip("no chromium on PATH (apt-get install chromium) for the frontend check")
    workflow = json.loads((EXAMPLES / WORKFLOWS[0]).read_text())
    engine = next(node for node in workflow["nodes"] if node["type"] == ENGINE)
    engine["widgets_values"][1:3] = [str(tmp_path / "no-h3"), "NoSuchModel"]
    (tmp_path / "first_run.json").write_text(json.dumps(workflow))
    history = set(server.get("/history"))
    run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_frontend_load.py")), server.url,
                          "--refusal", str(tmp_path / "first_run.json")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    errors = json.loads(run.stdout)["first_run.json"]["node_errors"]
    assert set(errors) == {str(engine["id"])}
    details = {error["details"].split(" - ", 1)[1] for error in errors[str(engine["id"])]["errors"]}
    assert len(details) == 1         # one message, under each of the node's inputs
    message = details.pop()
    assert message.startswith("2 things to fix before this can run:")
    assert "1. engine_path: the h3 engine from" in message and "2. model_dir: model directory 'NoSuchModel'" in message
    assert " model download " in message and "about 196 GiB" in message
    assert set(server.get("/history")) == history          # refused: nothing ran


def _storyboard_workflow(object_info: dict, job_name: str) -> dict:
    """H3 Engine -> H3 Storyboard (two tiny shots, the second anchored on the first) -> its summary."""
    nodes = [dict(id=1, type=ENGINE, pos=[40, 80], size=[380, 160],
                  widgets={"mode": "one-shot", "mode.engine_path": "", "mode.model_dir": "MiniMax-H3"}),
             dict(id=2, type="H3Storyboard", pos=[460, 80], size=[420, 460],
                  widgets={"shots": STORY_SHOTS, "preset": "preview", "width": 64, "height": 32, "seed": 3,
                           "job_name": job_name}),
             dict(id=3, type="PreviewAny", pos=[920, 80], size=[420, 300])]
    return build_ui_workflow(nodes, [(1, 0, 2, "engine"), (2, 3, 3, "source")], object_info)


STORY_SHOTS = "[22f]\nfirst shot\n\n[22f anchor]\nsecond shot"


@pytest.mark.timeout(1200)        # four Runs through a headless browser, each bounded by the driver
def test_storyboard_resumes_when_run_again_from_the_real_frontend(server: Server, tmp_path: Path) -> None:
    """Issue 20 item 1, through ComfyUI's own frontend (headless Chromium, its Run button clicked):
    the frontend gives any INT input named seed "control after generate: randomize", which sent a
    new story seed on every Run and rendered every shot again. Now Run again with nothing changed
    sends the same prompt and renders nothing; an edit renders its shot; undoing the edit renders
    nothing either (the earlier take is still in the job folder). A workflow saved with the old
    control value still loads with its own crossfade and job name."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        pytest.skip("no chromium on PATH (apt-get install chromium) for the frontend check")
    workflow = _storyboard_workflow(server.object_info, "frontend-resume")
    path = tmp_path / "storyboard.json"
    path.write_text(json.dumps(workflow))
    old = json.loads(json.dumps(workflow))          # as saved when the seed had the control widget
    old_node = next(node for node in old["nodes"] if node["type"] == "H3Storyboard")
    # shots, preset, width, height, seed, its control, crossfade_frames, job_name: the eight values
    # saved before the seed lost its control (and before the trailing ssd_streaming and force)
    old_values = old_node["widgets_values"][:7]
    old_values.insert(5, "randomize")
    old_values[-1] = "saved-before"
    old_node["widgets_values"] = old_values
    old_path = tmp_path / "storyboard-saved-before.json"
    old_path.write_text(json.dumps(old))
    edited = STORY_SHOTS.replace("second shot", "second shot, edited")
    run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_frontend_load.py")), server.url,
                          "--screenshots", str(tmp_path / "shots"), "--run", "4",
                          "--edits", json.dumps([{}, {}, {"2": {"shots": edited}}, {"2": {"shots": STORY_SHOTS}}]),
                          str(path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    runs = json.loads(run.stdout)["storyboard.json"]["runs"]
    assert [entry["status"]["status_str"] for entry in runs] == ["success"] * 4
    seeds = [entry["prompt"]["2"]["inputs"]["seed"] for entry in runs]
    assert seeds == [3, 3, 3, 3]                    # the prompt the frontend sent kept the story's seed
    summaries = [entry["outputs"]["3"]["text"][0] for entry in runs]
    cached = [{node for message in entry["status"]["messages"] if message[0] == "execution_cached"
               for node in message[1]["nodes"]} for entry in runs]
    assert "rendered 2, kept 0" in summaries[0]
    assert "2" in cached[1]                         # Run again, nothing changed: the storyboard did not run
    assert "rendered 1, kept 1" in summaries[2]     # the edited shot only
    assert "rendered 0, kept 2" in summaries[3]     # the edit undone: both takes were on disk
    job = server.base / "output" / "h3bridge" / "stories" / "frontend-resume"
    takes = sorted(p.name for p in job.glob("shot-*.mp4") if ".tail" not in p.name)
    assert len(takes) == 3, takes                   # 2 shots + the edited take: four Runs rendered three
    loaded = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_frontend_load.py")), server.url,
                             str(old_path)], capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    inputs = json.loads(loaded.stdout)[old_path.name]["output"]["2"]["inputs"]
    assert (inputs["seed"], inputs["crossfade_frames"], inputs["job_name"]) == (3, 4, "saved-before")
    assert server.object_info["H3Storyboard"]["input"]["required"]["seed"][1]["control_after_generate"] is False


def test_video_references_from_comfy_video_inputs(server: Server) -> None:
    """VIDEO values (core Load Video) as 'video with its audio' and 'video plus replacement audio'."""
    prompt = ui_to_api(json.loads((EXAMPLES / "h3_references.json").read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    prompt["60"] = {"class_type": "LoadVideo", "inputs": {"file": "h3_clip_with_audio.mp4"}}
    prompt["61"] = {"class_type": "LoadVideo", "inputs": {"file": "h3_clip_silent.mp4"}}
    prompt["62"] = {"class_type": "LoadAudio", "inputs": {"audio": "test_music.wav"}}
    prompt["63"] = {"class_type": "H3References", "inputs": {"kind": "video with its audio", "video": ["60", 0]}}
    prompt["64"] = {"class_type": "H3References", "inputs": {"kind": "video plus replacement audio",
                                                            "previous": ["63", 0], "video": ["61", 0],
                                                            "audio": ["62", 0]}}
    prompt[generate_id]["inputs"]["references"] = ["64", 0]
    prompt[generate_id]["inputs"]["prompt"] = "Continue <Video 1> with <Audio 1>, then <Video 2> with <Audio 2>."
    entry = server.wait(server.queue(_with_probes(prompt, generate_id)))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    assert "references: video with its audio, video plus replacement audio" in entry["outputs"]["920"]["text"][0]


def test_reference_video_messages_name_the_users_file_and_the_nodes_options(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / "h3_references.json").read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    prompt["60"] = {"class_type": "LoadVideo", "inputs": {"file": "my short clip.mp4"}}   # 30 frames, with sound
    prompt["63"] = {"class_type": "H3References", "inputs": {"kind": "video with its audio", "video": ["60", 0]}}
    prompt[generate_id]["inputs"]["references"] = ["63", 0]
    entry = server.wait(server.queue(prompt))
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    message = error["exception_message"]
    assert "reference 1 (video with its audio)" in message and "my short clip.mp4" in message, message
    assert "ref-01" not in message and "silent_video" not in message and "kind 'video'" in message


def test_video_with_its_audio_needs_a_soundtrack(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / "h3_references.json").read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    prompt["61"] = {"class_type": "LoadVideo", "inputs": {"file": "h3_clip_silent.mp4"}}
    prompt["63"] = {"class_type": "H3References", "inputs": {"kind": "video with its audio", "video": ["61", 0]}}
    prompt[generate_id]["inputs"]["references"] = ["63", 0]
    entry = server.wait(server.queue(prompt))
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert "has no audio stream" in error["exception_message"] and error["exception_type"] == "Media error"


def test_prompt_and_memory_plan_nodes(server: Server) -> None:
    prompt = {
        "1": {"class_type": ENGINE, "inputs": {"mode": "one-shot", "mode.engine_path": "",
                                              "mode.model_dir": "MiniMax-H3", "mode.stall_timeout": 600}},
        "2": {"class_type": "H3MemoryPlan", "inputs": {
            "engine": ["1", 0], "preset": "quality", "preset.layers": 50, "preset.reuse": 1, "width": 1344,
            "height": 768, "length_unit": "seconds", "length_unit.seconds": 10.0, "core_reuse": 1, "token_reduction": False,
            "int8_row_fc2": False, "ssd_streaming": "auto"}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
        "4": {"class_type": "H3Prompt", "inputs": {"scene": "", "action": "", "camera": "", "look": "", "audio": "",
                                                  "free_text": "  A fox\u00a0runs.  \n\n\n\nSnow.  ", "max_bytes": 0}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
        "6": {"class_type": "H3Prompt", "inputs": {"scene": "a fox", "action": "", "camera": "", "look": "",
                                                  "audio": "wind", "free_text": "", "max_bytes": 0}},
        "7": {"class_type": "PreviewAny", "inputs": {"source": ["6", 0]}},
    }
    entry = server.wait(server.queue(prompt))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    plan = entry["outputs"]["3"]["text"][0]
    assert plan.startswith("1344x768, 243 frames (10.125 s), preset quality")
    assert "fits" in plan and "request: 1344x768, 243 frames" in plan
    # One line each: a warm session takes H3 Prompt's output as it is.
    assert entry["outputs"]["5"]["text"][0] == "A fox runs. Snow."
    assert entry["outputs"]["7"]["text"][0] == "Scene: a fox Audio: wind"


def test_progress_reaches_the_generate_nodes_bar(server: Server, tmp_path: Path) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    prompt[generate_id]["inputs"]["seed"] = 31337      # not cached
    path = tmp_path / "prompt.json"
    path.write_text(json.dumps(prompt))
    run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_ws_progress.py")), server.url, str(path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["status"] == "execution_success"
    bar = [(value, maximum) for node, value, maximum in report["progress"] if node == generate_id]
    values = [value for value, _ in bar]
    assert {maximum for _, maximum in bar} == {1000}
    assert values == sorted(values) and values[-1] == 1000      # overall fraction, never backwards
    assert len(set(values)) >= 3                                 # moves through the phases


def test_unconnected_image_output_is_not_decoded(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    prompt[_generate_id(prompt)]["inputs"]["seed"] = 4242        # not a cached result
    entry = server.wait(server.queue(prompt))
    assert entry["status"]["status_str"] == "success"
    summary_node = next(i for i, n in prompt.items() if n["class_type"] == "PreviewAny")
    assert "IMAGE output not connected" in entry["outputs"][summary_node]["text"][0]


def test_connecting_image_later_reruns_instead_of_reusing_the_placeholder(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    prompt[generate_id]["inputs"]["seed"] = 99
    first = server.wait(server.queue(prompt))
    assert first["status"]["status_str"] == "success"
    # Same inputs, IMAGE now connected: ComfyUI would serve the cached placeholder unless the
    # node's fingerprint changes with the connection.
    second = server.wait(server.queue(_with_probes(prompt, generate_id)))
    assert second["status"]["status_str"] == "success"
    frames = int(prompt[generate_id]["inputs"]["length_unit.seconds"] * 24)
    batch = int(second["outputs"]["903"]["text"][0])
    assert batch > 1 and batch >= frames


def test_library_errors_reach_the_user_with_the_librarys_message(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[1]).read_text()), server.object_info)
    # Ref2VA references together with first/last-frame anchors: valid for ComfyUI, refused by
    # the library (h3.c h3_valid_params: "full references cannot be combined with frame anchors").
    generate_id = _generate_id(prompt)
    prompt["50"] = {"class_type": "LoadImage", "inputs": {"image": "test_picture.png"}}
    prompt["51"] = {"class_type": "H3References", "inputs": {"kind": "image", "image": ["50", 0]}}
    prompt[generate_id]["inputs"]["references"] = ["51", 0]
    entry = server.wait(server.queue(prompt))
    assert entry["status"]["status_str"] == "error"
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert error["node_type"] == "H3Generate"
    assert "cannot be combined" in error["exception_message"]
    assert error["exception_type"] == "Request error"
    assert not any("adapter.py" in line for line in error["traceback"])


def test_engine_failures_show_hs_own_message(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    _set_engine(server, prompt, engine_path=str(server.failing_engine))
    prompt[_generate_id(prompt)]["inputs"]["seed"] = 555
    entry = server.wait(server.queue(prompt))
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert error["exception_type"] == "Engine error"
    assert "Metal command buffer failed: out of memory" in error["exception_message"]
    assert list((server.base / "temp" / "h3bridge").rglob("*.partial.mp4")) == []


def _engine_refusal(server: Server, prompt: dict, engine_id: str) -> str:
    """The Run refused by ComfyUI's input validation (nothing ran, no engine started): H3 Engine's
    one message. ComfyUI files it under each input its validate_inputs takes (all of them: a
    dynamic combo's values reach only such a function), so it is one text, repeated."""
    history = set(server.get("/history"))
    errors = _queue_errors(server, prompt)
    assert set(errors) == {engine_id}, errors
    reports = errors[engine_id]["errors"]
    assert {report["type"] for report in reports} == {"custom_validation_failed"}
    assert "mode" in {report["extra_info"]["input_name"] for report in reports}
    messages = {report["details"].split(" - ", 1)[1] for report in reports}
    assert len(messages) == 1, messages
    assert set(server.get("/history")) == history and server.engine_processes() == []
    return messages.pop()


def test_a_missing_model_is_one_report_under_h3_engine_before_any_engine_runs(server: Server) -> None:
    """Issue 30: refused when queued (ComfyUI's input validation), not when H3 Engine runs."""
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    engine_id = _set_engine(server, prompt, model_dir="NoSuchModel")
    message = _engine_refusal(server, prompt, engine_id)
    assert message.startswith("model_dir: model directory 'NoSuchModel' was not found")
    assert "models/h3" in message and " model download " in message


def test_bad_engine_settings_are_refused_when_queued(server: Server) -> None:
    """The deprecated all-modes node (workflows saved with it) is checked as the new one is."""
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    engine_id = _old_engine(prompt, model_dir="NoSuchModel")
    message = _engine_refusal(server, prompt, engine_id)
    # one problem, one message, led by the input it is about (the pack's extension outlines it)
    assert message.startswith("model_dir: model directory 'NoSuchModel' was not found") and "models/h3" in message


def test_a_missing_engine_is_reported_once_before_anything_runs(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    engine_id = _set_engine(server, prompt, engine_path=str(server.base / "no-such-h3"))
    message = _engine_refusal(server, prompt, engine_id)
    assert message.startswith("engine_path: the h3 engine from") and "no-such-h3" in message.split("\n")[0]


def test_one_bad_hex_grid_setting_is_one_report_in_one_sentence(server: Server) -> None:
    """Issue 20 item 5: a resolution too fine for the frame was reported four times (once per input
    the queue check took), and the error panel led with the exception's module path."""
    prompt = {"1": {"class_type": "H3HexGrid", "inputs": {"width": 1344, "height": 768, "resolution": 3,
                                                          "overlap": 2}},
              "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 1]}}}
    request = urllib.request.Request(server.url + "/prompt", data=json.dumps({"prompt": prompt}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            prompt_id = json.load(response)["prompt_id"]
    except urllib.error.HTTPError as error:
        reports = json.loads(error.read())["node_errors"]["1"]["errors"]
        raise AssertionError(f"refused with {len(reports)} reports: {reports}") from None
    entry = server.wait(prompt_id)
    errors = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert len(errors) == 1 and errors[0]["node_type"] == "H3HexGrid"
    # The panel shows "<exception_type>: <exception_message>": one sentence, then the fix.
    shown = f"{errors[0]['exception_type']}: {errors[0]['exception_message']}"
    assert shown.startswith("Request error: resolution 3 gives cells about"), shown
    assert "fix: use resolution 0..2 for 1344x768" in shown and "/" not in errors[0]["exception_type"]


def test_bad_generate_settings_are_reported_once_before_the_engine_starts(server: Server) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[1]).read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    prompt[generate_id]["inputs"].update(width=1344, height=1344)
    prompt[generate_id]["inputs"]["seed"] = 8128
    entry = server.wait(server.queue(prompt))
    # A rule over several inputs (the pixel cap): one error, not one per input it concerns.
    errors = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert len(errors) == 1 and errors[0]["node_type"] == "H3Generate"
    assert errors[0]["exception_type"] == "Request error"
    assert "1344x1344" in errors[0]["exception_message"] and "fix:" in errors[0]["exception_message"]
    assert server.engine_processes() == []


def _queue_errors(server: Server, prompt: dict) -> dict:
    request = urllib.request.Request(server.url + "/prompt", data=json.dumps({"prompt": prompt}).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    return json.loads(info.value.read())["node_errors"]


def test_comfyuis_own_range_and_option_checks_still_apply(server: Server) -> None:
    """H3 Generate has no validate_inputs, so ComfyUI keeps checking its inputs; H3 Engine checks its own."""
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[1]).read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    prompt[generate_id]["inputs"].update({"ssd_streaming": "bogus", "preset.layers": 99})
    _set_engine(server, prompt, stall_timeout=-5)
    errors = _queue_errors(server, prompt)
    kinds = {(error["type"], error["extra_info"]["input_name"]) for node in errors.values() for error in node["errors"]}
    assert {("value_not_in_list", "ssd_streaming"), ("value_bigger_than_max", "preset.layers")} <= kinds
    # H3 Engine's validate_inputs takes every input (a dynamic combo's values reach it only so), so
    # ComfyUI leaves stall_timeout's range to it: reported by the node, with the range (issue 30).
    engine = errors[_engine_id(prompt)]["errors"]
    assert any(error["extra_info"]["input_name"] == "mode.stall_timeout"
               and "stall_timeout: -5 is outside 0..86400 seconds" in error["details"] for error in engine)


# ----------------------------------------------------------------------------- interrupt

@pytest.mark.parametrize("mode", ["one-shot", "session"])
def test_interrupt_stops_the_engine(server: Server, mode: str) -> None:
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    _set_engine(server, prompt, engine_path=str(server.hanging_engine), mode=mode)
    generate_id = _generate_id(prompt)
    prompt[generate_id]["inputs"]["seed"] = 777
    prompt[generate_id]["inputs"]["prompt"] = "A red fox walks through fresh snow."   # one line: the session takes it
    server.hang_notice.unlink(missing_ok=True)
    prompt_id = server.queue(prompt)
    engines = server.wait_for_silent_engine()      # mid-denoise, and it stays there until stopped
    assert engines and all(p.is_running() for p in engines)
    server.post("/interrupt", {})
    entry = server.wait(prompt_id, timeout=30)
    gone, alive = psutil.wait_procs(engines, timeout=5)
    assert not alive, f"engine still running: {alive}"
    assert entry["status"]["status_str"] == "error"
    assert any(m[0] == "execution_interrupted" for m in entry["status"]["messages"])
    leftovers = list((server.base / "temp" / "h3bridge").rglob("*.partial.mp4"))
    assert leftovers == []


# ----------------------------------------------------------------------------- warm session

def test_warm_session_mode_renders_and_falls_back_for_multiline_prompts(server: Server, tmp_path: Path) -> None:
    workflow = json.loads((EXAMPLES / WORKFLOWS[0]).read_text())
    prompt = ui_to_api(workflow, server.object_info)
    generate_id = _generate_id(prompt)
    summary_id = next(i for i, n in prompt.items() if n["class_type"] == "PreviewAny")
    _set_engine(server, prompt, mode="session")
    # The pack's own example (H3 Prompt's output) goes warm, twice with one process.
    summaries = []
    for seed in (5, 6):
        prompt[generate_id]["inputs"]["seed"] = seed
        entry = server.wait(server.queue(prompt))
        assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
        summaries.append(entry["outputs"][summary_id]["text"][0])
    assert all(text.startswith("engine: session engine") for text in summaries)
    assert "seed: 5" in summaries[0] and "seed: 6" in summaries[1]
    assert not any("ran one-shot" in text for text in summaries)
    # A prompt typed on several lines cannot go warm: it runs one-shot and the node says so on itself.
    typed = json.loads(json.dumps(prompt))
    typed[generate_id]["inputs"]["prompt"] = "Scene: a red fox in snow.\nAudio: wind."
    typed[generate_id]["inputs"]["seed"] = 7
    del typed[summary_id]
    typed["920"] = {"class_type": "PreviewAny", "inputs": {"source": [generate_id, 3]}}
    path = tmp_path / "prompt.json"
    path.write_text(json.dumps(typed))
    run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_ws_progress.py")), server.url, str(path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["status"] == "execution_success"
    shown = [text for node, text in report["texts"] if node == generate_id]
    assert shown and shown[-1].startswith("WARNING: not run in session mode: the prompt has several lines")
    assert "put the prompt on one line" in shown[-1]
    summary = server.get(f"/history/{report['prompt_id']}")[report["prompt_id"]]["outputs"]["920"]["text"][0]
    assert summary.startswith("engine: one-shot engine") and "ran one-shot instead" in summary


def test_generate_node_shows_the_values_it_will_use(server: Server, tmp_path: Path) -> None:
    """...and, once the shape has run on this machine (the first of these two runs at the
    latest), the ETA from those runs under them."""
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    balanced = PRESETS["balanced"]
    for seed in (6061, 6062):
        prompt[generate_id]["inputs"]["seed"] = seed
        path = tmp_path / "prompt.json"
        path.write_text(json.dumps(prompt))
        run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_ws_progress.py")), server.url,
                              str(path)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        report = json.loads(run.stdout)
        shown = [text for node, text in report["texts"] if node == generate_id]
        notice = (f"one-shot: 864x480, 107 frames (4.458 s), {balanced.steps} steps, {balanced.layers} layers, "
                  f"reuse {balanced.reuse}, SSD streaming off, seed {seed}")
        assert shown[0] == notice
        assert all(text.startswith(notice + "\nETA ") and text.endswith(" (from past runs of this shape on this "
                                                                          "machine)") for text in shown[1:]), shown
    assert len(shown) >= 2       # the second run: the first one is a past run of its shape


# ----------------------------------------------------------------------------- termination

def test_scratch_inputs_are_removed_when_the_server_is_terminated_mid_render(tmp_path: Path) -> None:
    """SIGTERM (systemd, `kill`) while a first/last-frame job renders: the job's scratch inputs go too,
    and the server still dies of the signal."""
    started, log = _start_server(tmp_path / "base")
    engines: list[psutil.Process] = []
    try:
        prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[1]).read_text()), started.object_info)
        _set_engine(started, prompt, engine_path=str(started.hanging_engine))
        started.queue(prompt)
        engines = started.wait_for_silent_engine()
        assert engines, "the engine never started"
        inputs = started.base / "temp" / "h3bridge" / "inputs"
        assert sorted(p.name for p in inputs.rglob("*.png")) == ["first-frame.png", "last-frame.png"]
        groups = {os.getpgid(engine.pid) for engine in engines}
        assert groups and started.process.pid not in groups       # own group: SIGTERM to the server misses it
        started.process.send_signal(signal.SIGTERM)          # the server only, as systemd stops it
        assert started.process.wait(60) == -signal.SIGTERM
        assert list(inputs.rglob("*")) == []
        # The engine runs in its own process group, so the server's death alone would leave it
        # rendering (holding the model in memory): the pack's handler stops it first.
        for group in groups:
            assert_group_gone(group)
    finally:
        if started.process.poll() is None:
            os.killpg(started.process.pid, signal.SIGKILL)
            started.process.wait()
        log.close()
        # Should the handler have failed, the orphan is not left to the next test.
        for engine in engines:
            try:
                os.killpg(engine.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_the_lora_node_is_listed_with_the_other_h3_nodes_and_every_input_has_a_tooltip(server: Server) -> None:
    info = server.object_info["H3Lora"]
    assert info["display_name"] == "H3 LoRA" and info["category"] == server.object_info["H3Generate"]["category"]
    assert info["output"] == ["STRING", "STRING"]         # the folded model's folder (for H3 Engine's model_dir), the report
    required = info["input"]["required"]
    assert set(required) == {"model_dir", "lora", "strength"}
    assert all(len(spec) > 1 and spec[1].get("tooltip") for spec in required.values())


def test_h3_lora_feeds_h3_engine_a_folded_model_and_requeuing_folds_nothing(server: Server) -> None:
    """H3 LoRA -> H3 Engine -> H3 Generate in the real server: the clip renders from the folded
    model (kept beside the base, by content); queued again with another seed, nothing is folded."""
    from lora_helpers import low_rank, tensor_shapes, write_lora
    base = server.base / "models" / "h3" / "MiniMax-H3"
    out, inner = tensor_shapes(base)["blocks.0.attn.qkv_proj.weight"][2]
    up, down = low_rank(np.random.default_rng(0), out, inner, 2)
    (server.base / "models" / "loras").mkdir(parents=True, exist_ok=True)
    write_lora(server.base / "models" / "loras" / "h3-turbo.safetensors",
               {"diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight": down,
                "diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight": up})
    prompt = ui_to_api(json.loads((EXAMPLES / "h3_text_to_video_audio.json").read_text()), server.object_info)
    engine_id = _engine_id(prompt)
    prompt["80"] = {"class_type": "H3Lora", "inputs": {"model_dir": prompt[engine_id]["inputs"]["mode.model_dir"],
                                                      "lora": "h3-turbo.safetensors", "strength": 1.0}}
    prompt[engine_id]["inputs"]["mode.model_dir"] = ["80", 0]
    entry = server.wait(server.queue(prompt), timeout=300)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    [folded] = (base.parent / ".h3bridge-lora").iterdir()
    record = json.loads((folded / "h3bridge-lora.json").read_text())
    assert record["loras"][0]["name"] == "h3-turbo.safetensors" and Path(record["base_path"]) == base.resolve()
    stamp = (folded / "h3bridge-lora.json").stat().st_mtime_ns
    generate_id = _generate_id(prompt)
    prompt[generate_id]["inputs"]["seed"] = prompt[generate_id]["inputs"].get("seed", 0) + 1
    entry = server.wait(server.queue(prompt), timeout=300)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    assert [p.name for p in (base.parent / ".h3bridge-lora").iterdir()] == [folded.name]
    assert (folded / "h3bridge-lora.json").stat().st_mtime_ns == stamp


# ----------------------------------------------------------------------------- library mode (libh3)

def test_library_mode_shows_denoise_previews_over_the_websocket(server: Server, tmp_path: Path) -> None:
    """H3 Engine in library mode (the libh3 double here; libh3.dylib on a Mac): H3 Generate's
    previews reach the frontend while it samples, as KSampler's do, and the frames are exact."""
    from double_helpers import double_library_path

    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    generate_id = _generate_id(prompt)
    _set_engine(server, prompt, mode="library", library_path=str(double_library_path()), previews=True)
    inputs = prompt[generate_id]["inputs"]
    inputs.update(seed=4242, width=96, height=64)
    steps = next(value for key, value in inputs.items() if key.endswith("steps") and isinstance(value, int))
    path = tmp_path / "prompt.json"
    path.write_text(json.dumps(_with_probes(prompt, generate_id)))
    run = subprocess.run([COMFYUI_PYTHON, str(Path(__file__).with_name("comfy_ws_progress.py")), server.url, str(path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["status"] == "execution_success", (server.base / "comfyui.log").read_text(errors="replace")[-3000:]
    previews = [(value, size) for node, value, size in report["previews"] if node == generate_id]
    assert len(previews) >= steps and all(size > 0 for _, size in previews)
    assert all(value is not None and value < 1000 for value, _ in previews)     # while sampling, before the end
    outputs = server.get(f"/history/{report['prompt_id']}")[report["prompt_id"]]["outputs"]
    summary = outputs["920"]["text"][0]
    assert summary.startswith("engine: library engine")
    assert [outputs[f"90{slot}"]["text"][0] for slot in (1, 2)] == ["96", "64"]


def test_a_library_of_the_wrong_kind_is_one_sentence_on_the_node(server: Server, tmp_path: Path) -> None:
    """A static libh3.a given as library_path: the H3 Engine node is refused with one sentence and
    the fix (link a shared library), before anything runs."""
    archive = tmp_path / "libh3.a"
    archive.write_bytes(b"!<arch>\n" + b"\0" * 60)
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    engine_id = _set_engine(server, prompt, mode="library", library_path=str(archive))
    message = _engine_refusal(server, prompt, engine_id)       # refused when queued (issue 30)
    first, *rest = message.split("\n")
    assert first.startswith("library_path: ") and "static archive" in first and str(archive) in first
    assert rest and "build-engine" in rest[0]
