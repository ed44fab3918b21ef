"""The H3 Model node and H3 Engine's missing-model message, called in-process. Needs ComfyUI
importable (ComfyUI's own python, COMFYUI_DIR set); skipped otherwise (the adapter underneath is
tested in test_comfy_model_choice.py):

    cp -r . /tmp/download_copy && cd /tmp/download_copy && COMFYUI_DIR=/work/wt/comfy-bed/ComfyUI \
        /work/wt/comfy-bed/venv/bin/python -m pytest -q tests/test_comfy_model_node.py

(from a folder whose name is a Python identifier: pytest imports the repository root's
__init__.py as a package.)
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from comfy_helpers import require_comfyui_in_process  # noqa: E402

torch = require_comfyui_in_process()

import folder_paths  # noqa: E402

from h3bridge.comfy.model_nodes import MODEL_NODES, H3ModelNode  # noqa: E402
from h3bridge.comfy import adapter  # noqa: E402
from h3bridge.comfy.nodes import H3EngineByModeNode, H3EngineNode  # noqa: E402
from h3bridge.runnable import command_words  # noqa: E402
from h3bridge.errors import ModelError  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ComfyUI's models folder of this test: models/h3 is registered by the nodes themselves."""
    monkeypatch.setattr(folder_paths, "models_dir", str(tmp_path / "models"))
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "h3", ([], set()))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "models" / "h3"


def test_the_node_is_registered_and_lists_the_installed_models(models: Path) -> None:
    import asyncio

    from h3bridge.comfy.nodes import comfy_entrypoint
    listed = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    assert all(node in listed for node in MODEL_NODES)
    write_fixture_model(models / "MiniMax-H3")
    write_fixture_model(models / "MiniMax-H3-turbo", ref2va=False)
    schema = H3ModelNode.define_schema()
    assert schema.display_name == "H3 Model" and all(item.tooltip for item in schema.inputs)
    assert schema.inputs[0].options == ["MiniMax-H3", "MiniMax-H3-turbo"]
    assert folder_paths.get_folder_paths("h3") == [str(models)]          # registered with folder_paths
    output = H3ModelNode.execute(model="MiniMax-H3-turbo")
    assert output.result == (str((models / "MiniMax-H3-turbo").resolve()),)
    assert H3ModelNode.validate_inputs(model="MiniMax-H3") is True


def _shown(*words: str) -> str:
    """A command as the nodes show it here (bed: no console scripts, so `<python> <checkout> ...`)."""
    return shlex.join(command_words("h3bridge", *words))


def test_with_nothing_installed_the_nodes_say_the_download_command_and_size(models: Path) -> None:
    schema = H3ModelNode.define_schema()
    # no model name that looks installed: the one option says there is none (issue 30)
    assert schema.inputs[0].options == [adapter.NO_MODEL_INSTALLED]
    # the description is the same on every machine: no path of this one (it goes into the locale files)
    assert str(models) not in schema.description and str(Path.home()) not in schema.description
    assert "134 GiB for FL2VA alone, 196 GiB for all" in schema.description
    command = _shown("model", "download", str(models / "MiniMax-H3"))
    for value in (adapter.NO_MODEL_INSTALLED, "MiniMax-H3"):     # a new node, or a workflow saved elsewhere
        message = H3ModelNode.validate_inputs(model=value)
        assert isinstance(message, str) and message.startswith("no MiniMax-H3 model is installed")
        assert f"`{command}`" in message and "about 196 GiB with all" in message
        # FL2VA alone as the whole command (issue 34.3: not a bare `--partition FL2VA` flag)
        fl2va = _shown("model", "download", str(models / "MiniMax-H3"), "--partition", "FL2VA")
        assert f"about 134 GiB with `{fl2va}`" in message and "pick it in model" in message
    with pytest.raises(ModelError, match="no MiniMax-H3 model is installed"):
        H3ModelNode.execute(model=adapter.NO_MODEL_INSTALLED)
    engine = models.parent.parent / "h3"          # an engine that is there: the model is what is missing
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    with pytest.raises(ModelError) as caught:
        H3EngineNode.execute(engine_path=str(engine), model_dir="MiniMax-H3", mode="one-shot")
    assert f"`{command}`" in str(caught.value)
    # the manual path input still works, and a typed missing path gets its own command
    missing = models.parent.parent / "elsewhere" / "MiniMax-H3"
    message = H3EngineNode.validate_inputs(engine_path=str(engine), model_dir=str(missing), mode="one-shot")
    assert f"`{_shown('model', 'download', str(missing))}`" in message


def test_the_shown_download_command_runs_here_as_shown(models: Path) -> None:
    """Inside ComfyUI's Python (no console scripts on PATH) the command is `<python> -m h3bridge` or
    `<python> <checkout>`: it runs as shown (with --help: no download), and its help states what
    each choice downloads in total."""
    message = H3ModelNode.validate_inputs(model=adapter.NO_MODEL_INSTALLED)
    shown = message[message.index("`") + 1:message.index("`", message.index("`") + 1)]
    words = shlex.split(shown)
    assert words[-3:] == ["model", "download", str(models / "MiniMax-H3")]
    run = subprocess.run([*words[:-1], "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    assert "FL2VA (prompt-only and first/last-frame jobs; about 134 GiB)" in run.stdout
    assert "all (default; about 196 GiB)" in run.stdout


@pytest.fixture
def no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh install: no h3 on PATH, H3_BIN and H3_LIBRARY unset."""
    (tmp_path / "empty-bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("H3_BIN", raising=False)
    monkeypatch.delenv("H3_LIBRARY", raising=False)


def test_h3_engine_says_everything_missing_at_once_before_anything_runs(models: Path, no_engine: None) -> None:
    """The engine AND the model, in one message from ComfyUI's input validation (the widgets turn
    red before any node runs), each with its fix (issue 30)."""
    values = {"mode": "one-shot", "engine_path": "", "model_dir": "MiniMax-H3", "stall_timeout": 600}
    message = H3EngineByModeNode.validate_inputs(mode=values)
    assert isinstance(message, str) and message.startswith("2 things to fix before this can run:")
    assert "\n1. engine_path: the h3 engine was not found" in message
    assert "\n2. model_dir: model directory 'MiniMax-H3' was not found" in message
    assert f"`{_shown('model', 'download', str(models / 'MiniMax-H3'))}`" in message
    # model_dir linked from H3 Model (None at validation): that node reports the model, this one the engine
    linked = H3EngineByModeNode.validate_inputs(mode={**values, "model_dir": None})
    assert linked.startswith("engine_path: the h3 engine was not found") and "model directory" not in linked
    # both linked (a path from another node): nothing known yet, checked when the node runs
    assert H3EngineByModeNode.validate_inputs(mode={**values, "engine_path": None, "model_dir": None}) is True
    # the library mode: its library and the model
    library = H3EngineByModeNode.validate_inputs(mode={"mode": "library", "library_path": "", "model_dir": "MiniMax-H3",
                                                       "previews": True, "engine_path": "", "stall_timeout": 600})
    assert library.startswith("2 things to fix") and "1. library_path: no libh3 library given" in library
    # remote mode reads only its URL
    assert H3EngineByModeNode.validate_inputs(mode={"mode": "remote", "remote_url": "http://127.0.0.1:9"}) is True
    # the deprecated node says the same
    old = H3EngineNode.validate_inputs(engine_path="", model_dir="MiniMax-H3", mode="one-shot", stall_timeout=600)
    assert old == message


def test_installed_pieces_pass_validation_and_the_old_mode_name_still_runs(models: Path) -> None:
    write_fixture_model(models / "MiniMax-H3")
    engine = models.parent.parent / "h3"      # checked for being there and executable; nothing runs it here
    engine.write_text("#!/bin/sh\nexit 1\n")
    engine.chmod(0o755)
    engine = str(engine)
    values = {"mode": "session", "engine_path": engine, "model_dir": "MiniMax-H3", "stall_timeout": 600}
    assert H3EngineByModeNode.validate_inputs(mode=values) is True
    assert H3ModelNode.validate_inputs(model="MiniMax-H3") is True
    # a workflow saved with the deprecated node and the old mode name: accepted, run as the session
    assert H3EngineNode.validate_inputs(engine_path=engine, model_dir="MiniMax-H3", mode="warm session") is True
    handle = H3EngineNode.execute(engine_path=engine, model_dir="MiniMax-H3", mode="warm session").result[0]
    assert handle.mode == adapter.SESSION == "session"
    assert H3EngineNode.validate_inputs(engine_path=engine, model_dir="MiniMax-H3", mode="warm").startswith(
        "mode: unknown engine mode 'warm'")
