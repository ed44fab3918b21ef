"""Folded models kept by content, for hosts that ask for the same fold again (the H3 LoRA node).

A fold is named by its content key (base identity + each LoRA's SHA-256 and strength + partitions,
FoldPlan.content_key): asking again finds the finished folder and costs a header read and the
LoRAs' hashes (themselves cached by path, size and mtime, as `verify --checksums` caches shards).
A base that is itself a fold from this cache is unfolded first: base + LoRA 1 + LoRA 2 is folded in
one pass from the original base (one rounding, one folder per distinct stack), whatever chain of
nodes asked for it.

Folds do not pile up unseen: each use stamps its folder's mtime (least recently used first out),
`h3bridge lora list/prune` show and trim a cache, and after every new fold the cache is trimmed
to H3BRIDGE_LORA_CACHE_LIMIT (default 128 GiB; "0" keeps everything) by evicting the least
recently used other folds. A fold is evicted by renaming it to a hidden name first, so no half-
removed folder is ever taken for a finished fold.
"""
from __future__ import annotations

import errno
import math
import os
import re
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..cancel import CancelToken
from ..errors import H3BridgeError, OutputExistsError, RequestError
from ..model.inventory import inspect_model
from ..progress import ProgressCallback
from .fold import LoraSpec, fold_model, plan_fold
from .keys import sha256_of
from ..model.fold_record import base_identity, read_provenance
from ..runnable import h3bridge_command

CACHE_FOLDER = ".h3bridge-lora"      # beside the base model: same file system, so shards link or clone
LIMIT_VARIABLE = "H3BRIDGE_LORA_CACHE_LIMIT"
DEFAULT_LIMIT = 128 * 2**30
_EVICTING = ".evicting-"


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
    plan = plan_fold(base, stack, check_values=False)    # refusals, and the content key (LoRA data unread)
    key = plan.content_key()
    root = cache_root or base.parent / CACHE_FOLDER
    output = root / f"{base.name}-lora-{key[:16]}"
    if _finished(output, key):
        _touch(output)
        return output
    root.mkdir(parents=True, exist_ok=True)
    try:
        fold_model(base, stack, output, plan=plan, on_progress=on_progress, cancel=cancel, progress=False)
    except OutputExistsError:
        if not _finished(output, key):       # another process folded the same stack meanwhile: use it
            raise
    _touch(output)
    prune(root, cache_limit(), keep={output})
    return output


def _touch(folder: Path) -> None:
    try:
        os.utime(folder)                     # last used: the LRU order
    except OSError:
        pass


@dataclass(frozen=True)
class CachedFold:
    path: Path
    size: int                 # bytes it takes on disk beyond what it shares with its base (hard links)
    last_used: float          # its folder's mtime
    loras: list[str]          # "name xSTRENGTH"
    base: str


MAX_SIZE_DIGITS = 20      # a size in bytes of a 64-bit disk has at most 20 digits


def parse_size(text: str, *, what: str) -> int:
    """"128G", "500M", "1.5T" or a byte count; 0 is allowed (no limit for the cache variable)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise RequestError(f"{what} must be a size such as 100G or 500M, not {text!r}", field=what,
                           hint=f"e.g. {what} 100G")
    unit = (match.group(2) or "B")[0].upper()
    size = float(match.group(1)) * {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit]
    if len(match.group(1)) > MAX_SIZE_DIGITS or not math.isfinite(size):
        # float() of a 400-digit count is inf, and int(inf) was an OverflowError traceback
        raise RequestError(f"{what} must be a size such as 100G or 500M; {text[:20]!r}... has "
                           f"{len(match.group(1))} digits", field=what, hint=f"e.g. {what} 100G")
    return int(size)


def cache_limit() -> int | None:
    """The node cache's size cap (H3BRIDGE_LORA_CACHE_LIMIT); None: no cap."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LIMIT
    limit = parse_size(text, what=LIMIT_VARIABLE)
    return limit or None


def cache_folder(path: str | Path) -> Path:
    """A cache folder given as itself, as the folder holding it (ComfyUI's models/h3), or as a
    base model folder (its cache sits beside it)."""
    path = Path(path).expanduser()
    if path.name == CACHE_FOLDER:
        return path
    if (path / CACHE_FOLDER).is_dir():
        return path / CACHE_FOLDER
    return path.parent / CACHE_FOLDER


def _own_bytes(folder: Path) -> int:
    total = 0
    for directory, _, files in os.walk(folder):
        for name in files:
            try:
                status = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if status.st_nlink == 1:          # hard links share the base's blocks
                total += status.st_blocks * 512
    return total


def list_folds(root: Path) -> list[CachedFold]:
    """The finished folds in a cache folder, least recently used first. A symbolic link is not a
    fold of this cache (what it points to is someone's folder elsewhere): never listed, so never
    evicted nor followed."""
    folds = []
    try:
        entries = sorted(p for p in root.iterdir()
                         if not p.name.startswith(".") and not p.is_symlink() and p.is_dir())
    except OSError:
        return []
    for folder in entries:
        try:
            record = read_provenance(folder)
        except ValueError:
            record = None
        if record is None:
            continue
        folds.append(CachedFold(folder, _own_bytes(folder), folder.stat().st_mtime,
                                [f"{lora.name} x{lora.strength:g}" for lora in record.loras], record.base_path))
    return sorted(folds, key=lambda fold: fold.last_used)


def evict(folder: Path) -> None:
    """Remove a fold: renamed to a hidden name at once (never a half-removed model), then deleted.
    OSError (nothing renamed) for anything but a real folder: a link is never followed nor left
    behind under a hidden name."""
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a fold folder of this cache", str(folder))
    hidden = folder.with_name(f"{_EVICTING}{folder.name}-{secrets.token_hex(4)}")
    os.rename(folder, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def prune(root: Path, max_bytes: int | None, *, keep: set[Path] = frozenset(), dry_run: bool = False  # type: ignore[assignment]
          ) -> list[CachedFold]:
    """Evict least recently used folds until the cache takes at most `max_bytes` (None: nothing);
    `keep` is never evicted. Returns what was (or, dry_run, would be) removed."""
    if max_bytes is None:
        return []
    folds = list_folds(root)
    total = sum(fold.size for fold in folds)
    removed = []
    for fold in folds:
        if total <= max_bytes:
            break
        if fold.path in keep:
            continue
        if not dry_run:
            try:
                evict(fold.path)
            except OSError:
                continue
        removed.append(fold)
        total -= fold.size
    return removed


def describe(root: Path) -> str:
    """Where a cache's folds live and what they take (the H3 LoRA node shows it)."""
    from ..model.inventory import format_bytes
    folds = list_folds(root)
    limit = cache_limit()
    cap = f"capped at {format_bytes(limit)} ({LIMIT_VARIABLE})" if limit else f"no cap ({LIMIT_VARIABLE}=0)"
    return (f"{len(folds)} folded model(s) in {root}, {format_bytes(sum(f.size for f in folds))} on disk, {cap}; "
            f"`{h3bridge_command('lora', 'list', root)}` shows them, `{h3bridge_command('lora', 'prune', root)}` trims them")


def _finished(output: Path, key: str) -> bool:
    try:
        record = read_provenance(output)
    except ValueError:
        return False
    return record is not None and record.content_key == key and not inspect_model(output).errors
