"""H3 Engine shows only the chosen mode's inputs (issue 20 item 5): the old node showed remote_url,
library_path and previews in every mode, and remote mode failed until the user cleared model_dir.
In-process (ComfyUI's python, COMFYUI_DIR); skipped otherwise. The real frontend's view of it is in
test_comfy_integration.py."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from comfy_helpers import require_comfyui_in_process

torch = require_comfyui_in_process()

from h3bridge.comfy import adapter  # noqa: E402
from h3bridge.comfy.nodes import H3EngineByModeNode, H3EngineNode, comfy_entrypoint  # noqa: E402
from h3bridge.errors import H3BridgeError  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402
from h3bridge.vocabulary import ENGINE_KINDS  # noqa: E402


def _option_inputs(schema) -> dict[str, list[str]]:
    mode = schema.inputs[0]
    return {option.key: [item.id for item in option.inputs] for option in mode.options}


def test_each_mode_shows_only_the_inputs_it_reads() -> None:
    schema = H3EngineByModeNode.define_schema()
    assert [item.id for item in schema.inputs] == ["mode"]
    shown = _option_inputs(schema)
    assert list(shown) == list(ENGINE_KINDS)         # the engine choice of every interface (issue 30)
    assert shown == {
        "one-shot": ["engine_path", "model_dir", "stall_timeout"],
        "session": ["engine_path", "model_dir", "stall_timeout"],
        "library": ["library_path", "model_dir", "previews", "engine_path", "stall_timeout"],
        "remote": ["remote_url"],
    }
    every = [schema.inputs[0], *(item for option in schema.inputs[0].options for item in option.inputs)]
    assert all(item.tooltip for item in every)


def test_the_default_mode_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The frontend gives a new node the combo's first option."""
    monkeypatch.delenv("H3_LIBRARY", raising=False)
    assert list(_option_inputs(H3EngineByModeNode.define_schema()))[0] == "one-shot"
    monkeypatch.setenv("H3_LIBRARY", "/somewhere/libh3.dylib")
    assert list(_option_inputs(H3EngineByModeNode.define_schema()))[0] == "library"


def test_both_nodes_are_registered_and_the_old_one_is_deprecated() -> None:
    listed = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    assert H3EngineByModeNode in listed and H3EngineNode in listed
    assert H3EngineNode.define_schema().is_deprecated and not H3EngineByModeNode.define_schema().is_deprecated
    assert H3EngineByModeNode.define_schema().display_name == "H3 Engine"


def test_remote_mode_needs_only_the_servers_url() -> None:
    handle = H3EngineByModeNode.execute(mode={"mode": "remote", "remote_url": "http://127.0.0.1:9"}).result[0]
    assert handle.mode == adapter.REMOTE and handle.model_dir is None and handle.engine_path is None
    with pytest.raises(H3BridgeError, match="remote_url"):
        H3EngineByModeNode.execute(mode={"mode": "remote", "remote_url": ""})


def test_local_modes_read_their_own_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import folder_paths

    from core_helpers import sim_engine_path
    monkeypatch.setattr(folder_paths, "models_dir", str(tmp_path / "models"))
    monkeypatch.setitem(folder_paths.folder_names_and_paths, adapter.MODEL_FOLDER, ([], set()))
    write_fixture_model(tmp_path / "models" / adapter.MODEL_FOLDER / "MiniMax-H3")
    # the vocabulary's names, and the old "warm session" of saved API prompts (read as session)
    for mode, kind in (("one-shot", "one-shot"), ("session", "session"), ("warm session", "session")):
        handle = H3EngineByModeNode.execute(mode={"mode": mode, "engine_path": str(sim_engine_path()),
                                                  "model_dir": "MiniMax-H3", "stall_timeout": 30}).result[0]
        assert handle.mode == kind and handle.model_dir.name == "MiniMax-H3" and handle.stall_timeout == 30
    with pytest.raises(H3BridgeError, match="NoSuchModel"):
        H3EngineByModeNode.execute(mode={"mode": "one-shot", "engine_path": str(sim_engine_path()),
                                         "model_dir": "NoSuchModel", "stall_timeout": 600})
