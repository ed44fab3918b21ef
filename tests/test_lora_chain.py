"""A chain of H3 LoRA nodes folds once, in its last node (h3bridge/comfy/lora_chain.py): which
node defers, and the pending chain it hands on. No ComfyUI needed; the nodes themselves, folding
a chain of two on the fixture model, are in test_lora_nodes.py (ComfyUI's python)."""
from __future__ import annotations

from pathlib import Path

import pytest

from h3bridge.comfy.lora_chain import PENDING_PREFIX, PendingChain, consumers, defers_fold
from h3bridge.errors import ModelError
from h3bridge.lora.fold import LoraSpec


def lora_node(model_dir: object, lora: str) -> dict:
    return {"class_type": "H3Lora", "inputs": {"model_dir": model_dir, "lora": lora, "strength": 1.0}}


CHAIN = {"1": lora_node("MiniMax-H3", "a.safetensors"),
         "2": lora_node(["1", 0], "b.safetensors"),
         "3": {"class_type": "H3Engine", "inputs": {"model_dir": ["2", 0], "mode": "one-shot"}},
         "4": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}}}     # A's report, not its model


def test_a_node_feeding_only_h3_lora_nodes_defers_and_the_last_one_folds() -> None:
    assert consumers(CHAIN, "1") == ["H3Lora"] and consumers(CHAIN, "1", 1) == ["PreviewAny"]
    assert defers_fold(CHAIN, "1") is True
    assert defers_fold(CHAIN, "2") is False                 # H3 Engine uses it


def test_a_node_whose_model_is_also_used_elsewhere_or_unknown_folds() -> None:
    also_engine = dict(CHAIN, **{"5": {"class_type": "H3Engine", "inputs": {"model_dir": ["1", 0]}}})
    assert defers_fold(also_engine, "1") is False
    assert defers_fold({"1": lora_node("MiniMax-H3", "a.safetensors")}, "1") is False    # nothing connected
    assert defers_fold(None, "1") is False and defers_fold(CHAIN, None) is False         # graph unknown
    assert consumers(None, "1") is None


def test_a_pending_chain_round_trips_and_a_damaged_one_says_the_fix(tmp_path: Path) -> None:
    chain = PendingChain(tmp_path / "MiniMax-H3", (LoraSpec(tmp_path / "a.safetensors", 1.0),
                                                   LoraSpec(tmp_path / "b b.safetensors", -0.5)))
    text = chain.encode()
    assert text.startswith(PENDING_PREFIX) and PendingChain.decode(text) == chain
    assert chain.describe() == "MiniMax-H3 + a.safetensors x1 + b b.safetensors x-0.5"
    assert PendingChain.decode(str(tmp_path / "MiniMax-H3")) is None       # a model folder setting
    with pytest.raises(ModelError, match="damaged H3 LoRA chain") as damaged:
        PendingChain.decode(PENDING_PREFIX + "{not json")
    assert "H3 LoRA node's model_dir output" in (damaged.value.hint or "")
