"""The node pack's English and Simplified Chinese locales (issue 24 item 5): locales/<lang>/nodeDefs.json
and main.json, as ComfyUI serves them (app/custom_node_manager.py), generated from the node schemas
by `python -m h3bridge.comfy.locales`. In-process (ComfyUI's python, COMFYUI_DIR); the real frontend
showing them in Chinese is in test_comfy_integration.py."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from comfy_helpers import require_comfyui_in_process

torch = require_comfyui_in_process()

from h3bridge.comfy import locales  # noqa: E402
from h3bridge.comfy.nodes import comfy_entrypoint  # noqa: E402
from h3bridge.comfy.shared import CATEGORY  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NODES = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())


def _read(name: str) -> dict:
    return json.loads((REPO / "locales" / name).read_text(encoding="utf-8"))


def _schema_inputs(items, prefix=""):
    for item in items:
        yield prefix + item.id, item
        for option in getattr(item, "options", None) or []:
            yield from _schema_inputs(getattr(option, "inputs", []), prefix + item.id + ".")


def test_the_files_are_what_the_schemas_generate_now() -> None:
    """No drift: run `python -m h3bridge.comfy.locales` after changing a node's text."""
    table = json.loads(locales.ZH_STRINGS.read_text(encoding="utf-8"))
    assert locales.missing_translations(locales.english_node_defs(NODES), table) == []
    for name, content in locales.locale_files(NODES, CATEGORY, table).items():
        assert _read(name) == content, f"locales/{name} is stale: run python -m h3bridge.comfy.locales"


def test_every_node_input_and_output_has_an_english_entry_equal_to_its_schema_and_a_chinese_one() -> None:
    english, chinese = _read("en/nodeDefs.json"), _read("zh/nodeDefs.json")
    assert set(english) == set(chinese) == {node.define_schema().node_id for node in NODES}
    for node in NODES:
        schema = node.define_schema()
        en, zh = english[schema.node_id], chinese[schema.node_id]
        assert en["display_name"] == schema.display_name
        assert zh["display_name"] != en["display_name"] or schema.display_name == "H3 LoRA"    # the same in both
        assert en.get("description") == schema.description and zh.get("description")
        seen: dict[str, set[str]] = {}
        for name, item in _schema_inputs(schema.inputs):
            key = name.replace(".", "_")
            seen.setdefault(key, set()).add(item.tooltip or "")
            assert en["inputs"][key]["name"] == item.id and item.id in zh["inputs"][key]["name"], (schema.node_id, key)
        for key, tooltips in seen.items():
            if len(tooltips) == 1 and "" not in tooltips:      # one text for the key: the schema's
                assert en["inputs"][key]["tooltip"] == next(iter(tooltips)), (schema.node_id, key)
                assert zh["inputs"][key]["tooltip"] and zh["inputs"][key]["tooltip"] != en["inputs"][key]["tooltip"]
            else:       # options with different texts under one key: the frontend shows each option's own
                assert "tooltip" not in en["inputs"][key] and "tooltip" not in zh["inputs"][key]
        assert len(en["outputs"]) == len(zh["outputs"]) == len(schema.outputs)
        for index, output in enumerate(schema.outputs):
            assert en["outputs"][str(index)].get("tooltip") == output.tooltip, (schema.node_id, index)
    assert _read("en/main.json") == {"nodeCategories": {CATEGORY: CATEGORY}}
    assert _read("zh/main.json")["nodeCategories"][CATEGORY]


def test_a_changed_english_text_has_no_chinese_until_one_is_written() -> None:
    english = locales.english_node_defs(NODES)
    table = json.loads(locales.ZH_STRINGS.read_text(encoding="utf-8"))
    node = next(iter(english))
    english[node]["description"] += " (changed)"
    assert locales.missing_translations(english, table) == [english[node]["description"]]
    with pytest.raises(KeyError):
        locales.translated(english, table)
