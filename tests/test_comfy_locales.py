"""The node pack's English and Simplified Chinese locales (issue 24 item 5): locales/<lang>/nodeDefs.json
and main.json, as ComfyUI serves them (app/custom_node_manager.py), generated from the node schemas
by `python -m h3bridge.comfy.locales`, with the Chinese of every text shown kept by where it is shown
(issue 30). In-process (ComfyUI's python, COMFYUI_DIR); the real frontend
showing them in Chinese is in test_comfy_integration.py."""
from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path

import pytest

from comfy_helpers import require_comfyui_in_process

torch = require_comfyui_in_process()

import folder_paths  # noqa: E402

from h3bridge.comfy import adapter, locales  # noqa: E402
from h3bridge.vocabulary import ENGINE_KINDS  # noqa: E402
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


def _strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    else:
        yield value


def _table() -> dict:
    return locales.read_table()


def test_the_files_are_what_the_schemas_generate_now() -> None:
    """No drift: run `python -m h3bridge.comfy.locales` after changing a node's text."""
    table = _table()
    assert locales.missing_translations(locales.displayed_texts(NODES, CATEGORY), table) == []
    for name, content in locales.locale_files(NODES, CATEGORY, table).items():
        assert _read(name) == content, f"locales/{name} is stale: run python -m h3bridge.comfy.locales"


def test_every_displayed_text_has_chinese() -> None:
    """Display names, descriptions, input and output names and tooltips, the category, every option a
    combo shows and the extension's messages: each has Chinese of its own, for the English shown now.
    This is the check that fails when a text is added or changed without a translation."""
    texts = locales.displayed_texts(NODES, CATEGORY)
    table = _table()
    assert locales.missing_translations(texts, table) == []
    assert locales.unused_translations(texts, table) == []
    same = {key for key, english in texts.items() if table[key]["zh"] == english}
    assert same <= {"H3Lora/display_name"}, same          # "H3 LoRA" reads the same in both
    # every node is in it, H3 Model included (issue 30: it was English), with everything it shows
    assert {key.split("/")[0] for key in texts} >= {node.define_schema().node_id for node in NODES}
    for key in ("H3Model/display_name", "H3Model/description", "H3Model/inputs/model/name",
                "H3Model/inputs/model/tooltip", "H3Model/outputs/0/name", "H3Model/outputs/0/tooltip",
                f"H3Model/model/options/{adapter.NO_MODEL_INSTALLED}"):
        assert key in texts and table[key]["zh"] != texts[key], key
    # the inputs under a mode, preset or length choice have their own tooltips, translated
    for key in ("H3EngineV2/inputs/mode_model_dir/tooltip", "H3Generate/inputs/length_unit_seconds/tooltip",
                "H3Generate/inputs/preset_steps/tooltip", "H3MemoryPlan/inputs/preset_layers/tooltip"):
        assert key in texts and table[key]["zh"] != texts[key], key


def test_the_check_fails_for_a_text_without_chinese() -> None:
    texts = locales.displayed_texts(NODES, CATEGORY)
    table = _table()
    for key in ("H3Model/inputs/model/tooltip", "H3Generate/outputs/1/name", "H3EngineV2/mode/options/session",
                "messages/old_mode_renamed"):
        without = {other: entry for other, entry in table.items() if other != key}
        assert locales.missing_translations(texts, without) == [key]
        empty = {**table, key: {"en": texts[key], "zh": ""}}
        assert locales.missing_translations(texts, empty) == [key]


def test_translations_are_kept_by_where_the_text_is_shown_not_by_its_english() -> None:
    """H3 Generate's IMAGE output `frames` is the clip's frames, its length input `frames` a number
    of frames: one English word, two translations (issue 30: the output showed "帧数")."""
    chinese = _read("zh/nodeDefs.json")
    for node in ("H3Generate", "H3Storyboard"):
        schema = next(n.define_schema() for n in NODES if n.define_schema().node_id == node)
        index = next(i for i, output in enumerate(schema.outputs) if output.display_name == "frames")
        assert "帧数" not in chinese[node]["outputs"][str(index)]["name"]
        assert chinese[node]["outputs"][str(index)]["name"].endswith("frames")
    assert chinese["H3Generate"]["inputs"]["length_unit_frames"]["name"] == "帧数 frames"


def test_a_changed_english_text_has_no_chinese_until_one_is_written() -> None:
    texts = locales.displayed_texts(NODES, CATEGORY)
    table = _table()
    key = "H3EngineV2/description"
    texts[key] += " (changed)"
    assert locales.missing_translations(texts, table) == [key]
    english = locales.english_node_defs(NODES)
    english["H3EngineV2"]["description"] += " (changed)"
    with pytest.raises(KeyError, match="H3EngineV2/description"):
        locales._translate(english["H3EngineV2"], "H3EngineV2", table)


def test_no_locale_text_holds_a_path_of_the_machine_that_made_it() -> None:
    """The files are generated on a developer's machine and shipped: a description with the model
    folder of that machine (issue 30: H3 Model's) would be wrong everywhere else."""
    absolute = re.compile(r"(?:^|[\s`'\"(=:])/[\w.-]+/")
    for name in ("en/nodeDefs.json", "en/main.json", "zh/nodeDefs.json", "zh/main.json"):
        text = (REPO / "locales" / name).read_text(encoding="utf-8")
        for local in (str(REPO), str(Path.home()), str(Path(folder_paths.models_dir)), tempfile.gettempdir() + "/"):
            assert local not in text, (name, local)
        for value in _strings(json.loads(text)):
            assert not absolute.search(value), (name, value)


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
            # one text per key (the frontend has one key for every option's input of that name)
            assert len(tooltips) == 1, (schema.node_id, key, tooltips)
            if tooltips == {""}:        # an input with no tooltip (a socket such as engine)
                assert "tooltip" not in en["inputs"][key] and "tooltip" not in zh["inputs"][key]
                continue
            assert en["inputs"][key]["tooltip"] == next(iter(tooltips)), (schema.node_id, key)
            assert zh["inputs"][key]["tooltip"] and zh["inputs"][key]["tooltip"] != en["inputs"][key]["tooltip"]
        assert len(en["outputs"]) == len(zh["outputs"]) == len(schema.outputs)
        for index, output in enumerate(schema.outputs):
            assert en["outputs"][str(index)].get("tooltip") == output.tooltip, (schema.node_id, index)
    assert _read("en/main.json")["nodeCategories"] == {CATEGORY: CATEGORY}
    assert _read("zh/main.json")["nodeCategories"][CATEGORY]


def test_every_option_a_combo_shows_has_a_label_in_each_language() -> None:
    """The frontend translates no combo option; the extension shows main.json's labels."""
    for language in ("en", "zh"):
        labels = _read(f"{language}/main.json")["h3bridge"]["options"]
        for where, options in locales.combo_options(NODES).items():
            assert set(labels[where]) == set(options), (language, where)
            if language == "en":
                assert all(labels[where][option] == option for option in options)
            else:
                # the value stays readable beside its Chinese, but for the placeholders of empty lists
                assert all(option in labels[where][option] or option in (adapter.NO_MODEL_INSTALLED,
                                                                         "(no LoRA in models/loras)")
                           for option in options), where
    assert locales.combo_options(NODES)["H3EngineV2/mode"] == list(ENGINE_KINDS)
