"""`h3bridge lora fold`: folded values, byte-identity of everything else, the fold record, verify, h3-sim.

Issue 21 changed what these tests expect, in two places (_check_fold): a flat LoRA's qkv up/B rows
are compared on the per-head rows h3 reads (lora_helpers.flat_rows_to_per_head; before, in place,
which put one head's Q delta on another head's K), and a bf16 tensor folded with the default
stochastic rounding must hold, per element, one of the two bf16 neighbours of the float64 result
(before: exactly the nearest one, which keeps ~20 % of a distillation LoRA). The old bytes are
still checked exactly where they are still written: `--rounding nearest --qkv-layout per-head`
(test_stacked_loras_apply_in_order_with_their_strengths) and float32 targets.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core_helpers import sim_engine_path
from lora_helpers import (FOLD_KERNELS, assert_bf16_neighbours, flat_rows_to_per_head, low_rank, raw_header,
                          reference_exact, reference_fold, set_block_elements, tensor_shapes, use_fold_kernel,
                          write_lora)
import model_helpers
from h3bridge import GenerationRequest, inspect_model, verify_model
from h3bridge.cli.main import main
from h3bridge.lora import LoraSpec, fold_model, plan_fold, read_provenance
from h3bridge.lora import fold as fold_module
from h3bridge.lora.place import CLONE, COPY, HARDLINK
from h3bridge.model.memory import check_model_for
from h3bridge.model.safetensors import read_header

template = model_helpers.template      # the module's fixture model (tests/model_helpers.py)

QKV, FC1, FC2, OUT = "attn.qkv_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight", "attn.out_proj.weight"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def _peft(path: Path, shapes: dict, targets: list[str], seed: int, *, prefix: str = "diffusion_model.",
          rank: int = 2) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    """A PEFT LoRA over `targets`; returns target -> (up, down, scale)."""
    rng = np.random.default_rng(seed)
    tensors, truth = {}, {}
    for target in targets:
        out, inner = shapes[target][2]
        up, down = low_rank(rng, out, inner, rank)
        module = prefix + target.removesuffix(".weight")
        tensors[module + ".lora_A.weight"] = down
        tensors[module + ".lora_B.weight"] = up
        truth[target] = (up, down, 1.0)
    write_lora(path, tensors)
    return truth


def _kohya(path: Path, shapes: dict, targets: list[str], seed: int, *, alpha: float, rank: int = 4,
           flat: bool = True) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    """A kohya LoRA (lora_unet_ flattened names, or transformer.-prefixed dotted ones) with alpha."""
    rng = np.random.default_rng(seed)
    tensors, truth = {}, {}
    for target in targets:
        out, inner = shapes[target][2]
        up, down = low_rank(rng, out, inner, rank)
        base = target.removesuffix(".weight")
        module = "lora_unet_" + base.replace(".", "_") if flat else "transformer." + base
        tensors[module + ".lora_down.weight"] = down
        tensors[module + ".lora_up.weight"] = up
        tensors[module + ".alpha"] = np.array(alpha, dtype=np.float32)
        truth[target] = (up, down, alpha / rank)
    write_lora(path, tensors)
    return truth


def _placed(shapes: dict, target: str, up: np.ndarray) -> np.ndarray:
    """A flat LoRA's qkv up/B on the per-head rows (heads from the checkpoint's q_norm length)."""
    if not target.endswith(QKV):
        return up
    head_dim = shapes[target.replace("qkv_proj", "q_norm")][2][0]
    return flat_rows_to_per_head(up, shapes[target][2][0] // (3 * head_dim), head_dim)


def _check_fold(base: Path, output: Path, applied: dict[str, list[tuple[np.ndarray, np.ndarray, float]]],
                rounding: str = "stochastic") -> None:
    """Every targeted tensor is the float64 reference (flat qkv rows on their heads' rows) rounded
    once: exactly to nearest with rounding="nearest", else each bf16 element one of the two bf16
    neighbours of the exact value (float32 targets: nearest either way); every other byte of every
    shard (headers included) and every other file equals the base's."""
    shapes = tensor_shapes(base)
    applied = {t: [(_placed(shapes, t, u), d, f) for u, d, f in ups] for t, ups in applied.items()}
    for shard in sorted(base.rglob("*")):
        if not shard.is_file():
            continue
        twin = output / shard.relative_to(base)
        assert twin.is_file(), twin
        if shard.suffix != ".safetensors":
            assert twin.read_bytes() == shard.read_bytes(), twin
            continue
        assert raw_header(twin) == raw_header(shard) and twin.stat().st_size == shard.stat().st_size
        header, old, new = read_header(shard), shard.read_bytes(), twin.read_bytes()
        for tensor in header.tensors:
            span = slice(header.data_start + tensor.begin, header.data_start + tensor.end)
            before, after = old[span], new[span]
            if shard.parent.name == "transformer" and shard.parts[-3] == "FL2VA" and tensor.name in applied:
                if rounding == "nearest" or tensor.dtype != "BF16":
                    expected = reference_fold(before, tensor.dtype, tensor.shape, applied[tensor.name])
                    assert after == expected, tensor.name
                else:
                    exact = reference_exact(before, tensor.dtype, tensor.shape, applied[tensor.name])
                    assert_bf16_neighbours(after, exact, tensor.name)
                assert after != before, tensor.name
            else:
                assert after == before, (shard, tensor.name)
    assert {name for name in applied} <= set(shapes)


def test_peft_prefixed_lora_folds_to_the_float64_reference(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    targets = [f"blocks.{i}.{kind}" for i in (0, 7, 49) for kind in (QKV, FC1, FC2, OUT)]
    truth = _peft(tmp_path / "style.safetensors", shapes, targets, seed=1)
    result = fold_model(template, [LoraSpec(tmp_path / "style.safetensors", 0.7)], tmp_path / "folded", progress=False)
    assert result.tensors == len(targets)
    _check_fold(template, tmp_path / "folded", {t: [(u, d, 0.7 * s)] for t, (u, d, s) in truth.items()})
    # untouched weights are hard links here (ext4 has no clones), small files copies
    placed = {r.relative: r.how for r in result.provenance.files}
    assert placed["FL2VA/text_encoder/model-00001-of-00014.safetensors"] in (CLONE, HARDLINK)
    assert placed["FL2VA/transformer/config.json"] in (CLONE, COPY)
    assert not os.path.samefile(template / "FL2VA/transformer/config.json", tmp_path / "folded/FL2VA/transformer/config.json")


@pytest.mark.parametrize("flat", [True, False], ids=["lora_unet_ names", "transformer. prefix"])
def test_kohya_lora_with_alpha_scales_by_alpha_over_rank(template: Path, tmp_path: Path, flat: bool) -> None:
    shapes = tensor_shapes(template)
    targets = [f"blocks.{i}.{FC2}" for i in range(0, 50, 5)] + ["video_patch_proj.weight"]   # F32 too
    truth = _kohya(tmp_path / "k.safetensors", shapes, targets, seed=2, alpha=1.0, flat=flat)
    assert {s for _, _, s in truth.values()} == {0.25}
    fold_model(template, [str(tmp_path / "k.safetensors") + ":1.5"], tmp_path / "folded", progress=False)
    _check_fold(template, tmp_path / "folded", {t: [(u, d, 1.5 * s)] for t, (u, d, s) in truth.items()})
    record = read_provenance(tmp_path / "folded")
    assert record is not None and record.loras[0].conventions == ["kohya (lora_down/lora_up + alpha)"]


def test_stacked_loras_apply_in_order_with_their_strengths(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    first = _peft(tmp_path / "a.safetensors", shapes, [f"blocks.{i}.{QKV}" for i in range(10)], seed=3, prefix="")
    second = _kohya(tmp_path / "b.safetensors", shapes, [f"blocks.{i}.{QKV}" for i in range(5, 15)], seed=4,
                    alpha=8.0, rank=4)
    specs = [LoraSpec(tmp_path / "a.safetensors", 1.0), LoraSpec(tmp_path / "b.safetensors", -0.5)]
    result = fold_model(template, specs, tmp_path / "folded", progress=False)
    applied: dict[str, list] = {}
    for truth, strength in ((first, 1.0), (second, -0.5)):
        for target, (up, down, scale) in truth.items():
            applied.setdefault(target, []).append((up, down, strength * scale))
    _check_fold(template, tmp_path / "folded", applied)
    # --rounding nearest --qkv-layout per-head: the bytes earlier versions wrote (rows in place,
    # added in the same order, rounded to nearest)
    fold_model(template, specs, tmp_path / "old", progress=False, rounding="nearest", qkv_layout="per-head")
    shapes = tensor_shapes(template)
    for target, ups in applied.items():
        shard, dtype, shape = shapes[target]
        header = read_header(shard)
        tensor = next(t for t in header.tensors if t.name == target)
        span = slice(header.data_start + tensor.begin, header.data_start + tensor.end)
        written = (tmp_path / "old" / shard.relative_to(template)).read_bytes()[span]
        assert written == reference_fold(shard.read_bytes()[span], dtype, shape, ups), target
    record = result.provenance
    assert [(r.name, r.strength) for r in record.loras] == [("a.safetensors", 1.0), ("b.safetensors", -0.5)]
    import hashlib
    assert record.loras[1].sha256 == hashlib.sha256((tmp_path / "b.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize("kernel", FOLD_KERNELS)
def test_row_blocks_do_not_change_the_result(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             kernel: str) -> None:
    """Memory is bounded by folding a block of rows at a time: a block of 8 elements (one row of
    the 8-wide tiny tensors) gives the same bytes as whole tensors."""
    use_fold_kernel(monkeypatch, kernel)
    shapes = tensor_shapes(template)
    _peft(tmp_path / "l.safetensors", shapes, [f"blocks.{i}.{FC1}" for i in range(50)], seed=5)
    fold_model(template, [tmp_path / "l.safetensors"], tmp_path / "whole", progress=False)
    set_block_elements(monkeypatch, 8)
    fold_model(template, [tmp_path / "l.safetensors"], tmp_path / "rows", progress=False)
    for shard in sorted((tmp_path / "whole/FL2VA/transformer").glob("*.safetensors")):
        assert shard.read_bytes() == (tmp_path / "rows/FL2VA/transformer" / shard.name).read_bytes()


def test_folded_model_passes_verify_and_info_shows_its_record(template: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    shapes = tensor_shapes(template)
    _peft(tmp_path / "minimax_h3_turbo_v4.safetensors", shapes, [f"blocks.{i}.{QKV}" for i in range(50)], seed=6,
          prefix="")
    out = tmp_path / "turbo"
    assert main(["lora", "fold", str(template), "--lora", str(tmp_path / "minimax_h3_turbo_v4.safetensors"),
                 "-o", str(out), "--quiet"]) == 0
    report = verify_model(out, checksums=True)
    assert report.ok, report.table()
    sources = {r.expected_source for r in report.results if r.relative.parts[1] == "transformer"
               and r.relative.parts[0] == "FL2VA"}
    assert sources == {"fold record"}
    assert main(["info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "folded model" in shown and "minimax_h3_turbo_v4.safetensors x1" in shown and "step-distilled" in shown
    assert inspect_model(template).provenance is None       # the base stays the base
    assert json.loads(subprocess.run([sys.executable, "-m", "h3bridge.cli", "info", str(out), "--json"],
                                     capture_output=True, text=True, timeout=60).stdout)["provenance"]["loras"]


def test_verify_catches_a_folded_shard_changed_after_the_fold(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    _peft(tmp_path / "l.safetensors", shapes, [f"blocks.{i}.{QKV}" for i in range(50)], seed=7)
    out = fold_model(template, [tmp_path / "l.safetensors"], tmp_path / "folded", progress=False).output
    shard = out / "FL2VA/transformer/model-00003-of-00007.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF                         # one data byte: the header check passes, the hash does not
    shard.write_bytes(bytes(data))
    report = verify_model(out, checksums=True)
    assert not report.ok and any("fold record" in e.message for e in report.errors)
    data = bytearray(shard.read_bytes())
    data[9] = ord(" ") if data[9] != ord(" ") else ord("\t")       # the header: info says so at once
    shard.write_bytes(bytes(data))
    assert any(p.kind in ("fold-record", "integrity") for p in inspect_model(out).errors)


def test_content_key_changes_with_strength_and_base(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    _peft(tmp_path / "l.safetensors", shapes, [f"blocks.0.{QKV}"], seed=8)
    one = plan_fold(template, [LoraSpec(tmp_path / "l.safetensors", 1.0)]).content_key()
    assert one == plan_fold(template, [LoraSpec(tmp_path / "l.safetensors", 1.0)]).content_key()
    assert one != plan_fold(template, [LoraSpec(tmp_path / "l.safetensors", 0.5)]).content_key()
    folded = fold_model(template, [tmp_path / "l.safetensors"], tmp_path / "f", progress=False).output
    assert plan_fold(folded, [tmp_path / "l.safetensors"]).content_key() != one     # a folded base differs


def test_folded_distillation_model_warns_about_reuse_and_steps(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    _peft(tmp_path / "x.safetensors", shapes, [f"blocks.0.{QKV}"], seed=9)
    out = fold_model(template, [tmp_path / "x.safetensors"], tmp_path / "f", progress=False, distilled=True).output
    inventory = inspect_model(out)
    assert check_model_for(GenerationRequest.from_preset("turbo", "a fox"), inventory) == []
    reuse = check_model_for(GenerationRequest.from_preset("balanced", "a fox"), inventory)
    # the warnings name settings as data (h3bridge.fixes): said here as the command line says them
    from h3bridge.cli.engine import cli_words
    from h3bridge.fixes import said
    said_reuse = [said(w, cli_words) for w in reuse]
    assert any("--reuse" in w for w in said_reuse) and any("20 only cost time" in w for w in said_reuse)
    assert any("validated floor" in said(w, cli_words)
               for w in check_model_for(GenerationRequest("a fox", steps=4), inventory))
    plain = fold_model(template, [tmp_path / "x.safetensors"], tmp_path / "g", progress=False, distilled=False).output
    assert check_model_for(GenerationRequest.from_preset("balanced", "a fox"), inspect_model(plain)) == []


def test_folded_model_renders_through_h3_sim_with_the_turbo_preset(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    _peft(tmp_path / "turbo.safetensors", shapes, [f"blocks.{i}.{QKV}" for i in range(50)], seed=10)
    out = fold_model(template, [tmp_path / "turbo.safetensors"], tmp_path / "turbo-model", progress=False).output
    clip = tmp_path / "clip.mp4"
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "generate", "-p", "a fox", "--preset", "turbo",
                           "--width", "96", "--height", "64", "--frames", "22", "--reuse", "2", "--quiet",
                           "--engine-path", str(sim_engine_path()), "--model-dir", str(out), "-o", str(clip)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert clip.stat().st_size > 0
    assert "step-distillation LoRA folded in" in done.stderr and "--reuse 1" in done.stderr


def test_a_hugging_face_cache_snapshot_folds_with_blob_links_and_known_hashes(template: Path, tmp_path: Path) -> None:
    """A HF cache snapshot (symlinks to blobs named by their SHA-256): untouched shards become links
    to the blobs, their published hashes go into the record, and `verify --checksums` checks every
    shard of the folded model against known hashes (no manifest needed)."""
    from test_verify import make_hf_cache_snapshot
    snapshot = make_hf_cache_snapshot(template, tmp_path / "hub")
    shapes = tensor_shapes(snapshot)
    _peft(tmp_path / "l.safetensors", shapes, [f"blocks.{i}.{FC1}" for i in range(50)], seed=11)
    out = fold_model(snapshot, [tmp_path / "l.safetensors"], tmp_path / "folded", progress=False).output
    encoder = "FL2VA/text_encoder/model-00001-of-00014.safetensors"
    record = read_provenance(out)
    how = next(f.how for f in record.files if f.relative == encoder)
    assert how in (CLONE, HARDLINK) and not os.path.islink(out / encoder)      # a file, never a symlink
    assert os.path.samefile(out / encoder, (snapshot / encoder).resolve()) == (how == HARDLINK)
    assert record.expected_sha256(encoder) == (snapshot / encoder).resolve().name
    report = verify_model(out, checksums=True, progress=False)
    assert report.ok and not report.manifest_written
    assert {r.expected_source for r in report.results} == {"fold record"}


def test_a_record_written_before_layouts_and_rounding_were_handled_still_reads(template: Path, tmp_path: Path) -> None:
    """Records of earlier folds lack qkv_layout, rounding and survival: they read as what those
    folds did (rows added in place, nearest rounding) and say nothing was measured."""
    shapes = tensor_shapes(template)
    _peft(tmp_path / "l.safetensors", shapes, [f"blocks.0.{QKV}"], seed=12)
    out = fold_model(template, [tmp_path / "l.safetensors"], tmp_path / "f", progress=False).output
    document = json.loads((out / "h3bridge-lora.json").read_text())
    for key in ("rounding", "survival"):
        del document[key]
    del document["loras"][0]["qkv_layout"]
    (out / "h3bridge-lora.json").write_text(json.dumps(document))
    record = read_provenance(out)
    assert record.rounding == "nearest" and record.loras[0].qkv_layout == "per-head" and record.survival == []
    assert "folded before h3bridge measured what survives" in record.summary()
