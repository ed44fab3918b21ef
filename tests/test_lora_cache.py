"""Folds kept by content (lora/cache.py, what the H3 LoRA node calls): asked again, nothing is folded;
a chain of folds is one pass from the original base."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lora_helpers import low_rank, tensor_shapes, write_lora
import model_helpers
from h3bridge.lora import LoraSpec, fold_model, read_provenance
from h3bridge.lora import cache as cache_module
from h3bridge.lora.cache import cached_fold

template = model_helpers.template      # the module's fixture model (tests/model_helpers.py)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def _lora(path: Path, template: Path, seed: int) -> Path:
    shapes, rng, tensors = tensor_shapes(template), np.random.default_rng(seed), {}
    for i in range(0, 50, 7):
        out, inner = shapes[f"blocks.{i}.mlp.fc1.weight"][2]
        up, down = low_rank(rng, out, inner, 2)
        tensors[f"blocks.{i}.mlp.fc1.lora_A.weight"], tensors[f"blocks.{i}.mlp.fc1.lora_B.weight"] = down, up
    return write_lora(path, tensors)


def test_the_same_fold_asked_again_folds_nothing(template: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    lora = _lora(tmp_path / "a.safetensors", template, 1)
    events = []
    first = cached_fold(template, [LoraSpec(lora, 0.5)], cache_root=tmp_path / "folds", on_progress=events.append)
    assert events and events[-1].fraction == 1.0
    monkeypatch.setattr(cache_module, "fold_model", lambda *a, **k: pytest.fail("folded again"))
    assert cached_fold(template, [LoraSpec(lora, 0.5)], cache_root=tmp_path / "folds") == first
    monkeypatch.undo()
    other = cached_fold(template, [LoraSpec(lora, 0.6)], cache_root=tmp_path / "folds")
    assert other != first and read_provenance(other).loras[0].strength == 0.6


def test_a_chain_is_folded_in_one_pass_from_the_original_base(template: Path, tmp_path: Path) -> None:
    a, b = _lora(tmp_path / "a.safetensors", template, 2), _lora(tmp_path / "b.safetensors", template, 3)
    step = cached_fold(template, [LoraSpec(a, 1.0)], cache_root=tmp_path / "folds")
    chained = cached_fold(step, [LoraSpec(b, -0.5)], cache_root=tmp_path / "folds")
    record = read_provenance(chained)
    assert Path(record.base_path) == template.resolve() and record.base_provenance is None
    assert [(lora.name, lora.strength) for lora in record.loras] == [("a.safetensors", 1.0), ("b.safetensors", -0.5)]
    direct = fold_model(template, [LoraSpec(a, 1.0), LoraSpec(b, -0.5)], tmp_path / "direct", progress=False).output
    for shard in sorted((direct / "FL2VA/transformer").glob("*.safetensors")):
        assert shard.read_bytes() == (chained / "FL2VA/transformer" / shard.name).read_bytes()


def test_the_cache_is_capped_least_recently_used_first_and_listed_and_pruned(
        template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21 item 5: folds do not pile up unseen."""
    import os
    from h3bridge.cli.main import main
    root = tmp_path / cache_module.CACHE_FOLDER
    lora = _lora(tmp_path / "a.safetensors", template, 4)
    first = cached_fold(template, [LoraSpec(lora, 1.0)], cache_root=root)
    second = cached_fold(template, [LoraSpec(lora, 0.5)], cache_root=root)
    os.utime(first, (1, 1_000_000))                       # the first: used long ago
    os.utime(second, (1, 2_000_000))
    sizes = {fold.path: fold.size for fold in cache_module.list_folds(root)}
    assert set(sizes) == {first, second} and all(size > 0 for size in sizes.values())
    # a third fold with a cap that holds two: the least recently used other one goes
    monkeypatch.setenv(cache_module.LIMIT_VARIABLE, str(2 * max(sizes.values()) + 1024))
    third = cached_fold(template, [LoraSpec(lora, 0.25)], cache_root=root)
    assert not first.exists() and second.exists() and third.exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".")]       # nothing half-removed left
    assert main(["lora", "list", str(tmp_path)]) == 0                       # the folder holding the cache
    shown = capsys.readouterr().out
    assert second.name in shown and third.name in shown and "a.safetensors x0.5" in shown and first.name not in shown
    assert main(["lora", "prune", str(root), "--max-size", "0", "--dry-run"]) == 0
    assert "would remove 2 fold(s)" in capsys.readouterr().out and second.exists()
    assert main(["lora", "prune", str(root), "--max-size", "0"]) == 0
    assert not second.exists() and not third.exists()
    assert main(["lora", "prune", str(root), "--max-size", "lots"]) == 2
    assert "--max-size must be a size" in capsys.readouterr().err


def test_prune_never_reports_or_half_removes_a_linked_fold(tmp_path: Path, template: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29 item 5: a fold that is a symbolic link into the cache was reported removed while an
    `.evicting-*` link stayed behind (rmtree refuses a link; its error was ignored). A link is not
    a fold of this cache: never listed, evicted or followed; what it points to is kept."""
    import os
    from h3bridge.cli.main import main
    root = tmp_path / cache_module.CACHE_FOLDER
    lora = _lora(tmp_path / "a.safetensors", template, 4)
    own = cached_fold(template, [LoraSpec(lora, 1.0)], cache_root=root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kept = elsewhere / "my-fold"
    fold_model(template, [LoraSpec(lora, 0.5)], kept, progress=False)
    (root / "linked-fold").symlink_to(kept)
    assert [fold.path for fold in cache_module.list_folds(root)] == [own]
    assert main(["lora", "prune", str(root), "--max-size", "0"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 fold(s)" in out and "linked-fold" not in out
    assert not own.exists() and (root / "linked-fold").is_symlink() and read_provenance(kept) is not None
    assert sorted(os.listdir(root)) == ["linked-fold"]                         # no .evicting-* left


@pytest.mark.parametrize("command", [["list"], ["prune", "--max-size", "0"]])
def test_list_and_prune_of_a_missing_folder_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   command: list[str]) -> None:
    """`lora list /no/such/folder` said "0 fold(s)" and exited 0."""
    from h3bridge.cli.main import main
    missing = tmp_path / "no-such-folder"
    assert main(["lora", command[0], str(missing), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err and "fix:" in err
    assert list(tmp_path.iterdir()) == []
