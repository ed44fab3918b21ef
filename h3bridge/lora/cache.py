"""Folded models kept by content, for hosts that ask for the same fold again (the H3 LoRA node).

A fold is named by its content key (base identity + each LoRA's SHA-256 and strength + partitions,
FoldPlan.content_key): asking again finds the finished folder and costs a header read and the
LoRAs' hashes (themselves cached by path, size and mtime, as `verify --checksums` caches shards).
A base that is itself a fold from this cache is unfolded first: base + LoRA 1 + LoRA 2 is folded in
one pass from the original base (one rounding, one folder per distinct stack), whatever chain of
nodes asked for it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..cancel import CancelToken
from ..errors import H3BridgeError, OutputExistsError
from ..model.inventory import inspect_model
from ..progress import ProgressCallback
from .fold import LoraSpec, fold_model, plan_fold
from .keys import sha256_of
from ..model.fold_record import base_identity, read_provenance

CACHE_FOLDER = ".h3bridge-lora"      # beside the base model: same file system, so shards link or clone


def _unfolded(model_dir: Path, loras: list[LoraSpec]) -> tuple[Path, list[LoraSpec]]:
    """(the original base, every LoRA in order) when `model_dir` is a fold whose base and LoRA
    files are still what its record says; else `model_dir` and `loras` as given."""
    try:
        record = read_provenance(model_dir)
    except ValueError:
        return model_dir, loras
    if record is None:
        return model_dir, loras
    base = Path(record.base_path)
    earlier = [LoraSpec(Path(lora.path), lora.strength) for lora in record.loras]
    try:
        if base_identity(inspect_model(base)) != record.base_identity:
            return model_dir, loras
        if any(sha256_of(spec.path) != lora.sha256 for spec, lora in zip(earlier, record.loras)):
            return model_dir, loras
    except (OSError, ValueError, H3BridgeError):     # a base or LoRA gone: fold on top of the fold
        return model_dir, loras
    return base, earlier + loras


def cached_fold(model_dir: str | Path, loras: Sequence[LoraSpec], *, cache_root: Path | None = None,
                on_progress: ProgressCallback | None = None, cancel: CancelToken | None = None) -> Path:
    """The folded model for `model_dir` + `loras`, folded now only if no finished one exists."""
    base, stack = _unfolded(Path(model_dir).expanduser().resolve(), [LoraSpec.of(l) for l in loras])
    plan = plan_fold(base, stack)                        # refusals, and the content key
    key = plan.content_key()
    root = cache_root or base.parent / CACHE_FOLDER
    output = root / f"{base.name}-lora-{key[:16]}"
    if _finished(output, key):
        return output
    root.mkdir(parents=True, exist_ok=True)
    try:
        fold_model(base, stack, output, plan=plan, on_progress=on_progress, cancel=cancel, progress=False)
    except OutputExistsError:
        if not _finished(output, key):       # another process folded the same stack meanwhile: use it
            raise
    return output


def _finished(output: Path, key: str) -> bool:
    try:
        record = read_provenance(output)
    except ValueError:
        return False
    return record is not None and record.content_key == key and not inspect_model(output).errors
