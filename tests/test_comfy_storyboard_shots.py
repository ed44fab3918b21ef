"""H3 Storyboard's shots box on a new node (web/h3_storyboard_shots.js, issue 30): the frontend sized
a new node to its widgets' minimum, which left the multiline shots box about one line. The extension
makes a new node taller (the shots box takes it); a node loaded from a workflow keeps its saved size
(the frontend applies it after nodeCreated). Run under Node.js with a stand-in for ComfyUI's app
module; checked in the real frontend with the ComfyUI bed (the box went from 42 px to 162 px)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

WEB = Path(__file__).resolve().parents[1] / "h3bridge" / "comfy" / "web"

APP_STAND_IN = "export const app = { extensions: [], registerExtension(e) { this.extensions.push(e); } };\n"
DRIVER = """
import { app } from "./scripts/app.js";
import { EXTRA_HEIGHT } from "./extensions/h3bridge/h3_storyboard_shots.js";
const made = (comfyClass) => ({ comfyClass, size: new Float32Array([400, 340]),
                                setSize(s) { this.size = new Float32Array(s); } });
const [extension] = app.extensions;
const storyboard = made("H3Storyboard"), other = made("CLIPTextEncode");
extension.nodeCreated(storyboard);
extension.nodeCreated(other);
extension.nodeCreated(null);
console.log(JSON.stringify({ name: extension.name, extra: EXTRA_HEIGHT,
                             storyboard: Array.from(storyboard.size), other: Array.from(other.size) }));
"""


def test_a_new_storyboard_node_is_made_taller_for_its_shots_box(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(APP_STAND_IN)
    (tmp_path / "extensions" / "h3bridge").mkdir(parents=True)
    shutil.copy(WEB / "h3_storyboard_shots.js", tmp_path / "extensions" / "h3bridge")
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "driver.js").write_text(DRIVER)
    done = subprocess.run([node, str(tmp_path / "driver.js")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["name"] == "h3bridge.storyboardShots" and seen["extra"] >= 100
    assert seen["storyboard"] == [400, 340 + seen["extra"]]
    assert seen["other"] == [400, 340]                  # every other node as the frontend made it
