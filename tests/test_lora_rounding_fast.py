"""The fold's fast bf16 rounding (bf16.py: float32 bits + half a step, or + the dither, high halves
kept) against independent references, on inputs placed exactly on and just beside the rounding
boundaries: bf16 midpoints (ties to even), values that float64 puts off a midpoint but float32
rounds onto it, dither thresholds, subnormals, overflow, signed zeros."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lora_helpers import (read_tensor_bytes, reference_dither, reference_exact, reference_fold, set_block_elements,
                          tensor_shapes, use_fold_kernel, write_lora)
import model_helpers
from h3bridge.lora import fold as fold_module
from h3bridge.lora import fold_model, plan_fold
from h3bridge.lora.bf16 import float64_to_bf16, float64_to_bf16_stochastic
from lora_helpers import reference_bf16

template = model_helpers.template

FC1 = "blocks.0.mlp.fc1.weight"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def _bf16_bits_to_float64(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


def _boundary_values(rng: np.random.Generator) -> np.ndarray:
    """bf16 midpoints of every binade (subnormal to the largest), each exactly, one and two float64
    steps beside it (float32 rounds those onto the midpoint), and one float32 step beside it."""
    kept = rng.integers(0, 0x7F7F, 30000).astype(np.uint32)          # a finite bf16 below the largest
    kept[:254] = np.arange(254, dtype=np.uint32) << 7                   # every exponent, mantissa 0
    sign = rng.integers(0, 2, kept.size).astype(np.uint32) << 31
    midpoint32 = ((kept << 16) | 0x8000 | sign).view(np.float32)
    midpoint = midpoint32.astype(np.float64)
    up, down = np.nextafter(midpoint, np.inf), np.nextafter(midpoint, -np.inf)
    beside32 = [np.nextafter(midpoint32, np.float32(s)).astype(np.float64) for s in (np.inf, -np.inf)]
    edges = np.array([0.0, -0.0, 2.0**-149, -(2.0**-149), 2.0**-150, 3 * 2.0**-150, 2.0**-150 * (1 + 2.0**-40),
                      3.3895313892515355e38, 3.3961e38, 3.3962e38, np.float64(np.float32(3.3961776e38)),
                      3.4028234663852886e38, -3.4e38, 1e-40, -1e-41])
    return np.concatenate([midpoint, up, down, np.nextafter(up, np.inf), *beside32, edges,
                           rng.standard_normal(20000) * 10.0 ** rng.uniform(-44, 37, 20000)])


def test_nearest_rounding_equals_the_table_search_on_and_beside_every_kind_of_midpoint() -> None:
    values = _boundary_values(np.random.default_rng(0))
    expected = reference_bf16(values)
    assert np.array_equal(float64_to_bf16(values), expected)
    # float32 input is rounded as the float32 values it holds
    as32 = values.astype(np.float32)
    assert np.array_equal(float64_to_bf16(as32), reference_bf16(as32.astype(np.float64)))
    # a 2-d block keeps its shape
    assert np.array_equal(float64_to_bf16(values[:600].reshape(20, 30)), expected[:600].reshape(20, 30))


def test_stochastic_rounding_carries_exactly_at_the_dither_threshold() -> None:
    """position + dither == 65536 rounds up, one less rounds down (bits + r, the high half kept)."""
    rng = np.random.default_rng(1)
    kept = rng.integers(0, 0x7F7F, 20000).astype(np.uint32) | (rng.integers(0, 2, 20000).astype(np.uint32) << 15)
    dither = rng.integers(1, 65536, 20000).astype(np.uint16)
    for offset in (0, -1, 1):
        low = (65536 - dither.astype(np.int64) + offset) % 65536
        values = ((kept << 16) | low.astype(np.uint32)).view(np.float32)
        expected = ((values.view(np.uint32).astype(np.uint64) + dither) >> 16).astype(np.uint16)
        assert np.array_equal(float64_to_bf16_stochastic(values.astype(np.float64), dither), expected)
        carried = expected != kept
        assert carried.all() if offset >= 0 else not carried.any()


@pytest.mark.parametrize("rounding, kernel", [("nearest", "numpy"), ("stochastic", "numpy"), ("stochastic", "compiled")])
def test_fold_on_rounding_boundaries_equals_the_float64_reference(template: Path, tmp_path: Path, rounding: str,
                                                                 kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A LoRA whose update puts W + dW exactly on bf16 midpoints (both directions), 2**-20 of a half
    step beside them (float32 rounds those onto the midpoint), 2**-14 beside them and at every
    position between two bf16 values: the fold's bytes are the reference's, block by block."""
    shapes = tensor_shapes(template)
    shard, dtype, (rows, columns) = shapes[FC1]
    assert dtype == "BF16"
    weight = _bf16_bits_to_float64(np.frombuffer(read_tensor_bytes(shard, FC1), "<u2")).reshape(rows, columns)
    _, exponent = np.frexp(np.where(weight == 0, 1.0, np.abs(weight)))
    step = np.ldexp(1.0, np.maximum(exponent - 1, -126) - 7)           # bf16 spacing at W (W = 0: at 1.0)
    rng = np.random.default_rng(2)
    kind = rng.integers(0, 6, (rows, columns))
    fraction = np.choose(kind, [0.5, -0.5, 0.5 * (1 + 2.0**-20), -0.5 * (1 - 2.0**-20), 0.5 * (1 + 2.0**-14),
                                rng.integers(0, 65536, (rows, columns)) / 65536.0])
    delta = (fraction * step).astype(np.float32)
    assert np.array_equal(delta.astype(np.float64), fraction * step)    # the update is exactly this
    # rank = columns and down = identity: up @ down is up itself, exactly
    up, down = delta, np.eye(columns, dtype=np.float32)
    write_lora(tmp_path / "edge.safetensors", {"diffusion_model.blocks.0.mlp.fc1.lora_A.weight": down,
                                                "diffusion_model.blocks.0.mlp.fc1.lora_B.weight": up})
    use_fold_kernel(monkeypatch, kernel)
    # several blocks, a short last one; the compiled kernels take the product a row at a time
    set_block_elements(monkeypatch, 3 * columns, product_elements=columns)
    plan = plan_fold(template, [tmp_path / "edge.safetensors"], rounding=rounding)
    fold_model(template, [tmp_path / "edge.safetensors"], tmp_path / "out", progress=False, plan=plan)
    written = np.frombuffer(read_tensor_bytes(tmp_path / "out" / shard.relative_to(template), FC1), "<u2")
    before = read_tensor_bytes(shard, FC1)
    if rounding == "nearest":
        assert written.tobytes() == reference_fold(before, dtype, (rows, columns), [(up, down, 1.0)])
        assert (written != np.frombuffer(before, "<u2")).any()
        return
    exact = reference_exact(before, dtype, (rows, columns), [(up, down, 1.0)]).reshape(-1)
    job_shard = next(s for s in plan.shards.values() if FC1 in s.tensors)
    seed = fold_module._FoldRun(plan, plan.content_key()).seed(job_shard, job_shard.tensors[FC1].tensor)
    bits = exact.astype(np.float32).view(np.uint32).astype(np.uint64)  # the float32 nearest the exact value
    expected = ((bits + reference_dither(seed, exact.size)) >> 16).astype(np.uint16)   # the dither by its rule
    assert np.array_equal(written, expected)
