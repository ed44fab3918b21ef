"""The fold's qkv and fc1 layouts checked against upstream h3.c's own source at the pinned commit
(the pristine archive, read only; skipped without it): the row the Metal kernel reads for each
(slot, head, dimension) is the row h3bridge moves a flat LoRA's row to, every QKV kernel h3_dit.c
calls is a grouped one, and fc1's gate half comes first (so fc1 rows stay in place)."""
from __future__ import annotations

import re


from h3bridge.lora.layout import HeadShape, flat_to_per_head

from upstream_helpers import upstream_source_text_or_skip



def _upstream(name: str) -> str:
    return upstream_source_text_or_skip(name)


def test_the_kernels_grouped_rows_are_where_the_fold_puts_a_flat_loras_rows() -> None:
    shaders = _upstream("h3_shaders.metal")
    branches = re.findall(r"if \(args\.grouped\) \{\s*q_base = ([^;]+);\s*k_base = ([^;]+);\s*v_base = ([^;]+);",
                          shaders)
    assert branches, "upstream's grouped QKV branch was not found"
    for heads, head_dim in ((2, 4), (56, 128), (3, 5)):
        expected = flat_to_per_head(HeadShape(heads, head_dim))
        for q_expr, k_expr, v_expr in set(branches):
            for head in range(heads):
                names = {"row_base": 0, "head": head, "args_head_dim": head_dim}
                q_base = eval(q_expr.replace("args.", "args_"), {}, names)          # noqa: S307 - upstream's own arithmetic
                k_base = eval(k_expr.replace("args.", "args_"), {}, {**names, "q_base": q_base})  # noqa: S307
                v_base = eval(v_expr.replace("args.", "args_"), {}, {**names, "k_base": k_base, "q_base": q_base})  # noqa: S307
                for slot, base in enumerate((q_base, k_base, v_base)):
                    for dim in range(head_dim):
                        flat_row = slot * heads * head_dim + head * head_dim + dim
                        assert expected[flat_row] == base + dim, (heads, head_dim, slot, head, dim)


def test_every_qkv_kernel_the_dit_calls_is_grouped() -> None:
    dit = _upstream("h3_dit.c")
    calls = set(re.findall(r"\b(h3_gpu_\w*qkv\w*)\(", dit))
    assert calls == {"h3_gpu_grouped_qkv_rope_bf16", "h3_gpu_grouped_qkv_linear_rope_bf16",
                     "h3_gpu_grouped_qkv_linear_rope_int8"}, calls
    gpu = _upstream("h3_gpu.m")
    wrapper = gpu.split("int h3_gpu_grouped_qkv_rope_bf16(", 1)[1].split("\n}\n", 1)[0]
    assert re.search(r"h3_gpu_qkv_rope_bf16_layout\([^;]*rope_half, 1, epsilon\)", wrapper)   # grouped = 1
    linear = gpu.split("int h3_gpu_grouped_qkv_linear_rope_bf16(", 1)[1].split("\n}\n", 1)[0]
    assert "h3_gpu_grouped_qkv_rope_bf16(" in linear
    shaders = _upstream("h3_shaders.metal")
    assert "Checkpoint columns are grouped as\n * [head, q/k/v, dimension]" in shaders            # the int8 path
    assert "64-column tiles of every head align exactly with Q0/Q1/K0/K1/V0/V1" in shaders       # the M5 bf16 path


def test_fc1_is_gate_then_up_so_its_rows_stay_in_place() -> None:
    shaders = _upstream("h3_shaders.metal")
    kernel = shaders.split("kernel void h3_swiglu_bf16(", 1)[1].split("\n}\n", 1)[0]
    assert re.search(r"float gate = h3_bf16_to_f32\(fused\[base \+ column\]\)", kernel)
    assert re.search(r"float up = h3_bf16_to_f32\(fused\[base \+ args\.width \+ column\]\)", kernel)
