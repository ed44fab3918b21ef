"""What the fold's speed work must not change (issue 21, item 5): the dither is the stream its rule
states, the bytes and the survival report are the same for any number of threads (and the bytes
for any block size), and the survival report equals sums over the written bytes."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lora_helpers import (FOLD_KERNELS, decode, low_rank, reference_dither, reference_exact, read_tensor_bytes,
                          set_block_elements, tensor_shapes, use_fold_kernel, write_lora)
import model_helpers
from h3bridge.errors import LoraError
from h3bridge.lora import LoraSpec, fold_model
from h3bridge.lora import fold as fold_module
from h3bridge.lora.bf16 import dither16
from h3bridge.model import fold_survival

template = model_helpers.template
DEFAULT_CHUNK = fold_module.CHUNK_ELEMENTS

TARGETS = [f"blocks.{i}.{kind}" for i in range(0, 50, 3)
           for kind in ("attn.qkv_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight", "attn.out_proj.weight")]
TARGETS += ["token_refiner.blocks.0.attn.qkv_proj.weight", "video_patch_proj.weight"]      # refiner; an F32 target


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def _lora(path: Path, shapes: dict, seed: int, scale: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A per-head (rows in place) PEFT LoRA over TARGETS whose update is `scale` of a low-rank
    product: (up, down) per target."""
    rng = np.random.default_rng(seed)
    tensors, truth = {}, {}
    for target in TARGETS:
        out, inner = shapes[target][2]
        up, down = low_rank(rng, out, inner, 4, scale)
        tensors[f"diffusion_model.{target.removesuffix('.weight')}.lora_A.weight"] = down
        tensors[f"diffusion_model.{target.removesuffix('.weight')}.lora_B.weight"] = up
        truth[target] = (up, down)
    write_lora(path, tensors, metadata={"format": "pt", "qkv_layout": "per-head"})
    return truth


def _shards(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "FL2VA/transformer").glob("*.safetensors"))}


def test_the_dither_is_the_stream_its_rule_states() -> None:
    """dither16 and the fold's block draws (odd and even first elements, any length) equal the
    rule computed element by element in 64-bit integers (tests/lora_helpers.py)."""
    for seed in (0, 1, 2**64 - 1, 0x0123456789ABCDEF_FEDCBA9876543210, 12345 << 70):
        assert np.array_equal(dither16(seed, 0, 4097), reference_dither(seed, 4097)), seed
        for start, count in ((1, 1), (7, 333), (2**31 + 5, 64), (2**33 - 10, 10), (1000, 0)):
            assert np.array_equal(dither16(seed, start, count), reference_dither(seed, count, start)), (seed, start)
    from h3bridge.lora.bf16 import Dither
    stream = Dither(99, 600)
    words, scratch = np.empty(302, np.uint32), np.empty(302, np.uint32)
    blocks = [stream.draw(start, 600, words, scratch).copy() for start in (0, 600, 1200)]
    assert np.array_equal(np.concatenate(blocks), reference_dither(99, 1800))
    # uniform: each 16-bit value about equally often (a chi-square test with 255 degrees of freedom)
    counts = np.bincount(dither16(2021, 0, 1 << 20) >> 8, minlength=256)
    chi2 = float(((counts - 4096.0) ** 2 / 4096.0).sum())
    assert 150 < chi2 < 380, chi2


@pytest.mark.parametrize("kernel", FOLD_KERNELS)
def test_threads_change_neither_the_bytes_nor_the_report_and_blocks_not_the_bytes(
        template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    """Two LoRAs (stacked, one at a negative strength) over DiT, refiner and float32 tensors, folded
    on 1 and 3 threads with one row per block, and on 2 threads with the default blocks: every byte
    the same; the survival report the same for the same blocks (tallies add up in block order)."""
    shapes = tensor_shapes(template)
    _lora(tmp_path / "a.safetensors", shapes, seed=1, scale=0.05)
    _lora(tmp_path / "b.safetensors", shapes, seed=2, scale=0.02)
    specs = [LoraSpec(tmp_path / "a.safetensors", 1.0), LoraSpec(tmp_path / "b.safetensors", -0.7)]
    use_fold_kernel(monkeypatch, kernel)
    results = {}
    default = fold_module.COMPILED_CHUNK_ELEMENTS if kernel == "compiled" else DEFAULT_CHUNK
    for name, threads, chunk, in_flight in (("one", 1, 8, 2), ("three", 3, 8, 1), ("default", 2, default, 2)):
        monkeypatch.setattr(fold_module, "FOLD_THREADS", threads)
        monkeypatch.setattr(fold_module, "IN_FLIGHT", in_flight)
        set_block_elements(monkeypatch, chunk)                              # 8: one 8-wide row per block
        results[name] = fold_model(template, specs, tmp_path / name, progress=False)
    one = _shards(tmp_path / "one")
    assert one == _shards(tmp_path / "three") == _shards(tmp_path / "default")
    assert results["one"].survival == results["three"].survival
    assert results["one"].provenance.files == results["three"].provenance.files      # the shards' SHA-256 too
    blocks = {row.module_class: row for row in results["default"].survival}
    for row in results["one"].survival:                   # other blocks: the same sums to float32 precision
        assert row.unchanged == blocks[row.module_class].unchanged
        assert math.isclose(row.kept, blocks[row.module_class].kept, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize("rounding, kernel", [("stochastic", "compiled"), ("stochastic", "numpy"),
                                              ("nearest", "numpy")])
def test_the_survival_report_equals_float64_sums_over_the_written_bytes(
        template: Path, tmp_path: Path, rounding: str, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """rho, kept, noise and the unchanged share of every module class, recomputed in float64 from
    the base, the written bytes and the exact update (tests/lora_helpers.py), match the record."""
    use_fold_kernel(monkeypatch, kernel)
    shapes = tensor_shapes(template)
    truth = _lora(tmp_path / "l.safetensors", shapes, seed=3, scale=0.01)
    result = fold_model(template, [tmp_path / "l.safetensors"], tmp_path / "out", progress=False, rounding=rounding)
    sums: dict[str, list[float]] = {}
    for target, (up, down) in truth.items():
        shard, dtype, shape = shapes[target]
        before = read_tensor_bytes(shard, target)
        weight = decode(before, dtype, shape)
        update = reference_exact(before, dtype, shape, [(up, down, 1.0)]) - weight
        stored = decode(read_tensor_bytes(tmp_path / "out" / shard.relative_to(template), target), dtype, shape) - weight
        for name in (fold_survival.module_class(target), fold_survival.OVERALL):
            row = sums.setdefault(name, [0, 0, 0.0, 0.0, 0.0, 0.0])
            row[0] += weight.size
            row[1] += int(np.sum(stored == 0))
            row[2] += float(np.sum(weight * weight))
            row[3] += float(np.sum(update * update))
            row[4] += float(np.sum(stored * update))
            row[5] += float(np.sum((stored - update) ** 2))
    reported = {row.module_class: row for row in result.survival}
    assert set(reported) == set(sums) and {"qkv", "fc1", "token refiner", "other", "overall"} <= set(reported)
    for name, (elements, unchanged, weight_sq, update_sq, stored_dot, noise_sq) in sums.items():
        row = reported[name]
        assert row.elements == elements and row.unchanged == unchanged / elements, name
        assert math.isclose(row.rho, math.sqrt(update_sq / weight_sq), rel_tol=1e-4), name
        assert math.isclose(row.kept, stored_dot / update_sq, rel_tol=1e-4, abs_tol=1e-5), name
        assert math.isclose(row.noise, math.sqrt(noise_sq / update_sq), rel_tol=1e-3, abs_tol=1e-5), name


def _huge(path: Path, target: str, shapes: dict, value: float) -> Path:
    """A rank-1 LoRA whose update is value**2 on every element of `target`."""
    out, inner = shapes[target][2]
    module = "diffusion_model." + target.removesuffix(".weight")
    return write_lora(path, {module + ".lora_A.weight": np.full((1, inner), value, np.float32),
                             module + ".lora_B.weight": np.full((out, 1), value, np.float32)})


@pytest.mark.parametrize("target, kernel", [("blocks.0.mlp.fc2.weight", "compiled"), ("blocks.0.mlp.fc2.weight", "numpy"),
                                            ("video_patch_proj.weight", "numpy")],
                         ids=["bf16-compiled", "bf16-numpy", "float32"])
def test_an_update_past_the_largest_value_stops_the_fold_and_a_large_one_is_reported(
        template: Path, tmp_path: Path, target: str, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three LoRAs each under the per-LoRA bound (1.44e38 an element) add up past bf16's and
    float32's largest value: the fold stops naming the tensor, and publishes nothing. An update of
    1e20 an element folds, and its report is finite (its squares overflow float32 sums)."""
    use_fold_kernel(monkeypatch, kernel)
    shapes = tensor_shapes(template)
    loras = [_huge(tmp_path / f"{n}.safetensors", target, shapes, 1.2e19) for n in range(3)]
    with pytest.raises(LoraError, match=f"pushes {target} past the largest value"):
        fold_model(template, loras, tmp_path / "over", progress=False)
    assert not (tmp_path / "over").exists()
    result = fold_model(template, [_huge(tmp_path / "large.safetensors", target, shapes, 1e10)], tmp_path / "large",
                        progress=False)
    row = next(r for r in result.survival if r.module_class == fold_survival.OVERALL)
    assert all(math.isfinite(v) for v in (row.rho, row.kept, row.noise)) and abs(row.kept - 1) < 0.01, row
    assert row.rho > 1e20
