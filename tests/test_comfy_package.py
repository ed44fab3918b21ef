"""The node pack as shipped: entry point, metadata, example workflows, import without side effects."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "example_workflows").glob("*.json"))


def test_requirements_txt_matches_the_package_dependencies() -> None:
    tomllib = pytest.importorskip("tomllib")     # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = [line.strip() for line in (REPO / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    assert listed == project["project"]["dependencies"]
    comfy = project["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"] and "requires-comfyui" in comfy


def test_root_init_exports_the_entrypoint_only_inside_comfyui() -> None:
    source = (REPO / "__init__.py").read_text()
    assert "from .h3bridge.comfy.nodes import comfy_entrypoint" in source   # relative: loaded as custom_nodes/<dir>
    assert 'find_spec("comfy_api")' in source


def test_frontend_extension_is_served_from_web_directory() -> None:
    """ComfyUI serves WEB_DIRECTORY's .js files to its frontend (nodes.py load_custom_node): H3
    Prompt's box labels live there."""
    import re
    source = (REPO / "__init__.py").read_text()
    folder = REPO / re.search(r'WEB_DIRECTORY = "([^"]+)"', source).group(1)
    script = (folder / "h3_prompt_labels.js").read_text()
    assert "H3Prompt" in script and all(f'"{name}"' in script for name in ("scene", "action", "camera", "look", "audio"))


def test_adapter_import_pulls_in_no_comfy_or_torch_and_starts_nothing() -> None:
    code = ("import sys, threading, psutil, h3bridge.comfy.adapter, h3bridge.media.references, h3bridge.prompt; "
            "bad = [m for m in ('torch', 'comfy', 'comfy_api', 'folder_paths') if m in sys.modules]; "
            "print(bad, psutil.Process().children(), threading.active_count())")
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert output.strip() == "[] [] 1"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_workflows_are_consistent_ui_graphs(path: Path) -> None:
    workflow = json.loads(path.read_text())
    nodes = {node["id"]: node for node in workflow["nodes"]}
    assert workflow["last_node_id"] == max(nodes) and workflow["last_link_id"] == len(workflow["links"])
    types = [node["type"] for node in nodes.values()]
    assert "H3EngineV2" in types and "H3Generate" in types and "SaveVideo" in types     # H3 Engine, by mode
    for link_id, from_id, from_slot, to_id, to_slot, link_type in workflow["links"]:
        source, target = nodes[from_id], nodes[to_id]
        assert link_id in (source["outputs"][from_slot]["links"] or [])
        assert target["inputs"][to_slot]["link"] == link_id
        assert source["outputs"][from_slot]["type"] == link_type
    generate = next(node for node in nodes.values() if node["type"] == "H3Generate")
    # VIDEO feeds Save Video; the frames output (slot 1) is left for the user to connect.
    assert generate["outputs"][0]["links"] and not generate["outputs"][1]["links"]
    assert [o["type"] for o in generate["outputs"]] == ["VIDEO", "IMAGE", "AUDIO", "STRING"]


# Nodes that read a file the user put in ComfyUI/input: an example using one does not run as shipped
# (a node pack cannot ship files into ComfyUI/input).
FILE_INPUT_NODES = {"LoadImage", "LoadImageMask", "LoadAudio", "LoadVideo"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_workflows_run_as_shipped_and_have_a_thumbnail(path: Path) -> None:
    workflow = json.loads(path.read_text())
    assert not FILE_INPUT_NODES & {node["type"] for node in workflow["nodes"]}
    # ComfyUI's template browser shows example_workflows/NAME.jpg beside NAME.json (custom-node
    # templates are listed as mediaType image, mediaSubtype jpg).
    thumbnail = path.with_suffix(".jpg")
    assert thumbnail.is_file() and thumbnail.read_bytes()[:3] == b"\xff\xd8\xff"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_prompts_are_one_line_so_a_warm_session_takes_them(path: Path) -> None:
    from h3bridge.engines.session import session_prompt
    for node in json.loads(path.read_text())["nodes"]:
        if node["type"] == "H3Generate" and node["widgets_values"][0]:
            prompt = node["widgets_values"][0]           # the prompt widget comes first
            assert session_prompt(prompt) == prompt
            # The preset shows its own values (dynamic combo): name, steps, layers, reuse.
            assert node["widgets_values"][1] in ("preview", "balanced", "quality", "reference")
            assert all(isinstance(v, int) and v > 0 for v in node["widgets_values"][2:5])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_nothing_sits_below_save_video_where_its_preview_grows(path: Path) -> None:
    nodes = json.loads(path.read_text())["nodes"]
    for save in (node for node in nodes if node["type"] == "SaveVideo"):
        (x, y), (width, _height) = save["pos"], save["size"]
        for node in nodes:
            if node is save:
                continue
            (nx, ny), (nwidth, nheight) = node["pos"], node["size"]
            beside = nx >= x + width or nx + nwidth <= x
            above = ny + nheight <= y
            assert beside or above, f"{node['type']} is under Save Video"


def _module_imports(package: Path, name: str) -> set[str]:
    """The modules of h3bridge.comfy that module `name` imports, anywhere in it (a function-level
    import closes a cycle as surely as a top-level one, only later)."""
    import ast
    tree = ast.parse((package / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("h3bridge.comfy."):
            found.add(node.module.split(".")[2])
    return {module for module in found if (package / f"{module}.py").is_file()}


def test_the_node_modules_import_each_other_in_no_cycle() -> None:
    """Issue 20 item 9: nodes.py imported the hex / LoRA / story node modules, which imported nodes.py
    back; what they share lives below all of them (shared.py)."""
    package = REPO / "h3bridge" / "comfy"
    graph = {path.stem: _module_imports(package, path.stem) for path in package.glob("*.py")
             if path.stem != "__init__"}
    assert graph["nodes"] >= {"hex_nodes", "lora_nodes", "story_nodes"}       # the graph is really read
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in path:
                cycles.append(path[path.index(imported):] + [imported])
            elif imported not in done:
                visit(imported, path + [imported])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        visit(module, [module])
    assert not cycles, f"import cycles in h3bridge.comfy: {cycles}"


def test_the_engine_mode_extension_renames_old_modes_and_reads_validation_messages(tmp_path: Path) -> None:
    """web/h3_engine_mode.js's pure parts, run by Node with ComfyUI's app/api stubbed (the real
    frontend runs it in test_comfy_integration.py): a saved "warm session" becomes "session" at
    the mode's place only; each validation message is kept once, with the inputs it leads with."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH for the extension's unit check")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text("export const app = { registerExtension() {} };\n")
    (tmp_path / "scripts" / "api.js").write_text("export const api = {};\n")
    (tmp_path / "ext" / "h3bridge").mkdir(parents=True)
    script = tmp_path / "ext" / "h3bridge" / "h3_engine_mode.js"
    script.write_text((REPO / "h3bridge" / "comfy" / "web" / "h3_engine_mode.js").read_text())
    check = """
import { renameOldEngineModes, validationMessages, namedInputs } from %s;
const graph = { nodes: [
  { type: "H3EngineV2", widgets_values: ["warm session", "", "MiniMax-H3", 600] },
  { type: "H3Engine", widgets_values: ["", "cli", "warm session", 600, "", "", true] },
  { type: "H3Generate", widgets_values: ["warm session"] } ] };
const renamed = renameOldEngineModes(graph);
const errors = { errors: [
  { details: "mode - 2 things to fix before this can run:\\n1. engine_path: no h3\\n2. model_dir: no model" },
  { details: "mode.engine_path - 2 things to fix before this can run:\\n1. engine_path: no h3\\n2. model_dir: no model" } ] };
const messages = validationMessages(errors);
console.log(JSON.stringify({ renamed, values: graph.nodes.map(n => n.widgets_values), messages,
                             names: [...namedInputs(messages)] }));
""" % json.dumps(script.as_uri())
    run = subprocess.run([node, "--input-type=module", "-e", check], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["renamed"] == ["warm session -> session", "warm session -> session"]
    assert result["values"] == [["session", "", "MiniMax-H3", 600], ["", "cli", "session", 600, "", "", True],
                                ["warm session"]]
    assert result["messages"] == ["2 things to fix before this can run:\n1. engine_path: no h3\n2. model_dir: no model"]
    assert result["names"] == ["engine_path", "model_dir"]
