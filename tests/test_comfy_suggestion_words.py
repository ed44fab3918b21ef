"""Issue 34.3: ComfyUI says a fix (h3bridge.fixes: request fields and values) with its renderer,
`adapter.node_words`, and every name it says is an input of the node it names, with a value that
input takes. In-process (ComfyUI's python, COMFYUI_DIR); skipped otherwise. The other interfaces'
renderers are fed back to them in test_suggestion_words.py."""
from __future__ import annotations

import pytest

from comfy_helpers import require_comfyui_in_process

torch = require_comfyui_in_process()

from h3bridge.comfy import adapter  # noqa: E402
from h3bridge.comfy.nodes import H3EngineByModeNode, H3GenerateNode, H3ReferencesNode  # noqa: E402
from h3bridge.fixes import Change, changes  # noqa: E402
from h3bridge.media.references import describe_kind  # noqa: E402
from h3bridge.model.memory import MachineFacts, plan_memory  # noqa: E402
from h3bridge.request import ReferenceKind  # noqa: E402


def _inputs(items) -> dict[str, object]:
    """Every input of a schema by id, with the inputs its dynamic options show (preset's layers,
    length_unit's frames), each mapped to its options (None for a plain input)."""
    found: dict[str, object] = {}
    for item in items:
        options = getattr(item, "options", None)
        if options and not isinstance(options[0], str):       # a dynamic combo: option -> its own inputs
            found[item.id] = [option.key for option in options]
            for option in options:
                found.update(_inputs(option.inputs))
        else:
            found[item.id] = options
    return found


GENERATE = _inputs(H3GenerateNode.define_schema().inputs)
ENGINE = _inputs(H3EngineByModeNode.define_schema().inputs)


def _real_settings() -> list[tuple[Change, ...]]:
    """Suggestions the planner makes (published sizes), between them naming every knob but layers."""
    from h3bridge.request import GenerationRequest
    cases = [(GenerationRequest("x", width=864, height=480, frames=56), 24, False),
             (GenerationRequest("x", width=1344, height=768, seconds=15.0, int8_row_fc2=True), 18, False),
             (GenerationRequest("x", width=1344, height=768, seconds=15.0), 17, False),
             (GenerationRequest("x", width=1344, height=768, frames=56, ssd_streaming=True), 19, True)]
    found = []
    for request, gigabytes, preview in cases:
        plan = plan_memory(request, machine=MachineFacts.mac(gigabytes), preview=preview)
        assert plan.suggestion is not None, plan.verdict()
        found.append(plan.suggestion.settings)
    return [*found, (Change("layers", 40),), changes(force=True)]


def _check_step(step: str) -> None:
    """One step of a node fix names an input that exists, with a value it takes."""
    words = step.split()
    if step.startswith("previews "):
        assert "previews" in ENGINE and words[1] in ("on", "off") and step.endswith("on H3 Engine"), step
        return
    if step.startswith("length_unit "):
        assert "frames" in GENERATE["length_unit"] and words[3] == "frames" and "frames" in GENERATE, step
        assert int(words[4]) > 0
        return
    name, value = words[0], words[1]
    assert name in GENERATE, (step, sorted(GENERATE))
    options = GENERATE[name]
    if options:
        assert value in options, (step, options)
    elif name == "force":
        assert value == "to" and words[2] == "true", step
    elif name in ("int8_row_fc2", "token_reduction"):
        assert value in ("on", "off"), step
    else:
        assert int(value) > 0, step


def test_node_words_name_inputs_the_nodes_have() -> None:
    named = set()
    for settings in _real_settings():
        said = adapter.node_words(settings)
        assert "--" not in said and "=" not in said, said
        for step in said.split(", "):
            for part in step.split(" and "):       # "ssd_streaming on and int8_row_fc2 off": two inputs
                _check_step(part)
        named |= {change.field for change in settings}
    assert {"preview", "ssd_streaming", "int8_row_fc2", "render_width", "render_height", "frames", "layers",
            "force"} <= named


def test_node_words_say_a_reference_kind_as_an_h3_references_option() -> None:
    kinds = [option for item in H3ReferencesNode.define_schema().inputs for option in (getattr(item, "options", None) or [])
             if isinstance(option, str)]
    for kind in ReferenceKind:
        said = adapter.node_words((Change("references", kind),))
        assert said == f"H3 References kind '{describe_kind(kind)}'"
        assert describe_kind(kind) in kinds, (said, kinds)


def test_a_memory_refusal_on_the_node_names_its_inputs() -> None:
    from h3bridge.request import GenerationRequest
    plan = plan_memory(GenerationRequest("x", width=1344, height=768, seconds=15.0, int8_row_fc2=True),
                       machine=MachineFacts.mac(18))
    error = adapter.memory_refusal_in_node_words(plan)
    assert error.hint is not None and error.hint.startswith("set ssd_streaming on and int8_row_fc2 off, render_width ")
    assert error.hint.endswith("; or set force to true on H3 Generate to try anyway") and "--" not in str(error)
    for step in error.hint.removeprefix("set ").split("; or set ")[0].split(", "):
        for part in step.split(" and "):
            _check_step(part)
    with pytest.raises(AssertionError):
        _check_step("no_such_input 3")        # the check itself can fail
