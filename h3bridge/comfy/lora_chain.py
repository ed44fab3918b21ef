"""A chain of H3 LoRA nodes writes one fold: the one a generation uses (no ComfyUI import here).

A H3 LoRA node whose model_dir output feeds only other H3 LoRA nodes folds nothing: it hands on
a *pending chain* (the base model and the LoRAs so far, in order) and the chain's last node, the
one whose output something else uses (H3 Engine), folds base + every LoRA in one pass
(lora/cache.py's cached_fold). Before, node A folded base + A (never used) and node B base + A + B:
double the fold time and the disk on a 130 GiB model.

The pending chain travels as model_dir's string (ComfyUI's wire type for it): PENDING_PREFIX and
JSON. Whether a node defers is decided from the running prompt both when it runs and in its cache
key (H3LoraNode.fingerprint_inputs), so a pending chain cached while only H3 LoRA nodes used it is
never handed to H3 Engine after the graph changes (the node runs again and folds); with the graph
unknown, a node always folds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ModelError
from ..lora.fold import LoraSpec

LORA_NODE_ID = "H3Lora"
PENDING_PREFIX = "h3bridge-lora-chain:"
MODEL_DIR_OUTPUT = 0


@dataclass(frozen=True)
class PendingChain:
    """Base model + LoRAs (in order) that the chain's last H3 LoRA node folds in one pass."""

    base: Path
    loras: tuple[LoraSpec, ...]

    def encode(self) -> str:
        return PENDING_PREFIX + json.dumps({"base": str(self.base),
                                            "loras": [[str(spec.path), spec.strength] for spec in self.loras]})

    @classmethod
    def decode(cls, text: str) -> "PendingChain | None":
        """The chain a model_dir string carries, or None for a model folder setting."""
        if not text.startswith(PENDING_PREFIX):
            return None
        try:
            data = json.loads(text[len(PENDING_PREFIX):])
            return cls(Path(data["base"]), tuple(LoraSpec(Path(path), float(strength))
                                                 for path, strength in data["loras"]))
        except (ValueError, KeyError, TypeError) as error:
            raise ModelError(f"model_dir holds a damaged H3 LoRA chain ({error})",
                             hint="connect model_dir to an H3 LoRA node's model_dir output or give a "
                                  "model folder, and queue the graph again") from None

    def describe(self) -> str:
        loras = " + ".join(f"{spec.path.name} x{spec.strength:g}" for spec in self.loras)
        return f"{self.base.name} + {loras}"


def consumers(prompt: Mapping[str, Any] | None, node_id: str | None,
              output_index: int = MODEL_DIR_OUTPUT) -> list[str] | None:
    """The class_type of every node input linked to output `output_index` of `node_id` in the
    API-format `prompt` (one entry per link); None when the graph is unknown."""
    if not prompt or node_id is None:
        return None
    wanted, found = str(node_id), []
    for node in prompt.values():
        if not isinstance(node, Mapping):
            continue
        for value in (node.get("inputs") or {}).values():
            if (isinstance(value, (list, tuple)) and len(value) == 2 and str(value[0]) == wanted
                    and value[1] == output_index):
                found.append(str(node.get("class_type")))
    return found


def defers_fold(prompt: Mapping[str, Any] | None, node_id: str | None) -> bool:
    """True when this H3 LoRA node's model_dir feeds H3 LoRA nodes only (at least one): the next
    node folds. An unknown graph or an unconnected output folds here (never a pending chain
    where a model folder is needed)."""
    found = consumers(prompt, node_id)
    return bool(found) and all(kind == LORA_NODE_ID for kind in found)


__all__ = ["LORA_NODE_ID", "PENDING_PREFIX", "PendingChain", "consumers", "defers_fold"]
