"""The node pack's locales (ComfyUI serves custom_nodes/<pack>/locales/<lang>/main.json and
nodeDefs.json to its frontend, app/custom_node_manager.py), generated from the node schemas so they
cannot drift:

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfyui/python -m h3bridge.comfy.locales

English is the schemas' own text. Simplified Chinese is `zh_strings.json`, keyed by where a text is
shown (`H3Generate/outputs/1/name`), not by the English words: one English word can need two
translations (H3 Generate's IMAGE output `frames` is the clip's frames, its length input `frames` a
number of frames). Each entry keeps the English it translates, so a changed English text has no
translation until someone writes one, and the script (and the test) names it.

The frontend looks texts up by node id and input name with dots as underscores
(`nodeDefs.H3EngineV2.inputs.mode_engine_path.tooltip`; a dynamic combo's inputs are
`<combo>.<input>`), outputs by position, categories under `nodeCategories`. It translates no combo
option: the pack's extension (web/h3_engine_mode.js) shows them from main.json's `h3bridge.options`
(`<node>/<input>` -> {option: text}), and its own messages from `h3bridge.messages`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..safeio.outputs import write_output

PACK_ROOT = Path(__file__).resolve().parents[2]
LOCALES = PACK_ROOT / "locales"
ZH_STRINGS = Path(__file__).with_name("zh_strings.json")


def _key(name: str) -> str:
    """The frontend's normalizeI18nKey: dots become underscores."""
    return name.replace(".", "_")


def _inputs(items: Iterable[Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(frontend name, input) for each input, a dynamic combo's options' inputs after it."""
    for item in items:
        name = prefix + item.id
        yield name, item
        for option in getattr(item, "options", None) or []:
            if hasattr(option, "inputs"):
                yield from _inputs(option.inputs, prefix=name + ".")


def english_node_defs(nodes: Iterable[type]) -> dict[str, dict]:
    """nodeDefs in English, from each node's schema: display name, description, every input's
    name and tooltip, every output's name and tooltip."""
    defs: dict[str, dict] = {}
    for node in nodes:
        schema = node.define_schema()
        entry: dict[str, Any] = {"display_name": schema.display_name or schema.node_id}
        if schema.description:
            entry["description"] = schema.description
        inputs: dict[str, dict] = {}
        conflicting: set[tuple[str, str]] = set()
        for name, item in _inputs(schema.inputs):
            text = {"name": item.display_name or item.id}
            if item.tooltip:
                text["tooltip"] = item.tooltip
            key = _key(name)
            # Options of one dynamic combo may each have an input of the same name with its own
            # text (each preset's steps); the frontend has one key for them all, so such a text is
            # left out and the frontend shows each option's own (the schema's, untranslated).
            for field, value in text.items():
                if key in inputs and inputs[key].get(field, value) != value:
                    conflicting.add((key, field))
            inputs.setdefault(key, {}).update(text)
        for key, field in conflicting:
            inputs[key].pop(field, None)
        entry["inputs"] = inputs
        outputs: dict[str, dict] = {}
        for index, output in enumerate(schema.outputs):
            text = {"name": output.display_name or output.id or output.io_type}
            if output.tooltip:
                text["tooltip"] = output.tooltip
            outputs[str(index)] = text
        entry["outputs"] = outputs
        defs[schema.node_id] = entry
    return defs


# Texts the pack's frontend extension shows (web/h3_engine_mode.js), by key; `{0}` is filled in there.
EXTENSION_MESSAGES: dict[str, str] = {
    "old_mode_renamed": "H3 Engine: mode {0} (the new name of the same mode; save the workflow to keep it)",
}


# Combos listing what is installed on this machine (model folders, LoRA files): their options are
# names, not text, and differ per machine. Only the fixed ones they may show are translated.
def installed_lists() -> dict[str, list[str]]:
    # adapter (numpy, the engines) only when the nodes are read: this module also runs where only
    # the locale files are (a wheel's `h3bridge.comfy`, without ComfyUI's packages)
    from .adapter import NO_MODEL_INSTALLED
    return {"H3Model/model": [NO_MODEL_INSTALLED],      # what H3 Model shows with no model folder
            "H3Lora/lora": ["(no LoRA in models/loras)"]}     # lora_nodes.NO_LORA_INSTALLED (imports ComfyUI)


def combo_options(nodes: Iterable[type]) -> dict[str, list[str]]:
    """`<node>/<input key>` -> the options a combo (or a dynamic combo's choice) shows."""
    found: dict[str, list[str]] = {}
    installed = installed_lists()
    for node in nodes:
        schema = node.define_schema()
        for name, item in _inputs(schema.inputs):
            where = f"{schema.node_id}/{_key(name)}"
            if where in installed:
                if installed[where]:
                    found[where] = installed[where]
                continue
            options = getattr(item, "options", None) or []
            shown = [option if isinstance(option, str) else getattr(option, "key", None) for option in options]
            if shown and all(isinstance(value, str) for value in shown):
                found[where] = list(dict.fromkeys(shown))
    return found


def displayed_texts(nodes: Iterable[type], category: str) -> dict[str, str]:
    """Every English text the pack shows, by where it is shown (the keys of zh_strings.json):
    display names, descriptions, input and output names and tooltips, the category, combo
    options and the extension's messages."""
    nodes = list(nodes)
    texts: dict[str, str] = {f"nodeCategories/{category}": category}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}/{key}")
        else:
            texts[path] = value

    for node_id, entry in english_node_defs(nodes).items():
        walk(entry, node_id)
    for where, options in combo_options(nodes).items():
        for option in options:
            texts[f"{where}/options/{option}"] = option
    for key, message in EXTENSION_MESSAGES.items():
        texts[f"messages/{key}"] = message
    return texts


Table = Mapping[str, Mapping[str, str]]     # context key -> {"en": English it translates, "zh": Chinese}


def missing_translations(texts: Mapping[str, str], table: Table) -> list[str]:
    """The context keys whose text has no Chinese: none written, or written for other English."""
    return sorted(key for key, english in texts.items()
                  if not (key in table and table[key].get("en") == english and table[key].get("zh")))


def unused_translations(texts: Mapping[str, str], table: Table) -> list[str]:
    return sorted(set(table) - set(texts))


def _translate(english: Any, path: str, table: Table) -> Any:
    if isinstance(english, dict):
        return {key: _translate(value, f"{path}/{key}", table) for key, value in english.items()}
    entry = table.get(path)
    if entry is None or entry.get("en") != english or not entry.get("zh"):
        raise KeyError(f"{path}: no Chinese for {english!r}")
    return entry["zh"]


def _pack_texts(nodes: list[type], category: str, chinese: Table | None) -> dict[str, Any]:
    """main.json's pack part: the option labels and the extension's messages."""
    def text(key: str, english: str) -> str:
        return english if chinese is None else _translate(english, key, chinese)
    options = {where: {option: text(f"{where}/options/{option}", option) for option in values}
               for where, values in combo_options(nodes).items()}
    messages = {key: text(f"messages/{key}", message) for key, message in EXTENSION_MESSAGES.items()}
    return {"options": options, "messages": messages}


def locale_files(nodes: Iterable[type], category: str, table: Table) -> dict[str, dict]:
    """{"en/nodeDefs.json": ..., "en/main.json": ..., "zh/...": ...}; KeyError naming the first
    text without Chinese."""
    nodes = list(nodes)
    english = english_node_defs(nodes)
    chinese_defs = {node_id: _translate(entry, node_id, table) for node_id, entry in english.items()}
    return {
        "en/nodeDefs.json": english,
        "en/main.json": {"nodeCategories": {category: category}, "h3bridge": _pack_texts(nodes, category, None)},
        "zh/nodeDefs.json": chinese_defs,
        "zh/main.json": {"nodeCategories": {category: _translate(category, f"nodeCategories/{category}", table)},
                         "h3bridge": _pack_texts(nodes, category, table)},
    }


def read_table(path: Path = ZH_STRINGS) -> dict[str, dict[str, str]]:
    return json.loads(path.read_text(encoding="utf-8"))


def main() -> int:
    import asyncio
    import os

    if os.environ.get("COMFYUI_DIR"):
        sys.path.insert(0, os.environ["COMFYUI_DIR"])
    import comfy.cli_args
    comfy.cli_args.args.cpu = True          # no GPU needed to read schemas
    from .nodes import comfy_entrypoint
    from .shared import CATEGORY
    nodes = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    table = read_table()
    texts = displayed_texts(nodes, CATEGORY)
    missing = missing_translations(texts, table)
    if missing:
        print(f"{ZH_STRINGS.name} has no Chinese for {len(missing)} text(s); add them (key: English, and "
              "the Chinese under zh):", file=sys.stderr)
        print(json.dumps({key: {"en": texts[key], "zh": ""} for key in missing}, ensure_ascii=False, indent=1),
              file=sys.stderr)
        return 1
    for key in unused_translations(texts, table):
        print(f"note: {ZH_STRINGS.name} has {key!r}, which no node shows any more", file=sys.stderr)
    for name, content in locale_files(nodes, CATEGORY, table).items():
        path = LOCALES / name
        write_output(path, json.dumps(content, ensure_ascii=False, indent=1) + "\n", overwrite=True,
                     field=f"the locale file {name}")
        print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
