"""Model inventory: the official layout, and each layout users end up with by mistake."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from h3bridge.cli.engine import cli_words
from h3bridge.errors import IntegrityError, ModelError
from h3bridge.fixes import python_words, said
from h3bridge.model.inventory import inspect_model
from model_helpers import model, template  # noqa: F401  (fixtures)
from h3bridge.sim.fixture import TensorSpec, write_fixture_model, write_safetensors




def kinds(root: Path) -> dict[str, str]:
    return {p.kind: p.severity for p in inspect_model(root).problems}


def first_shard(root: Path, relative: str = "FL2VA/transformer") -> Path:
    return sorted((root / relative).glob("*.safetensors"))[0]


def test_official_layout_inventories_every_component(model: Path) -> None:
    inventory = inspect_model(model)
    assert inventory.problems == []
    assert inventory.has_ref2va
    for partition in ("FL2VA", "Ref2VA"):
        for key in ("text_encoder", "transformer", "video_vae", "audio_vae"):
            component = inventory.component(partition, key)
            assert component is not None and component.files >= 1 and component.tensors > 0
    transformer = inventory.component("FL2VA", "transformer")
    index = json.loads((model / "FL2VA/transformer/model.safetensors.index.json").read_text())
    assert transformer.files == len(set(index["weight_map"].values()))
    assert set(transformer.tensor_names()) == set(index["weight_map"])
    assert set(transformer.dtype_bytes) == {"BF16", "F32"}
    assert transformer.bytes_where(lambda n: n.startswith("blocks.0.")) > 0
    inventory.raise_for_problems()   # nothing to raise
    table = inventory.table()
    assert "layout: OK" in table and "video_vae/source" in table


def test_realistic_fixture_reports_released_sizes(tmp_path: Path) -> None:
    root = write_fixture_model(tmp_path / "real", realistic=True, ref2va=False)
    inventory = inspect_model(root)
    assert inventory.problems == []
    dit = inventory.component("FL2VA", "transformer")
    # h3.c h3_load_dir comment: the Ref2VA (DiT) checkpoint is "62 GiB"
    assert 61 * 2**30 < dit.file_bytes < 63 * 2**30
    # sparse files: the data sections take no disk space
    assert sum(p.stat().st_blocks for p in root.rglob("*.safetensors")) * 512 < 50 * 2**20


def test_tiny_and_realistic_fixtures_share_names_and_shards(template: Path, tmp_path: Path) -> None:
    realistic = write_fixture_model(tmp_path / "real", realistic=True)

    def layout(root: Path) -> dict[str, list[str]]:
        inventory = inspect_model(root)
        return {f"{c.partition}/{c.spec.key}/{p.name}": sorted(t.name for t in shard.tensors)
                for part in inventory.partitions.values() for c in part.components.values()
                for p, shard in zip(c.shard_paths, c.shards)}

    assert layout(template) == layout(realistic)
    assert sum(p.stat().st_size for p in template.rglob("*")) < 4 * 2**20     # tiny: a few MB at most


def test_without_ref2va_is_fine_but_says_references_need_it(template: Path, tmp_path: Path) -> None:
    root = write_fixture_model(tmp_path / "m", ref2va=False)
    inventory = inspect_model(root)
    assert inventory.problems == [] and not inventory.has_ref2va
    assert "references need it" in inventory.table()


def test_ref2va_without_its_index_is_ignored_with_a_warning(model: Path) -> None:
    (model / "Ref2VA/transformer/model.safetensors.index.json").unlink()
    inventory = inspect_model(model)
    assert not inventory.has_ref2va
    assert {p.kind: p.severity for p in inventory.problems} == {"ref2va-ignored": "warning"}
    inventory.raise_for_problems()   # warnings do not raise


def test_missing_fl2va_partition(model: Path) -> None:
    shutil.rmtree(model / "FL2VA")
    assert kinds(model) == {"missing-partition": "error"}
    with pytest.raises(ModelError, match="no FL2VA"):
        inspect_model(model).raise_for_problems()


def test_missing_required_file_uses_upstream_message(model: Path) -> None:
    (model / "FL2VA/tokenizer/tokenizer.json").unlink()
    with pytest.raises(ModelError) as caught:
        inspect_model(model).raise_for_problems()
    assert f"missing required model file: {model / 'FL2VA/tokenizer/tokenizer.json'}" in str(caught.value)


def test_component_without_shards_uses_upstream_message(model: Path) -> None:
    for shard in (model / "FL2VA/video_vae/source").glob("*.safetensors"):
        shard.unlink()
    problems = inspect_model(model).problems
    assert [p.kind for p in problems] == ["missing-component"]
    assert problems[0].message == f"{model / 'FL2VA/video_vae/source'}: no safetensors files"


def test_comfyui_single_file_repack(tmp_path: Path) -> None:
    root = tmp_path / "comfy"
    for relative in ("diffusion_models/minimax_h3_fl2va_bf16.safetensors",
                     "diffusion_models/minimax_h3_fl2va_pruned_fp8_scaled.safetensors",
                     "vae/minimax_h3_video_vae_fp16.safetensors"):
        write_safetensors(root / relative, [TensorSpec("x", "BF16", (4,))])
    problems = inspect_model(root).problems
    assert [p.kind for p in problems] == ["comfyui-repack"]
    assert "quantized" in problems[0].message and "hf download" in problems[0].fix and "huggingface-cli" not in problems[0].fix


def test_model_path_that_is_a_single_file(tmp_path: Path) -> None:
    path = tmp_path / "minimax_h3_fl2va_bf16.safetensors"
    write_safetensors(path, [TensorSpec("x", "BF16", (4,))])
    with pytest.raises(ModelError, match="single-file"):
        inspect_model(path)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        inspect_model(tmp_path / "nope")


def test_quantized_int8_checkpoint_in_the_official_tree(model: Path) -> None:
    shard = first_shard(model)
    write_safetensors(shard, [TensorSpec("blocks.0.mlp.fc1.weight", "F32", (4,)),
                              TensorSpec("blocks.0.mlp.fc1.weight_scale", "F32", (4,))])
    problems = inspect_model(model).problems
    assert "quantized" in {p.kind for p in problems}
    assert any("weight_scale" in p.message for p in problems if p.kind == "quantized")


def test_int8_matrix_dtype_is_reported_as_quantized(model: Path) -> None:
    path = first_shard(model)
    header = {"blocks.0.mlp.fc1.weight": {"dtype": "I8", "shape": [2, 4], "data_offsets": [0, 8]}}
    body = json.dumps(header).encode()
    body += b" " * (-(8 + len(body)) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + bytes(8))
    problems = [p for p in inspect_model(model).problems if p.kind == "quantized"]
    assert problems and "BF16/F32" in problems[0].message


def test_nvfp4_packed_checkpoint_is_reported_as_quantized(model: Path) -> None:
    write_safetensors(first_shard(model, "FL2VA/text_encoder"), [
        TensorSpec("model.language_model.layers.0.mlp.up_proj.weight", "BF16", (4, 4)),
        TensorSpec("model.language_model.layers.0.mlp.up_proj.weight_scale_2", "F32", (1,))])
    problems = [p for p in inspect_model(model).problems if p.kind == "quantized"]
    assert problems and "weight_scale_2" in problems[0].message and "text_encoder" in problems[0].message


def test_fp8_shard_is_an_integrity_problem_naming_the_format(model: Path) -> None:
    path = first_shard(model)
    header = {"w": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}}
    body = json.dumps(header).encode()
    body += b" " * (-(8 + len(body)) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + bytes(8))
    with pytest.raises(IntegrityError, match="F8_E4M3 is a quantized format") as caught:
        inspect_model(model).raise_for_problems()
    assert caught.value.path == path and caught.value.tensor == "w"


def test_gguf_files(model: Path) -> None:
    (model / "FL2VA/transformer/minimax-h3-Q8_0.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(32))
    assert kinds(model)["gguf"] == "error"


def test_appledouble_shards_are_reported_not_read(model: Path) -> None:
    (model / "FL2VA/transformer/._model-00001-of-00007.safetensors").write_bytes(b"\x00\x05\x16\x07" + bytes(60))
    problems = inspect_model(model).problems
    assert [(p.kind, p.severity) for p in problems] == [("appledouble", "error")]
    assert "dot_clean" in problems[0].fix


def test_appledouble_non_weight_files_are_a_warning(model: Path) -> None:
    (model / "FL2VA/._README.md").write_bytes(bytes(8))
    assert kinds(model) == {"appledouble": "warning"}


def test_git_lfs_pointer_instead_of_weights(model: Path) -> None:
    shard = first_shard(model)
    shard.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 9999\n")
    problems = inspect_model(model).problems
    assert [p.kind for p in problems] == ["git-lfs-pointer"] and "git lfs pull" in problems[0].fix


def test_partial_download_with_missing_shard(model: Path) -> None:
    shard = sorted((model / "FL2VA/text_encoder").glob("*.safetensors"))[3]
    shard.rename(shard.with_name(shard.name + ".incomplete"))
    found = kinds(model)
    assert found["partial-download"] == "error" and found["missing-shards"] == "error"


def test_local_dir_download_in_progress(model: Path) -> None:
    partial = model / ".cache/huggingface/download/FL2VA/transformer/model-00002-of-00007.safetensors.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(bytes(100))
    problems = inspect_model(model).problems
    assert [p.kind for p in problems] == ["partial-download"] and "resume" in problems[0].fix


def test_truncated_shard_raises_integrity_error_with_tensor(model: Path) -> None:
    shard = first_shard(model, "FL2VA/audio_vae")
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 100)
    with pytest.raises(IntegrityError, match="truncated") as caught:
        inspect_model(model).raise_for_problems()
    assert caught.value.path == shard and caught.value.tensor


def test_hugging_face_cache_with_incomplete_blob(template: Path, tmp_path: Path) -> None:
    repo = tmp_path / "hub/models--MiniMaxAI--MiniMax-H3"
    snapshot = Path(shutil.copytree(template, repo / "snapshots/0123abcd"))
    (repo / "blobs").mkdir()
    (repo / "blobs" / ("e" * 64 + ".incomplete")).write_bytes(bytes(10))
    assert kinds(snapshot) == {"partial-download": "error"}


def test_hugging_face_cache_repo_folder_resolves_to_its_snapshot(template: Path, tmp_path: Path) -> None:
    repo = tmp_path / "hub/models--MiniMaxAI--MiniMax-H3"
    shutil.copytree(template, repo / "snapshots/0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs/main").write_text("0123abcd")
    inventory = inspect_model(repo)
    assert inventory.root == repo / "snapshots/0123abcd" and inventory.problems == []


def test_partition_given_instead_of_model_dir(model: Path) -> None:
    problems = inspect_model(model / "FL2VA").problems
    # the fix names the model folder as data (h3bridge.fixes): each interface says it its way
    assert [p.kind for p in problems] == ["partition-given"] and str(model) in said(problems[0].fix, python_words)
    assert said(problems[0].fix, cli_words) == f"pass its parent: --model-dir {model}"


def test_model_one_level_down(model: Path) -> None:
    problems = inspect_model(model.parent).problems
    assert [p.kind for p in problems] == ["nested-model"] and str(model) in said(problems[0].fix, python_words)
    assert said(problems[0].fix, cli_words) == f"pass --model-dir {model}"


def test_several_errors_raise_the_first_and_count_the_rest(model: Path) -> None:
    (model / "FL2VA/tokenizer/tokenizer.json").unlink()
    (model / "FL2VA/audio_vae/config.json").unlink()
    with pytest.raises(ModelError, match=r"and 1 more problem"):
        inspect_model(model).raise_for_problems()


def test_empty_directory_is_not_a_model(tmp_path: Path) -> None:
    assert kinds(tmp_path) == {"not-a-model": "error"}


def test_unlistable_folder_is_a_model_error(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OS errors while scanning (permissions, a disk going away) surface as ModelError, not OSError."""
    real_iterdir = Path.iterdir

    def failing_iterdir(self: Path):
        if self == model:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)
    shutil.rmtree(model / "FL2VA")          # no FL2VA: the scan lists the folder to say what it is
    monkeypatch.setattr(Path, "iterdir", failing_iterdir)
    with pytest.raises(ModelError, match="cannot read the model directory"):
        inspect_model(model)


def test_a_folder_that_is_not_a_model_says_only_that(tmp_path: Path) -> None:
    """Its files are not the model's: no AppleDouble, partial or GGUF findings, and no fix that
    deletes or downloads anything in it (`generate -d /tmp` led with `find /tmp -name '._*' -delete`)."""
    (tmp_path / "._notes.txt").write_bytes(b"\0\5\26\7")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "._w.safetensors").write_bytes(b"\0\5\26\7")
    (tmp_path / "sub" / "x.safetensors.incomplete").write_bytes(bytes(10))
    problems = inspect_model(tmp_path).problems
    assert [p.kind for p in problems] == ["not-a-model"]
    assert "FL2VA/" in problems[0].fix and "delete" not in problems[0].fix
    assert f"--local-dir {tmp_path}" not in problems[0].fix


def test_the_file_system_root_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """`h3bridge info /` walked the whole file system for 13 s and suggested deleting and
    downloading there; a folder without FL2VA/ is not scanned below its own entries."""
    import os

    def no_walk(*args, **kwargs):
        raise AssertionError("a folder that is not a model was walked")
    monkeypatch.setattr(os, "walk", no_walk)
    problems = inspect_model(Path("/")).problems
    assert [p.kind for p in problems] == ["not-a-model"]
    assert "find /" not in problems[0].fix and "--local-dir /" not in problems[0].fix
