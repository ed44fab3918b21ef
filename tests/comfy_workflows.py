"""ComfyUI workflow formats for the COMFY tests.

ComfyUI's frontend saves workflows in the "UI" format (nodes with `widgets_values`
and a `links` table); `/prompt` takes the "API" format (node id -> class_type and
named inputs). The frontend converts one to the other using `/object_info`; this
module does the same conversion so the example workflows can be run headless.

Conversion rules (as the frontend serialises them):
- widget inputs are the inputs whose type is a primitive or a combo; their values
  appear in `widgets_values` in `input_order` (required, then optional);
- an INT with `control_after_generate` (or, undeclared, named seed / noise_seed) is followed by the
  control value (a new node's: "randomize" unless declared; `widgets={"seed:control": "fixed"}` sets it);
- a dynamic combo (COMFY_DYNAMICCOMBO_V3) is followed by the widgets of its chosen
  option, whose API names are prefixed with the combo's name and a dot;
- trailing values of UI-only widgets (upload buttons, players) are ignored;
- a link into an input (socket or widget) replaces the widget value.
"""
from __future__ import annotations

from typing import Any, Iterator

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "COMFY_DYNAMICCOMBO_V3"}


def _is_widget(spec: list) -> bool:
    kind = spec[0]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return (isinstance(kind, list) or kind in WIDGET_TYPES) and not options.get("forceInput")


def _ordered_inputs(definition: dict) -> Iterator[tuple[str, list, bool]]:
    """(name, spec, optional) for each input, in the frontend's order."""
    inputs = definition["input"]
    order = definition.get("input_order") or {k: list(v) for k, v in inputs.items() if k != "hidden"}
    for section in ("required", "optional"):
        for name in order.get(section, []):
            yield name, inputs[section][name], section == "optional"


def _option_inputs(option: dict) -> Iterator[tuple[str, list]]:
    for section in ("required", "optional"):
        for name, spec in option.get("inputs", {}).get(section, {}).items():
            yield name, spec


def _widget_entries(name: str, spec: list, chosen: dict[str, Any]) -> Iterator[tuple[str | None, Any, list | None]]:
    """(api_name or None for UI-only values, value, spec) in widgets_values order."""
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if spec[0] == "COMFY_DYNAMICCOMBO_V3":
        keys = [o["key"] for o in options["options"]]
        value = chosen.get(name, keys[0])
        yield name, value, spec
        value = chosen.get(name, value)      # ui_to_api records the saved choice while we are paused
        option = next(o for o in options["options"] if o["key"] == value)
        for child, child_spec in _option_inputs(option):
            if _is_widget(child_spec):
                yield from _widget_entries(f"{name}.{child}", child_spec, chosen)
        return
    if name in chosen:
        value = chosen[name]
    elif "default" in options:
        value = options["default"]
    elif isinstance(spec[0], list):
        value = spec[0][0] if spec[0] else ""
    elif spec[0] == "COMBO":
        value = options.get("options", [""])[0] if options.get("options") else ""
    else:
        value = {"INT": 0, "FLOAT": 0.0, "STRING": "", "BOOLEAN": False}[spec[0]]
    yield name, value, spec
    if spec[0] == "INT" and _has_control_widget(name, options):
        yield None, chosen.get(f"{name}:control", _control_default(options)), None


def _has_control_widget(name: str, options: dict) -> bool:
    """Whether the frontend adds "control after generate" to an INT: as the input declares it, and
    when it does not say, to any input named seed or noise_seed (useIntWidget.ts)."""
    declared = options.get("control_after_generate")
    return bool(declared) if declared is not None else name in ("seed", "noise_seed")


def _control_default(options: dict) -> str:
    """The control's value on a new node: the one declared, else "randomize" (useIntWidget.ts)."""
    declared = options.get("control_after_generate")
    return declared if isinstance(declared, str) else "randomize"


def build_ui_workflow(nodes: list[dict], links: list[tuple[int, int, int, str]], object_info: dict,
                      *, extra: dict | None = None) -> dict:
    """A UI-format workflow from a compact description.

    nodes: dicts with id, type, pos, and optional widgets (name -> value) and ui_values (trailing
      UI-only widget values, e.g. LoadImage's upload button "image").
    links: (from_id, from_slot, to_id, to_input_name).
    """
    by_id = {node["id"]: node for node in nodes}
    link_rows: list[list] = []
    incoming: dict[tuple[int, str], int] = {}
    outgoing: dict[tuple[int, int], list[int]] = {}
    for link_id, (from_id, from_slot, to_id, to_name) in enumerate(links, 1):
        out_type = object_info[by_id[from_id]["type"]]["output"][from_slot]
        incoming[(to_id, to_name)] = link_id
        outgoing.setdefault((from_id, from_slot), []).append(link_id)
        link_rows.append([link_id, from_id, from_slot, to_id, None, out_type])
    ui_nodes = []
    for order, node in enumerate(nodes):
        definition = object_info[node["type"]]
        chosen = node.get("widgets", {})
        ui_inputs, widgets_values = [], []
        for name, spec, optional in _ordered_inputs(definition):
            type_name = "COMBO" if isinstance(spec[0], list) else spec[0]
            if _is_widget(spec):
                for _api_name, value, _spec in _widget_entries(name, spec, chosen):
                    widgets_values.append(value)
                if (node["id"], name) in incoming:
                    ui_inputs.append({"name": name, "type": type_name, "widget": {"name": name},
                                      "link": incoming[(node["id"], name)]})
            else:
                entry = {"name": name, "type": type_name, "link": incoming.get((node["id"], name))}
                if optional:
                    entry["shape"] = 7
                ui_inputs.append(entry)
        for row in link_rows:
            if row[3] == node["id"]:
                row[4] = next(i for i, entry in enumerate(ui_inputs) if entry["link"] == row[0])
        outputs = [{"name": out_name, "type": out_type, "links": outgoing.get((node["id"], slot)) or None}
                   for slot, (out_type, out_name) in enumerate(zip(definition["output"], definition["output_name"]))]
        ui_nodes.append({
            "id": node["id"], "type": node["type"], "pos": node["pos"], "size": node.get("size", [360, 260]),
            "flags": {}, "order": order, "mode": 0, "inputs": ui_inputs, "outputs": outputs,
            "properties": {"Node name for S&R": node["type"]},
            "widgets_values": widgets_values + list(node.get("ui_values", [])),
            **({"title": node["title"]} if "title" in node else {}),
        })
    return {
        "last_node_id": max(by_id), "last_link_id": len(link_rows), "nodes": ui_nodes, "links": link_rows,
        "groups": [], "config": {}, "extra": extra or {}, "version": 0.4,
    }


def ui_to_api(workflow: dict, object_info: dict) -> dict:
    """The API-format prompt the frontend would send for a UI-format workflow."""
    links = {row[0]: row for row in workflow["links"]}
    prompt: dict[str, dict] = {}
    for node in workflow["nodes"]:
        if node.get("mode", 0) != 0:        # muted (2) or bypassed (4) nodes are not sent
            continue
        definition = object_info[node["type"]]
        values = list(node.get("widgets_values") or [])
        inputs: dict[str, Any] = {}
        position = 0
        for name, spec, _optional in _ordered_inputs(definition):
            if not _is_widget(spec):
                continue
            chosen: dict[str, Any] = {}
            # Walk the entries with the saved values standing in for choices, one at a time.
            entries = _widget_entries(name, spec, chosen)
            while True:
                try:
                    api_name, _default, _spec = next(entries)
                except StopIteration:
                    break
                value = values[position] if position < len(values) else _default
                position += 1
                if api_name is not None:
                    inputs[api_name] = value
                    chosen[api_name] = value     # a dynamic combo's saved choice selects its children
        for entry in node.get("inputs", []):
            link_id = entry.get("link")
            if link_id is not None and link_id in links:
                row = links[link_id]
                inputs[entry["name"]] = [str(row[1]), row[2]]
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt
