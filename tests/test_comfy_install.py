"""The node pack as the Comfy registry and a ComfyUI install get it (issue 24 item 4): registry
metadata (classifiers, icon, publish workflow), and a clean environment that ran only
`pip install -r requirements.txt` loading the pack and running the README's simulator commands."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")     # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The Comfy registry's accelerator classifiers: comfy-cli registry/config_parser.py
# (validate_and_extract_accelerator_classifiers) takes these and drops every accelerator if one
# is not among them; they are the registry's own, not PyPI trove classifiers.
REGISTRY_ACCELERATORS = {"Environment :: GPU :: NVIDIA CUDA", "Environment :: GPU :: AMD ROCm",
                         "Environment :: GPU :: Intel Arc", "Environment :: NPU :: Huawei Ascend",
                         "Environment :: GPU :: Apple Metal"}


def test_classifiers_say_macos_and_apple_metal_in_valid_strings() -> None:
    trove = pytest.importorskip("trove_classifiers", reason="pip install trove-classifiers (the test extra)")
    classifiers = PYPROJECT["project"]["classifiers"]
    assert "Operating System :: MacOS" in classifiers and "Environment :: GPU :: Apple Metal" in classifiers
    for classifier in classifiers:
        if classifier.startswith("Environment :: "):        # what the registry reads as accelerators
            assert classifier in REGISTRY_ACCELERATORS, classifier
        else:
            assert classifier in trove.classifiers, classifier


def test_the_registrys_own_parser_reads_our_os_and_accelerator() -> None:
    """Against comfy-cli's code itself when it is installed (pip install comfy-cli)."""
    parser = pytest.importorskip("comfy_cli.registry.config_parser", reason="comfy-cli is not installed")
    config = parser.extract_node_configuration(str(REPO / "pyproject.toml"))
    assert config.project.supported_os == ["MacOS"]
    assert config.project.supported_accelerators == ["GPU :: Apple Metal"]
    assert config.tool_comfy.icon == PYPROJECT["tool"]["comfy"]["Icon"]


def test_the_icon_is_a_url_to_our_small_svg_in_this_repository() -> None:
    """The registry takes Icon as a URL (SVG, PNG, JPG or GIF, at most 800 x 400 px)."""
    icon = PYPROJECT["tool"]["comfy"]["Icon"]
    repository = PYPROJECT["project"]["urls"]["Repository"]
    owner_repo = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)", repository)[1]
    match = re.fullmatch(rf"https://raw\.githubusercontent\.com/{re.escape(owner_repo)}/main/(.+)", icon)
    assert match, icon
    path = REPO / match[1]
    assert path.suffix == ".svg" and path.is_file()
    svg = ElementTree.parse(path).getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert 0 < float(svg.get("width")) <= 800 and 0 < float(svg.get("height")) <= 400


def test_the_registry_publish_workflow_runs_comfys_action_when_pyproject_changes() -> None:
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "publish.yml").read_text())
    triggers = workflow[True]          # YAML 1.1 reads the key `on` as true
    assert "workflow_dispatch" in triggers and triggers["push"]["paths"] == ["pyproject.toml"]
    assert triggers["push"]["branches"] == ["main"]
    steps = workflow["jobs"]["publish-node"]["steps"]
    publish = next(step for step in steps if step.get("uses", "").startswith("Comfy-Org/publish-node-action@"))
    assert publish["with"]["personal_access_token"] == "${{ secrets.REGISTRY_ACCESS_TOKEN }}"
    assert any(step.get("uses", "").startswith("actions/checkout@") for step in steps)


# ----------------------------------------------------------------------------- a ComfyUI install

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
COMFYUI_PYTHON = os.environ.get("COMFYUI_PYTHON") or sys.executable


@pytest.fixture(scope="module")
def requirements_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv (ComfyUI's Python version) that ran only `pip install -r requirements.txt`
    (pip's own cache reused). Skipped when pip cannot get the packages (no network to PyPI).

    `--no-compile`: what gets installed is the same; pip only skips byte-compiling every module of
    numpy, PyAV, pydantic, ... ahead of time (a third of the install's time); the few
    modules the tests import are compiled when imported."""
    folder = tmp_path_factory.mktemp("requirements-only")
    venv = folder / "venv"
    subprocess.run([COMFYUI_PYTHON, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              "--no-compile", "-r", str(REPO / "requirements.txt")],
                             capture_output=True, text=True, timeout=900)
    if install.returncode != 0:
        pytest.skip(f"pip could not install requirements.txt (no network to PyPI?): {install.stderr[-500:]}")
    return venv


def _checkout_in_custom_nodes(base: Path) -> Path:
    """This repository as `git clone` leaves it in ComfyUI/custom_nodes/h3bridge (a copy, not a
    symlink: the README's `../../models` must resolve inside the ComfyUI folder)."""
    target = base / "ComfyUI" / "custom_nodes" / "h3bridge"
    shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(".venv*", ".git", "__pycache__", "*.egg-info",
                                                                ".pytest_cache", "build"))
    return target


@pytest.mark.slow
@pytest.mark.timeout(1200)
# Checked before the module's install is made: without ComfyUI there is nothing to load it into.
@pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR and COMFYUI_PYTHON (ComfyUI's own packages) to load the pack")
def test_the_pack_loads_in_comfyui_with_requirements_txt_only(requirements_only: Path, tmp_path: Path) -> None:
    """ComfyUI imports the clone as a package and calls its comfy_entrypoint: with only
    requirements.txt installed, every dependency of ours comes from that install. ComfyUI's own
    packages (torch, ...) come from ComfyUI's environment, after ours on the path."""
    comfy_site = subprocess.run([COMFYUI_PYTHON, "-c", "import torch, sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True)
    if comfy_site.returncode != 0:
        pytest.skip("COMFYUI_PYTHON has no torch: not ComfyUI's environment")
    python = requirements_only / "bin" / "python"
    ours = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(ours) / "zz_comfyui_environment.pth").write_text(comfy_site.stdout.strip() + "\n")
    pack = _checkout_in_custom_nodes(tmp_path)
    dependencies = ["numpy", "av", "filelock", "psutil", "tqdm", "h3", "pydantic", "httpx", "threadpoolctl"]
    script = textwrap.dedent(f"""
        import asyncio, importlib.util, json, os, sys
        sys.path.insert(0, {COMFYUI_DIR!r})
        import comfy.cli_args
        comfy.cli_args.args.cpu = True
        path = {str(pack)!r}
        # as ComfyUI's nodes.load_custom_node imports a custom node folder
        spec = importlib.util.spec_from_file_location("h3bridge_pack", os.path.join(path, "__init__.py"),
                                                      submodule_search_locations=[path])
        module = importlib.util.module_from_spec(spec)
        sys.modules["h3bridge_pack"] = module
        spec.loader.exec_module(module)
        extension = asyncio.run(module.comfy_entrypoint())
        nodes = asyncio.run(extension.get_node_list())
        print(json.dumps({{"nodes": [node.define_schema().node_id for node in nodes],
                          "files": {{name: importlib.import_module(name).__file__ for name in {dependencies!r}}}}}))
    """)
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, HOME=str(tmp_path / "home")))
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert {"H3EngineV2", "H3Generate", "H3Storyboard"} <= set(report["nodes"])
    for name, file in report["files"].items():
        assert file.startswith(ours), (name, file)        # from requirements.txt, not ComfyUI's environment


def _readme_simulator_block() -> str:
    readme = (REPO / "docs" / "comfyui.md").read_text()
    marker = "<!-- tested-by: tests/test_comfy_install.py::test_the_readme_simulator_commands_work_with_requirements_txt_only -->"
    block = re.search(re.escape(marker) + r"\s*```sh\n(.*?)```", readme, re.S)
    assert block, "docs/comfyui.md's ComfyUI simulator commands"
    return block[1]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_readme_simulator_commands_work_with_requirements_txt_only(requirements_only: Path,
                                                                       tmp_path: Path) -> None:
    """Exactly the README's commands, run in the clone with that install's python first on PATH (an
    active ComfyUI environment), then a clip rendered through the engine path the README gives."""
    pack = _checkout_in_custom_nodes(tmp_path)
    env = dict(os.environ, PATH=f"{requirements_only / 'bin'}:{os.environ['PATH']}", HOME=str(tmp_path / "home"),
               H3BRIDGE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("PYTHONPATH", None)
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", _readme_simulator_block()], cwd=pack, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    model = tmp_path / "ComfyUI" / "models" / "h3" / "MiniMax-H3"
    assert (model / "FL2VA").is_dir()
    # The engine path the README names, as H3 Engine runs it: the pack sets H3BRIDGE_PYTHON to
    # ComfyUI's python when it loads (here: that install's python).
    engine = pack / "bin" / "h3-sim"
    render = subprocess.run(
        [str(requirements_only / "bin" / "python"), "-m", "h3bridge.cli", "generate", "-p", "a red fox", "--width", "64",
         "--height", "32", "--frames", "22", "--steps", "2", "--quiet", "-o", str(tmp_path / "fox.mp4"),
         "--engine-path", str(engine), "--model-dir", str(model)],
        cwd=pack, env=dict(env, H3BRIDGE_PYTHON=str(requirements_only / "bin" / "python")),
        capture_output=True, text=True, timeout=600)
    assert render.returncode == 0, render.stderr[-3000:]
    assert (tmp_path / "fox.mp4").stat().st_size > 0
