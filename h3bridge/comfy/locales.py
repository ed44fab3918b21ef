"""The node pack's locales (ComfyUI serves custom_nodes/<pack>/locales/<lang>/main.json and
nodeDefs.json to its frontend, app/custom_node_manager.py), generated from the node schemas so they
cannot drift:

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfyui/python -m h3bridge.comfy.locales

English is the schemas' own text; Simplified Chinese is `zh_strings.json` (English text -> Chinese),
so a changed English text has no translation until someone writes one, and the script (and the
test) says which. The frontend looks texts up by node id and input name with dots as underscores
(`nodeDefs.H3EngineV2.inputs.mode_engine_path.tooltip`; a dynamic combo's inputs are
`<combo>.<input>`), outputs by position, categories under `nodeCategories`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable

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


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def translated(english: Any, table: dict[str, str]) -> Any:
    """`english` with every text replaced by its translation; KeyError naming the missing text."""
    if isinstance(english, dict):
        return {key: translated(value, table) for key, value in english.items()}
    return table[english]


def missing_translations(english: Any, table: dict[str, str]) -> list[str]:
    return sorted({text for text in _strings(english) if text not in table})


def locale_files(nodes: Iterable[type], category: str, table: dict[str, str]) -> dict[str, dict]:
    """{"en/nodeDefs.json": ..., "en/main.json": ..., "zh/...": ...}."""
    english = english_node_defs(nodes)
    main = {"nodeCategories": {category: category}}
    return {"en/nodeDefs.json": english, "en/main.json": main,
            "zh/nodeDefs.json": translated(english, table), "zh/main.json": translated(main, table)}


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
    table = json.loads(ZH_STRINGS.read_text(encoding="utf-8"))
    english = english_node_defs(nodes)
    missing = missing_translations({"defs": english, "category": CATEGORY}, table)
    if missing:
        print(f"{ZH_STRINGS.name} has no Chinese for {len(missing)} text(s); add them:", file=sys.stderr)
        print(json.dumps({text: "" for text in missing}, ensure_ascii=False, indent=1), file=sys.stderr)
        return 1
    for name, content in locale_files(nodes, CATEGORY, table).items():
        path = LOCALES / name
        write_output(path, json.dumps(content, ensure_ascii=False, indent=1) + "\n", overwrite=True,
                     field=f"the locale file {name}")
        print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
