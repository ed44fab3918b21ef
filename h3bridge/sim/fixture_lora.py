"""A small LoRA for the fixture model, laid out as published MiniMax-H3 LoRAs are, so `h3bridge
lora fold` can be tried on any machine (`h3-sim-model DIR --lora FILE`).

PEFT form (`diffusion_model.MODULE.lora_A.weight` [rank, in] / `lora_B.weight` [out, rank], no
alpha, as larryvrh's Turbo LoRA), over every DiT and token-refiner block's qkv_proj, out_proj, fc1
and fc2, with the qkv B rows in the flat [all Q | all K | all V] order (ComfyUI's and SGLang's,
see h3bridge/lora/layout.py), said in the file's metadata. Its update is ~3e-4 of the weights,
the size of a step-distillation LoRA's, so the fold's survival report has something to show.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ..safeio.outputs import staged_output
from .fixture import TINY, Dims, transformer_tensors

RANK = 2
TARGETS = ("attn.qkv_proj.weight", "attn.out_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight")
METADATA = {"format": "pt", "qkv_layout": "flat", "h3bridge.fixture": "a demo LoRA for the h3-sim fixture model"}
RELATIVE_UPDATE = 3e-4
FIXTURE_WEIGHT_STD = 0.02          # fixture.tensor_bytes: standard normal * 0.02


def fixture_lora_tensors(dims: Dims = TINY, seed: int = 21) -> dict[str, np.ndarray]:
    """name -> float32 array, in a stable order."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for spec in transformer_tensors(dims):
        if not spec.name.endswith(TARGETS) or not spec.name.startswith(("blocks.", "token_refiner.blocks.")):
            continue
        out, inner = spec.shape
        down = rng.standard_normal((RANK, inner))
        up = rng.standard_normal((out, RANK))
        # ||up @ down|| ~ sqrt(out * inner * RANK): scaled to RELATIVE_UPDATE of ||W||
        scale = np.sqrt(RELATIVE_UPDATE * FIXTURE_WEIGHT_STD / np.sqrt(RANK))
        module = "diffusion_model." + spec.name.removesuffix(".weight")
        tensors[module + ".lora_A.weight"] = (down * scale).astype(np.float32)
        tensors[module + ".lora_B.weight"] = (up * scale).astype(np.float32)
    return tensors


def write_fixture_lora(path: str | Path, dims: Dims = TINY) -> Path:
    """Write the demo LoRA (F32 safetensors, as the `safetensors` library lays one out)."""
    path = Path(path)
    tensors = fixture_lora_tensors(dims)
    header: dict[str, object] = {"__metadata__": METADATA}
    offset = 0
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    with staged_output(path, overwrite=True, field="the LoRA fixture", create=False) as staging:
        with open(staging.staged, "xb") as handle:
            handle.write(struct.pack("<Q", len(raw)) + raw)
            for array in tensors.values():
                handle.write(array.astype("<f4").tobytes())
        staging.publish()
    return path
