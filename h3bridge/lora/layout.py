"""Where a LoRA's rows land in the checkpoint h3 reads: the fused QKV layout, and diffusers' split Q/K/V.

The official MiniMax-H3 checkpoint, which h3.c runs as it is, stores each block's
`attn.qkv_proj.weight` rows interleaved per attention head ("per-head"): row h*3*D + s*D + d for
head h, slot s in (Q, K, V), d < D. h3.c at 8974cc0: h3_shaders.metal's QKV kernels read
`q_base = row_base + head * head_dim * 3; k_base = q_base + head_dim; v_base = k_base + head_dim`
when `grouped` is set, and every caller in h3_dit.c sets it (h3_gpu_grouped_qkv_rope_bf16 for the
token refiner, h3_gpu_grouped_qkv_linear_rope_bf16/_int8 for the DiT blocks, both pass grouped=1
in h3_gpu.m); its README: "The released checkpoint stores DiT QKV rows interleaved per attention
head".

The engines LoRAs are trained in hold the same weights "flat", [all Q | all K | all V]: row
s*H*D + h*D + d. ComfyUI (yzkee/ComfyUI 783545f, comfy/ldm/minimax/model.py, Attention.forward:
`q, k, v = self.qkv_proj(x).split(self.heads * self.head_dim, dim=-1)`); SGLang
(sgl-project/sglang a6c8138, python/sglang/multimodal_gen/runtime/models/dits/minimax_h3.py,
`_reorder_grouped_qkv_to_qkv` and `_copy_grouped_qkv_tp_shard` reorder the official rows to flat
at load). So a LoRA's qkv up/B rows are flat unless it says otherwise, and are permuted to
per-head before they are added (A, alpha and strength are unchanged: a row permutation of B is a
row permutation of B @ A).

`mlp.fc1.weight` is [gate | up] halves in both: h3.c's h3_swiglu_bf16 (h3_shaders.metal) reads
gate = fused[row * width * 2 + column], up = fused[... + width + column]; ComfyUI's swiglu
(comfy/ops.py `_swiglu_eager`: `gate, up = x.chunk(2, dim=-1)`) and SGLang's `_silu_mul`
(`gate, up = hidden.chunk(2, dim=-1)`). Same order, so fc1 rows are added in place.

Heads and head size come from the checkpoint itself: q_norm.weight's length is the head size
(one RMSNorm weight per head dimension), the qkv rows / 3 / head size the heads (as ComfyUI's
model_detection.py derives them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..model.safetensors import TensorInfo

FLAT, PER_HEAD = "flat", "per-head"
QKV_LAYOUTS = (FLAT, PER_HEAD)
QKV_SUFFIX = "attn.qkv_proj.weight"
SLOT_NAMES = ("to_q", "to_k", "to_v")            # diffusers' separate projections, in slot order
# what a LoRA's own metadata may say about its rows (key -> value spellings)
LAYOUT_METADATA_KEYS = ("h3bridge.qkv_layout", "qkv_layout", "h3.qkv_layout")
_LAYOUT_WORDS = {"flat": FLAT, "per-head": PER_HEAD, "per_head": PER_HEAD, "interleaved": PER_HEAD,
                 "grouped": PER_HEAD, "official": PER_HEAD}


@dataclass(frozen=True)
class HeadShape:
    heads: int
    head_dim: int

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim


def is_qkv(target: str) -> bool:
    return target.endswith(QKV_SUFFIX)


def head_shape(tensors: Mapping[str, TensorInfo], qkv_target: str) -> HeadShape | None:
    """The attention's heads and head size, from the checkpoint's q_norm.weight and qkv rows;
    None when the checkpoint does not say (no q_norm, or rows that are not 3 * heads * head size)."""
    norm = tensors.get(qkv_target[: -len(QKV_SUFFIX)] + "attn.q_norm.weight")
    qkv = tensors.get(qkv_target)
    if norm is None or qkv is None or len(norm.shape) != 1 or not qkv.shape or norm.shape[0] <= 0:
        return None
    head_dim = norm.shape[0]
    rows = qkv.shape[0]
    if rows % (3 * head_dim):
        return None
    return HeadShape(rows // (3 * head_dim), head_dim)


def flat_to_per_head(shape: HeadShape) -> np.ndarray:
    """For each flat row s*H*D + h*D + d (in order), its per-head row h*3*D + s*D + d."""
    slot, head, dim = np.unravel_index(np.arange(3 * shape.inner), (3, shape.heads, shape.head_dim))
    return (head * 3 * shape.head_dim + slot * shape.head_dim + dim).astype(np.int64)


def slot_to_per_head(shape: HeadShape, slot: int) -> np.ndarray:
    """For each row h*D + d of a separate Q (slot 0), K (1) or V (2) projection, its per-head qkv row."""
    head, dim = np.unravel_index(np.arange(shape.inner), (shape.heads, shape.head_dim))
    return (head * 3 * shape.head_dim + slot * shape.head_dim + dim).astype(np.int64)


def layout_from_metadata(metadata: Mapping[str, str]) -> str | None:
    """The qkv layout a LoRA's metadata names, if it names one."""
    for key in LAYOUT_METADATA_KEYS:
        word = str(metadata.get(key, "")).strip().lower()
        if word in _LAYOUT_WORDS:
            return _LAYOUT_WORDS[word]
    return None


def split_slot(module: str) -> tuple[str, int | None]:
    """diffusers' `...attn.to_q` (or kohya's flattened `..._attn_to_q`): (the fused module's name,
    slot); anything else: (module, None)."""
    for separator in (".", "_"):
        for slot, name in enumerate(SLOT_NAMES):
            if module.endswith(separator + "attn" + separator + name):
                return module[: -len(name)] + "qkv_proj", slot
    return module, None
