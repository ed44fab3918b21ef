"""ComfyUI V3 node "H3 LoRA": fold a LoRA from ComfyUI's models/loras into the model (h3bridge.lora).

Only translates: the model folder setting (a name under models/h3 or a path, as H3 Engine takes
it) and a LoRA name from models/loras become paths; the folded model's folder comes back as the
string H3 Engine's model_dir takes. The fold, its cache by content and its refusals are the
library's (lora/cache.py). A chain folds once, in its last node (lora_chain.py). What survived
the fold is shown on the node itself, with what each figure means. Registered by
H3BridgeExtension in nodes.py.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import comfy.model_management
import comfy.utils
import folder_paths
from comfy_api.latest import io, ui

from ..cancel import CancelToken
from ..lora.cache import cache_folder, cached_fold, describe
from ..lora.fold import LoraSpec, plan_fold
from ..model.fold_record import read_provenance
from ..fixes import said
from ..model.fold_survival import OVERALL, format_report, warnings
from . import adapter
from .lora_chain import PendingChain, defers_fold
from .shared import CATEGORY, model_roots, notice_on_node, running_prompt, user_facing_errors

LORA_FOLDER = "loras"            # ComfyUI/models/loras
# With none installed, the one option says so (an empty list shows as "undefined" in the frontend).
NO_LORA_INSTALLED = f"(no LoRA in models/{LORA_FOLDER})"
PROGRESS_STEPS = 1000


# Under the survival table on the node: "unchanged 2.6 %" alone reads like "2.6 % of the LoRA got
# lost" (issue 30); each figure in one line (model/fold_survival.py defines them).
SURVIVAL_LEGEND = "\n".join([
    "how to read it (per module class; 'overall' is all of them):",
    "  rho        size of the LoRA's update against the weights it changes (bf16 keeps updates above ~1e-3 best)",
    "  kept       share of the update the folded bf16 weights hold: 1.000 = all of it (below 0.9: a warning says the fix)",
    "  noise      error bf16 rounding added, relative to the update: 0 = none",
    "  unchanged  share of the weights the update did not move at all (rounded back to their old value); "
    "not a share of the LoRA lost: 'kept' says that",
])


def _lora_path(name: str) -> Path:
    if name == NO_LORA_INSTALLED:
        from ..errors import LoraError
        folders = ", ".join(folder_paths.get_folder_paths(LORA_FOLDER)) or f"ComfyUI/models/{LORA_FOLDER}"
        raise LoraError(f"lora: no LoRA is installed (looked in {folders})",
                        hint=f"put a MiniMax-H3 LoRA (.safetensors) in {folders}, refresh the page and pick it in lora")
    return Path(folder_paths.get_full_path_or_raise(LORA_FOLDER, name))


def _node_id(cls: type[io.ComfyNode]) -> str | None:
    return cls.hidden.unique_id if cls.hidden else None


def _defers(cls: type[io.ComfyNode]) -> bool:
    """Only other H3 LoRA nodes use this node's model_dir: the chain's last node folds. Asked of
    the running prompt in execute and in fingerprint_inputs alike, so the decision is part of the
    cache key (ComfyUI gives fingerprint_inputs no PROMPT)."""
    return defers_fold(running_prompt(), _node_id(cls))


def _report(folded: Path) -> str:
    """What the node shows: first what survived and what the figures mean (the box on the node shows
    its first lines), then the fold's record without that table again, then the cache."""
    record = read_provenance(folded)
    if record is None:
        return "\n".join([str(folded), describe(cache_folder(folded.parent))])
    head: list[str] = []
    table = ["  " + line for line in format_report(record.survival, record.rounding).splitlines()] \
        if record.survival else []
    if table:
        overall = next(row for row in record.survival if row.module_class == OVERALL)
        head.append(f"the folded weights hold {overall.kept:.1%} of the LoRA's update (bf16 rounding noise "
                    f"{overall.noise:.0%} of it); {overall.unchanged:.1%} of the weights it targets kept their value")
        head += [line[2:] for line in table]
        head += [f"warning: {said(text, adapter.node_words)}" for text in warnings(record.survival, record.rounding)]
        head.append(SURVIVAL_LEGEND)
    shown = set(table)
    rest = [line for line in record.summary(adapter.node_words).splitlines() if line not in shown and not line.startswith("  warning: ")]
    return "\n".join([*head, f"folded model: {folded}", *rest, describe(cache_folder(folded.parent))])


class H3LoraNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3Lora",
            display_name="H3 LoRA",
            category=CATEGORY,
            description="Fold a LoRA into a copy of the MiniMax-H3 model (h3 has no LoRA runtime): only the targeted "
                        "transformer tensors are rewritten, every other file is cloned or linked. Chain several H3 "
                        "LoRA nodes to stack LoRAs (folded in one pass, in order). The result is kept by content, "
                        "so queuing the same model + LoRAs + strengths again costs nothing; a node whose model_dir "
                        "feeds only other H3 LoRA nodes folds nothing itself. Connect model_dir to "
                        "H3 Engine's model_dir. A step-distillation LoRA (the Turbo LoRA) wants the turbo preset. "
                        "Folds live in .h3bridge-lora beside the base model, capped at H3BRIDGE_LORA_CACHE_LIMIT "
                        "(default 128G, least recently used out first); the node shows how much of the LoRA "
                        "survived bf16 rounding (and what the figures mean) and how much space the folds take.",
            inputs=[
                io.String.Input("model_dir", default=adapter.DEFAULT_MODEL_NAME,
                                tooltip=f"The base model: a folder name under ComfyUI/models/{adapter.MODEL_FOLDER}/, "
                                        "an absolute path, or the model_dir output of another H3 LoRA node (a "
                                        "chain is folded once, by its last node)."),
                io.Combo.Input("lora", options=folder_paths.get_filename_list(LORA_FOLDER) or [NO_LORA_INSTALLED],
                               tooltip="A LoRA for MiniMax-H3's transformer from ComfyUI/models/loras (PEFT "
                                       "lora_A/lora_B or kohya lora_down/lora_up with alpha)."),
                io.Float.Input("strength", default=1.0, min=-4.0, max=4.0, step=0.05,
                               tooltip="How much of the LoRA to fold in: 1.0 as trained, 0 none, negative subtracts."),
            ],
            outputs=[io.String.Output(display_name="model_dir",
                                      tooltip="The folded model's folder, for H3 Engine's model_dir or the next H3 LoRA."),
                     io.String.Output(display_name="report",
                                      tooltip="How much of the LoRA survived the fold (per module class: rho, kept, "
                                              "noise, unchanged, with what each means), and where the folds live "
                                              "and the space they take. Also shown on the node itself.")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def fingerprint_inputs(cls, model_dir: str, lora: str, strength: float) -> Any:
        # The result depends on the LoRA's bytes, not its name: a replaced file folds again.
        # Whether this node folds or hands the chain on is part of what it returns.
        defers = _defers(cls)
        try:
            status = os.stat(_lora_path(lora))
            return (model_dir, lora, strength, status.st_size, status.st_mtime_ns, defers)
        except Exception:   # noqa: BLE001 - execute reports a missing LoRA with its fix
            return (model_dir, lora, strength, defers)

    @classmethod
    @user_facing_errors
    def execute(cls, model_dir: str, lora: str, strength: float) -> io.NodeOutput:
        earlier = PendingChain.decode(model_dir)
        base = earlier.base if earlier is not None else adapter.resolve_model_dir(model_dir, model_roots())
        stack = (*(earlier.loras if earlier is not None else ()), LoraSpec(_lora_path(lora), float(strength)))
        if _defers(cls):
            # The LoRA's refusals (no matching tensor, a wrong shape) still show on this node, now:
            # the plan reads headers only.
            plan_fold(base, stack, check_values=False)
            chain = PendingChain(base, stack)
            report = (f"not folded here: only H3 LoRA nodes use this model_dir, so the chain's last H3 LoRA "
                      f"folds {chain.describe()} in one pass (one fold written: the one the generation uses)")
            notice_on_node(_node_id(cls))(report)
            return io.NodeOutput(chain.encode(), report, ui=ui.PreviewText(report))
        bar = comfy.utils.ProgressBar(PROGRESS_STEPS, node_id=_node_id(cls))
        folded = cached_fold(base, stack,
                             on_progress=lambda event: bar.update_absolute(int(event.fraction * PROGRESS_STEPS),
                                                                           PROGRESS_STEPS),
                             cancel=CancelToken(check=comfy.model_management.processing_interrupted))
        report = _report(folded)
        notice_on_node(_node_id(cls))(report)      # on the node itself, no Preview as Text needed
        return io.NodeOutput(str(folded), report, ui=ui.PreviewText(report))


LORA_NODES: list[type[io.ComfyNode]] = [H3LoraNode]

__all__ = ["H3LoraNode", "LORA_NODES", "NO_LORA_INSTALLED", "SURVIVAL_LEGEND"]
