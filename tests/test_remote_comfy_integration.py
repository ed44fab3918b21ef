"""The H3 Engine node's remote mode in a real ComfyUI, rendering on a real `h3bridge serve`: the
shipped example workflow runs with mode=remote, the clip is made by the server (ComfyUI starts no
engine), and the API key, which both processes hold in H3BRIDGE_API_KEY, appears nowhere ComfyUI
keeps or writes a workflow: not in the prompt it stores, not in the workflow the frontend sends
with it (extra_pnginfo), not in the saved MP4's metadata, not in any file under its folders.

    COMFYUI_DIR=/tmp/comfy-bed/ComfyUI COMFYUI_PYTHON=/tmp/comfy-bed/venv/bin/python \\
        python -m pytest tests/test_remote_comfy_integration.py

ComfyUI's Python needs h3bridge's requirements (httpx, for the remote mode)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from comfy_workflows import ui_to_api
from remote_helpers import KEY, get, start_server
from test_comfy_integration import (COMFYUI_PYTHON, ENGINE, EXAMPLES, WORKFLOWS, Server, _output_file,
                                   _start_server)

pytestmark = pytest.mark.comfyui


@pytest.fixture(scope="module")
def comfy(tmp_path_factory: pytest.TempPathFactory) -> Server:
    probe = subprocess.run([COMFYUI_PYTHON, "-c", "import httpx"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("ComfyUI's Python lacks httpx (h3bridge's requirements.txt): install it there to test remote mode")
    saved = os.environ.get("H3BRIDGE_API_KEY")
    os.environ["H3BRIDGE_API_KEY"] = KEY          # ComfyUI's environment holds the key, as a user's would
    try:
        started, log = _start_server(tmp_path_factory.mktemp("comfy-remote"))
    finally:
        if saved is None:
            os.environ.pop("H3BRIDGE_API_KEY", None)
        else:
            os.environ["H3BRIDGE_API_KEY"] = saved
    yield started
    os.killpg(started.process.pid, signal.SIGTERM)
    try:
        started.process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(started.process.pid, signal.SIGKILL)
        started.process.wait()
    log.close()


@pytest.fixture(scope="module")
def h3_server(tmp_path_factory: pytest.TempPathFactory, comfy: Server):
    running = start_server(tmp_path_factory.mktemp("serve-for-comfy"),
                           comfy.base / "models" / "h3" / "MiniMax-H3")
    yield running
    running.stop()


def test_remote_mode_renders_on_the_server_and_never_stores_the_key(comfy: Server, h3_server) -> None:
    workflow = json.loads((EXAMPLES / WORKFLOWS[0]).read_text())
    engine = next(node for node in workflow["nodes"] if node["type"] == ENGINE)
    # H3 Engine switched to remote shows (and saves) only the server's URL: no model folder to clear.
    engine["widgets_values"] = ["remote", h3_server.url]
    prompt = ui_to_api(workflow, comfy.object_info)
    engine_inputs = next(node["inputs"] for node in prompt.values() if node["class_type"] == ENGINE)
    assert engine_inputs == {"mode": "remote", "mode.remote_url": h3_server.url}
    # As the frontend queues it: the prompt, and the workflow for the saved files' metadata.
    prompt_id = comfy.post("/prompt", {"prompt": prompt, "extra_data": {"extra_pnginfo": {"workflow": workflow}}})[
        "prompt_id"]
    entry = comfy.wait(prompt_id)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]

    # The server rendered it; ComfyUI ran no engine of its own.
    jobs = get(h3_server, "/v1/videos").json()["data"]
    assert [job["status"] for job in jobs] == ["completed"]
    assert comfy.engine_processes() == []
    save_id = next(i for i, node in prompt.items() if node["class_type"] == "SaveVideo")
    saved = _output_file(comfy, entry["outputs"][save_id]["images"][0])
    assert saved.stat().st_size > 0

    # The key is nowhere ComfyUI keeps a workflow or writes a file.
    assert KEY not in json.dumps(entry) and KEY not in json.dumps(comfy.get(f"/history/{prompt_id}"))
    assert h3_server.url in saved.read_bytes().decode("latin-1")       # the workflow is in the MP4's metadata ...
    assert KEY.encode() not in saved.read_bytes()                       # ... and the key is not
    holding = [path for path in Path(comfy.base).rglob("*") if path.is_file() and path.stat().st_size < 50 << 20
               and KEY.encode() in path.read_bytes()]
    assert holding == []
