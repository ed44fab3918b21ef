"""ComfyUI V3 node "H3 LoRA": fold a LoRA from ComfyUI's models/loras into the model (h3bridge.lora).

Only translates: the model folder setting (a name under models/h3 or a path, as H3 Engine takes
it) and a LoRA name from models/loras become paths; the folded model's folder comes back as the
string H3 Engine's model_dir takes. The fold, its cache by content and its refusals are the
library's (lora/cache.py). Registered by H3BridgeExtension in nodes.py.
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
from ..lora.fold import LoraSpec
from ..model.fold_record import read_provenance
from . import adapter
from .shared import CATEGORY, model_roots, user_facing_errors

LORA_FOLDER = "loras"            # ComfyUI/models/loras
PROGRESS_STEPS = 1000


def _lora_path(name: str) -> Path:
    return Path(folder_paths.get_full_path_or_raise(LORA_FOLDER, name))


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
                        "so queuing the same model + LoRAs + strengths again costs nothing. Connect model_dir to "
                        "H3 Engine's model_dir. A step-distillation LoRA (the Turbo LoRA) wants the turbo preset. "
                        "Folds live in .h3bridge-lora beside the base model, capped at H3BRIDGE_LORA_CACHE_LIMIT "
                        "(default 128G, least recently used out first); the report output says how much of the "
                        "LoRA survived bf16 rounding and how much space the folds take.",
            inputs=[
                io.String.Input("model_dir", default=adapter.DEFAULT_MODEL_NAME,
                                tooltip=f"The base model: a folder name under ComfyUI/models/{adapter.MODEL_FOLDER}/, "
                                        "an absolute path, or the model_dir output of another H3 LoRA node."),
                io.Combo.Input("lora", options=folder_paths.get_filename_list(LORA_FOLDER),
                               tooltip="A LoRA for MiniMax-H3's transformer from ComfyUI/models/loras (PEFT "
                                       "lora_A/lora_B or kohya lora_down/lora_up with alpha)."),
                io.Float.Input("strength", default=1.0, min=-4.0, max=4.0, step=0.05,
                               tooltip="How much of the LoRA to fold in: 1.0 as trained, 0 none, negative subtracts."),
            ],
            outputs=[io.String.Output(display_name="model_dir",
                                      tooltip="The folded model's folder, for H3 Engine's model_dir or the next H3 LoRA."),
                     io.String.Output(display_name="report",
                                      tooltip="How much of the LoRA survived the fold (per module class: rho, kept, "
                                              "noise, unchanged), and where the folds live and the space they take.")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def fingerprint_inputs(cls, model_dir: str, lora: str, strength: float) -> Any:
        # The result depends on the LoRA's bytes, not its name: a replaced file folds again.
        try:
            status = os.stat(_lora_path(lora))
            return (model_dir, lora, strength, status.st_size, status.st_mtime_ns)
        except Exception:   # noqa: BLE001 - execute reports a missing LoRA with its fix
            return (model_dir, lora, strength)

    @classmethod
    @user_facing_errors
    def execute(cls, model_dir: str, lora: str, strength: float) -> io.NodeOutput:
        base = adapter.resolve_model_dir(model_dir, model_roots())
        bar = comfy.utils.ProgressBar(PROGRESS_STEPS, node_id=cls.hidden.unique_id if cls.hidden else None)
        folded = cached_fold(base, [LoraSpec(_lora_path(lora), float(strength))],
                             on_progress=lambda event: bar.update_absolute(int(event.fraction * PROGRESS_STEPS),
                                                                           PROGRESS_STEPS),
                             cancel=CancelToken(check=comfy.model_management.processing_interrupted))
        record = read_provenance(folded)
        report = "\n".join([record.summary() if record is not None else str(folded),
                            describe(cache_folder(folded.parent))])
        return io.NodeOutput(str(folded), report, ui=ui.PreviewText(report))


LORA_NODES: list[type[io.ComfyNode]] = [H3LoraNode]

__all__ = ["H3LoraNode", "LORA_NODES"]
