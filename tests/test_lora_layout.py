"""The fold puts a LoRA's rows where h3 reads them, and rounds so the update survives (issue 21).

The expectations come from the layout rule (tests/lora_helpers.py, written from the issue, not
from h3bridge/lora): the checkpoint's qkv row h*3*D + s*D + d; a flat LoRA's row s*H*D + h*D + d.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lora_helpers import (assert_bf16_neighbours, flat_rows_to_per_head, low_rank, reference_exact, reference_fold,
                          slot_rows_to_per_head, tensor_shapes, write_lora)
import model_helpers
from h3bridge.cli.main import main
from h3bridge.errors import LoraError
from h3bridge.lora import fold_model, read_provenance
from h3bridge.model.safetensors import read_header

template = model_helpers.template      # the module's fixture model (tests/model_helpers.py)

QKV = "attn.qkv_proj.weight"
TARGETS = ["blocks.0." + QKV, "blocks.31." + QKV, "token_refiner.blocks.0." + QKV, "token_refiner.blocks.1." + QKV]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def _tensor(model: Path, name: str) -> tuple[bytes, str, tuple[int, ...]]:
    for shard in sorted((model / "FL2VA/transformer").glob("*.safetensors")):
        header = read_header(shard)
        for tensor in header.tensors:
            if tensor.name == name:
                with open(shard, "rb") as handle:
                    handle.seek(header.data_start + tensor.begin)
                    return handle.read(tensor.nbytes), tensor.dtype, tensor.shape
    raise KeyError(name)


def _heads(shapes: dict, target: str) -> tuple[int, int]:
    head_dim = shapes[target.replace("qkv_proj", "q_norm")][2][0]
    return shapes[target][2][0] // (3 * head_dim), head_dim


def _block_lora(path: Path, shapes: dict, *, metadata: dict[str, str] | None = None) -> dict[str, tuple]:
    """A flat LoRA whose every (slot, head) block of up/B is its own large constant, so a block on
    the wrong rows shows. Returns target -> (up, down)."""
    tensors, truth = {}, {}
    for target in TARGETS:
        heads, head_dim = _heads(shapes, target)
        rank = 1
        up = np.zeros((3 * heads * head_dim, rank), np.float32)
        for slot in range(3):
            for head in range(heads):
                rows = slice(slot * heads * head_dim + head * head_dim, slot * heads * head_dim + (head + 1) * head_dim)
                up[rows] = 0.25 * (1 + slot * heads + head)
        down = np.full((rank, shapes[target][2][1]), 0.5, np.float32)
        module = "diffusion_model." + target.removesuffix(".weight")
        tensors[module + ".lora_A.weight"], tensors[module + ".lora_B.weight"] = down, up
        truth[target] = (up, down)
    write_lora(path, tensors, metadata=metadata)
    return truth


def test_a_flat_lora_lands_every_q_k_v_block_on_its_own_heads_rows(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    truth = _block_lora(tmp_path / "flat.safetensors", shapes)
    out = fold_model(template, [tmp_path / "flat.safetensors"], tmp_path / "out", progress=False,
                     rounding="nearest").output
    for target, (up, down) in truth.items():
        heads, head_dim = _heads(shapes, target)
        before, dtype, shape = _tensor(template, target)
        after = _tensor(out, target)[0]
        assert after == reference_fold(before, dtype, shape, [(flat_rows_to_per_head(up, heads, head_dim), down, 1.0)])
        # and spelled out: row h*3D + s*D + d moved by the constant of block (s, h)
        change = reference_exact(after, dtype, shape, []) - reference_exact(before, dtype, shape, [])
        for slot in range(3):
            for head in range(heads):
                rows = change[head * 3 * head_dim + slot * head_dim: head * 3 * head_dim + (slot + 1) * head_dim]
                assert np.allclose(rows, 0.125 * (1 + slot * heads + head), rtol=0.05, atol=0.02), (target, slot, head)
    record = read_provenance(out)
    assert record.loras[0].qkv_layout == "flat" and record.rounding == "nearest"


def test_per_head_layout_leaves_rows_in_place_from_the_flag_or_the_metadata(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    truth = _block_lora(tmp_path / "ph.safetensors", shapes)
    flagged = fold_model(template, [tmp_path / "ph.safetensors"], tmp_path / "flag", progress=False,
                         rounding="nearest", qkv_layout="per-head").output
    _block_lora(tmp_path / "meta.safetensors", shapes, metadata={"qkv_layout": "per-head"})
    named = fold_model(template, [tmp_path / "meta.safetensors"], tmp_path / "meta", progress=False,
                       rounding="nearest").output
    for target, (up, down) in truth.items():
        before, dtype, shape = _tensor(template, target)
        expected = reference_fold(before, dtype, shape, [(up, down, 1.0)])
        assert _tensor(flagged, target)[0] == expected and _tensor(named, target)[0] == expected
    assert read_provenance(named).loras[0].qkv_layout == "per-head"


def test_stochastic_rounding_writes_bf16_neighbours_and_the_same_bytes_twice(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    rng = np.random.default_rng(3)
    tensors, truth = {}, {}
    for target in TARGETS + ["blocks.5.mlp.fc1.weight", "blocks.5.attn.out_proj.weight"]:
        out_rows, inner = shapes[target][2]
        up, down = low_rank(rng, out_rows, inner, 2, scale=0.02)
        tensors[target.removesuffix(".weight") + ".lora_A.weight"] = down
        tensors[target.removesuffix(".weight") + ".lora_B.weight"] = up
        truth[target] = (up, down)
    write_lora(tmp_path / "l.safetensors", tensors)
    first = fold_model(template, [str(tmp_path / "l.safetensors") + ":0.7"], tmp_path / "a", progress=False).output
    second = fold_model(template, [str(tmp_path / "l.safetensors") + ":0.7"], tmp_path / "b", progress=False).output
    nearest = fold_model(template, [str(tmp_path / "l.safetensors") + ":0.7"], tmp_path / "c", progress=False,
                         rounding="nearest").output
    differs = 0
    for target, (up, down) in truth.items():
        placed = flat_rows_to_per_head(up, *_heads(shapes, target)) if target.endswith(QKV) else up   # fc1: in place
        before, dtype, shape = _tensor(template, target)
        exact = reference_exact(before, dtype, shape, [(placed, down, 0.7)])
        assert_bf16_neighbours(_tensor(first, target)[0], exact, target)
        assert _tensor(first, target)[0] == _tensor(second, target)[0]
        assert _tensor(nearest, target)[0] == reference_fold(before, dtype, shape, [(placed, down, 0.7)])
        differs += _tensor(first, target)[0] != _tensor(nearest, target)[0]
    assert differs          # stochastic is not nearest
    for shard in sorted((first / "FL2VA/transformer").glob("*.safetensors")):
        assert shard.read_bytes() == (second / "FL2VA/transformer" / shard.name).read_bytes()
    record = read_provenance(first)
    assert record.rounding == "stochastic" and {row.module_class for row in record.survival} >= {"qkv", "overall"}


def test_diffusers_split_q_k_v_fold_into_each_heads_slot(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    target = "blocks.2." + QKV
    heads, head_dim = _heads(shapes, target)
    rng = np.random.default_rng(4)
    tensors, placed = {}, []
    for slot, name in enumerate(("to_q", "to_k", "to_v")):
        up, down = low_rank(rng, heads * head_dim, shapes[target][2][1], 2, scale=0.2)
        tensors[f"transformer.blocks.2.attn.{name}.lora_A.weight"] = down
        tensors[f"transformer.blocks.2.attn.{name}.lora_B.weight"] = up
        placed.append((slot_rows_to_per_head(up, slot, heads, head_dim), down, 1.0))
    write_lora(tmp_path / "split.safetensors", tensors)
    out = fold_model(template, [tmp_path / "split.safetensors"], tmp_path / "out", progress=False,
                     rounding="nearest").output
    before, dtype, shape = _tensor(template, target)
    assert _tensor(out, target)[0] == reference_fold(before, dtype, shape, placed)


def test_other_formats_are_refused_by_name(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    up, down = low_rank(np.random.default_rng(5), *shapes["blocks.0.mlp.fc1.weight"][2], 2)
    write_lora(tmp_path / "ff.safetensors", {"blocks.0.ff.net.0.proj.lora_A.weight": down,
                                             "blocks.0.ff.net.0.proj.lora_B.weight": up,
                                             "blocks.1.attn.qkv_proj.diff": np.zeros((24, 8), np.float32)})
    with pytest.raises(LoraError) as caught:
        fold_model(template, [tmp_path / "ff.safetensors"], tmp_path / "out", progress=False)
    assert "ff.net" in caught.value.message and "blocks.0.ff.net.0.proj" in caught.value.message
    assert ".diff/.diff_b" in caught.value.message and "blocks.1.attn.qkv_proj.diff" in caught.value.message
    assert not (tmp_path / "out").exists()


def test_a_peft_folder_is_scaled_by_its_configs_lora_alpha_over_r(template: Path, tmp_path: Path) -> None:
    shapes = tensor_shapes(template)
    target = "blocks.3.mlp.fc2.weight"
    up, down = low_rank(np.random.default_rng(6), *shapes[target][2], 4)
    folder = tmp_path / "adapter"
    folder.mkdir()
    write_lora(folder / "adapter_model.safetensors", {"base_model.model.blocks.3.mlp.fc2.lora_A.weight": down,
                                                      "base_model.model.blocks.3.mlp.fc2.lora_B.weight": up})
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 2, "peft_type": "LORA"}))
    out = fold_model(template, [folder], tmp_path / "out", progress=False, rounding="nearest").output
    before, dtype, shape = _tensor(template, target)
    assert _tensor(out, target)[0] == reference_fold(before, dtype, shape, [(up, down, 0.5)])
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 2, "rank_pattern": {"x": 2}}))
    with pytest.raises(LoraError, match="rank_pattern"):
        fold_model(template, [folder], tmp_path / "out2", progress=False)


def test_nan_inf_and_overflowing_values_are_refused_before_anything_is_written(
        template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19 item 10: exit 2 up front, naming the LoRA, tensor and strength; never the parity probe."""
    shapes = tensor_shapes(template)
    out_rows, inner = shapes["blocks.0." + QKV][2]
    up, down = low_rank(np.random.default_rng(7), out_rows, inner, 2)
    spot = np.arange(up.size).reshape(up.shape) == 3
    cases = {"nan": (np.where(spot, np.nan, up), down, "1.0", "NaN or infinity"),
             "inf": (np.where(spot, np.inf, up), down, "1.0", "NaN or infinity"),
             "huge": (up * 1e30, down * 1e30, "1.0", "bf16's largest value"),      # 1e30-sized values: ~1e57
             "strength": (up, down, "1e308", "strength 1e+308")}
    for name, (values, downs, strength, words) in cases.items():
        lora = write_lora(tmp_path / f"{name}.safetensors", {"blocks.0.attn.qkv_proj.lora_A.weight": downs,
                                                            "blocks.0.attn.qkv_proj.lora_B.weight": values})
        before = {p.name for p in tmp_path.iterdir()} | {"cache"}
        assert main(["lora", "fold", str(template), "--lora", f"{lora}:{strength}", "-o", str(tmp_path / "out"),
                     "--quiet"]) == 2, name
        err = capsys.readouterr().err
        assert words in err and f"{name}.safetensors" in err and "parity probe" not in err, err
        assert "blocks.0.attn.qkv_proj" in err and "fix:" in err
        assert {p.name for p in tmp_path.iterdir()} | {"cache"} == before


def test_a_read_only_output_folder_is_named_with_the_fix(template: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19 item 10: not the probe file's name and a raw errno (EROFS, as a read-only mount gives)."""
    import errno
    import os
    import tempfile
    from h3bridge.engines import disk
    lora = write_lora(tmp_path / "l.safetensors", {"blocks.0.attn.qkv_proj.lora_A.weight": np.zeros((2, 8), np.float32),
                                                   "blocks.0.attn.qkv_proj.lora_B.weight": np.zeros((24, 2), np.float32)})
    parent = tmp_path / "readonly"
    parent.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == parent else real_access(path, mode, **kw))
    monkeypatch.setattr(disk, "why_not_writable", lambda folder: "read-only file system", raising=False)
    real_mkstemp = tempfile.mkstemp

    def read_only_mkstemp(*args, dir=None, **kw):
        if dir is not None and Path(dir) == parent:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(parent / ".h3bridge-probe-x"))
        return real_mkstemp(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", read_only_mkstemp)
    assert main(["lora", "fold", str(template), "--lora", str(lora), "-o", str(parent / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(parent) in err and "read-only" in err and "-o" in err and "h3bridge-probe" not in err
    assert "Errno" not in err and os.strerror(errno.EROFS) not in err


def test_the_demo_lora_folds_end_to_end_and_the_fold_says_what_survived(tmp_path: Path) -> None:
    """`h3-sim-model DIR --lora FILE` (the README's LoRA section on any machine), then `lora fold
    --json` and `info`: the survival report per module class in all three, the int8 note, and the
    kept < 0.9 warning for nearest rounding only."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "H3BRIDGE_CACHE_DIR": str(tmp_path / "cache")}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=300, env=env)

    made = run("h3bridge.sim.fixture_cli", str(tmp_path / "m"), "--no-ref2va", "--lora", str(tmp_path / "demo.safetensors"))
    assert made.returncode == 0, made.stderr
    assert "h3bridge lora fold" in made.stdout
    folded = run("h3bridge.cli", "lora", "fold", str(tmp_path / "m"), "--lora", str(tmp_path / "demo.safetensors"),
                 "-o", str(tmp_path / "f"), "--quiet", "--json")
    assert folded.returncode == 0, folded.stderr
    record = json.loads(folded.stdout)
    classes = {row["module_class"]: row for row in record["survival"]}
    assert {"qkv", "out", "fc1", "fc2", "token refiner", "overall"} <= set(classes)
    assert 2e-4 < classes["overall"]["rho"] < 5e-4 and abs(classes["overall"]["kept"] - 1) < 0.1
    assert record["loras"][0]["qkv_layout"] == "flat"                  # from the demo LoRA's metadata
    assert "what survived the fold (rounding: stochastic)" in folded.stderr and "int8" in folded.stderr
    assert "warning: only part" not in folded.stderr
    nearest = run("h3bridge.cli", "lora", "fold", str(tmp_path / "m"), "--lora", str(tmp_path / "demo.safetensors"),
                  "-o", str(tmp_path / "n"), "--quiet", "--rounding", "nearest")
    assert nearest.returncode == 0 and "warning: only part of the LoRA's update" in nearest.stderr
    assert "--rounding nearest" in nearest.stderr
    info = run("h3bridge.cli", "info", str(tmp_path / "f"))
    assert "what survived the fold" in info.stdout and "token refiner" in info.stdout and "qkv rows flat" in info.stdout


def test_the_docs_lora_demo_folds_with_the_flat_layout_and_stochastic_rounding(tmp_path: Path) -> None:
    """docs/loras.md's any-machine block, run as written in a fresh folder (tests/test_docs.py runs it
    too): the fold it makes assumed the demo LoRA's flat layout and rounded stochastically."""
    import os
    import re
    import subprocess
    import sys
    page = (Path(__file__).resolve().parent.parent / "docs" / "loras.md").read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", page, flags=re.S) if "h3-sim-model" in b]
    scripts = Path(sys.executable).parent
    env = {**os.environ, "H3BRIDGE_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": os.pathsep.join([str(scripts), os.environ.get("PATH", "")])}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, (block, done.stderr)
    record = read_provenance(tmp_path / "h3-demo-model-folded")
    assert record.loras[0].qkv_layout == "flat" and record.rounding == "stochastic" and record.survival
