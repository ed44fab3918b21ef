"""The H3 Model node and H3 Engine's missing-model message, called in-process. Needs ComfyUI
importable (ComfyUI's own python, COMFYUI_DIR set); skipped otherwise (the adapter underneath is
tested in test_comfy_model_choice.py):

    cp -r . /tmp/download_copy && cd /tmp/download_copy && COMFYUI_DIR=/work/wt/comfy-bed/ComfyUI \
        /work/wt/comfy-bed/venv/bin/python -m pytest -q tests/test_comfy_model_node.py

(from a folder whose name is a Python identifier: pytest imports the repository root's
__init__.py as a package.)
"""
from __future__ import annotations

from pathlib import Path

import pytest

from comfy_helpers import require_comfyui_in_process  # noqa: E402

torch = require_comfyui_in_process()

import folder_paths  # noqa: E402

from h3bridge.comfy.model_nodes import MODEL_NODES, H3ModelNode  # noqa: E402
from h3bridge.comfy.nodes import H3EngineNode  # noqa: E402
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


def test_with_nothing_installed_the_nodes_say_the_download_command_and_size(models: Path) -> None:
    schema = H3ModelNode.define_schema()
    command = f"h3bridge model download {models / 'MiniMax-H3'}"
    assert schema.inputs[0].options == ["MiniMax-H3"] and command in schema.description
    message = H3ModelNode.validate_inputs(model="MiniMax-H3")
    assert isinstance(message, str) and f"`{command}`" in message and "134 GiB" in message
    engine = models.parent.parent / "h3"          # an engine that is there: the model is what is missing
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    with pytest.raises(ModelError) as caught:
        H3EngineNode.execute(engine_path=str(engine), model_dir="MiniMax-H3", mode="one-shot")
    assert f"`{command}`" in str(caught.value)
    # the manual path input still works, and a typed missing path gets its own command
    missing = models.parent.parent / "elsewhere" / "MiniMax-H3"
    assert f"`h3bridge model download {missing}`" in H3EngineNode.validate_inputs(model_dir=str(missing))
