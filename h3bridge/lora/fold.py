"""`h3bridge lora fold`: bake LoRAs into a copy of the checkpoint, W' = W + sum(strength * scale * up @ down).

h3.c has no LoRA runtime (upstream issue 37); upstream PR #14 folds the Turbo LoRA offline. Here:

- plan first (`plan_fold`): every LoRA module is mapped onto a transformer key (keys.py) and every
  refusal (keys matching nothing, shapes that do not fit, dtypes that cannot be folded, tensors
  that are no part of a pair) is raised, with examples, before a byte is written; then the disk
  is checked for what the output will take (engines/disk.py);
- the output is built under a hidden temporary name beside it and renamed into place at the end:
  Ctrl-C, an error or a crash leaves no output folder. A rewritten shard is named `.partial` until
  complete, so even a temporary folder left by SIGKILL is no model (its index lists shards that are
  not there); the next fold into that folder removes it;
- only the targeted tensors' bytes are rewritten: each rewritten shard keeps its source header,
  tensor order and alignment byte for byte (checked before its rename); every other file is
  cloned, hard-linked or copied (place.py says which and why);
- the fused qkv rows: a LoRA made against the flat [Q | K | V] layout (every published one) has
  its up/B rows permuted to the per-head layout h3 reads (layout.py); diffusers' separate
  to_q/to_k/to_v go to their slots of each head;
- the math is float64 (every bf16 and float32 weight is exact in it), rounded once to the target
  dtype. bf16: stochastically by default, with a counter-based dither keyed by the fold's identity,
  the tensor and the element (bf16.py), so the update survives unbiased and the same fold gives
  the same bytes; `rounding="nearest"` rounds to nearest even (the bytes of earlier versions).
  float32 by numpy's round to nearest even. Several LoRAs add up in the order given before that
  one rounding; what survived is measured per module class (model/fold_survival.py);
- memory is bounded: tensors are read (pread) a block of rows at a time (CHUNK_ELEMENTS, or
  COMPILED_CHUNK_ELEMENTS with the compiled kernels), so peak memory is a few such blocks per
  thread plus the LoRA matrices of a tensor, whatever the size of the model or of its largest
  tensor;
- the element-wise work of the default case (bf16, stochastic) runs in compiled kernels when numba
  is installed (compiled.py: the same bytes, about a third less CPU), else in numpy passes;
- blocks are folded on FOLD_THREADS threads (numpy, BLAS and the kernels release the GIL); a block's bytes
  depend on its elements' indexes only and the tallies add up in block order, so the output and
  its report are the same for any number of threads;
- before each block is written, a parity probe recomputes a few of its rows independently (the
  source rows read again with pread, the update as a small matrix product) and checks that each
  written value is one of the two bf16 neighbours of it and the one the rounding rule picks;
- the output carries a fold record (model/fold_record.py) that `info` shows and `verify` checks.
"""
from __future__ import annotations

import math
import os
import secrets
import shutil
import threading
import time
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..cancel import CancelToken
from ..errors import DiskError, GenerationCancelled, LoraError, OutputExistsError, RequestError
from ..safeio.outputs import check_output, publish_folder
from ..safeio.paths import non_regular_kind, not_regular, read_text_capped, too_large
from ..model.inventory import FL2VA, PARTITIONS, ModelInventory, format_bytes, inspect_model
from ..model.safetensors import DTYPE_SIZES, TensorInfo
from ..progress import ProgressCallback, ProgressEvent
from . import compiled, keys, layout
from ..model import fold_survival as survival
from .bf16 import (Dither, bf16_neighbours, bf16_spacing, bf16_to_float64, dither16, float64_to_bf16,
                   float64_to_bf16_stochastic)
from .place import CLONE, clone_file, clone_supported, copy_range, not_a_model_file, place_file, same_file_system
from ..runnable import h3bridge_command
from ..model.fold_record import (
    PROVENANCE_FILE,
    FileRecord,
    LoraRecord,
    Provenance,
    base_identity,
    header_sha256,
    read_provenance,
    write_provenance,
)

CHUNK_ELEMENTS = 1 << 18          # elements per block in the numpy passes: 2 MiB per float64 working array
# elements per block with the compiled kernels (compiled.py), whose working arrays are the rows
# read and the bytes to write (4 bytes an element) and one float64 product of
# COMPILED_ROWS_ELEMENTS: larger blocks spread the parity probe and the per-block calls thinner
COMPILED_CHUNK_ELEMENTS = 1 << 20
# threads folding blocks (numpy and BLAS release the GIL); the bytes and the survival report are
# the same for any number (tests/test_lora_speed.py)
FOLD_THREADS = max(1, min(4, os.cpu_count() or 1))
IN_FLIGHT = 2                     # blocks handed out per thread ahead of the oldest unfinished one
PROBE_ROWS = 3                    # rows per block the parity probe recomputes
# the compiled pass (compiled.py) takes a block's matrix product this many elements at a time:
# 512 KiB of float64, read back from the CPU's second-level cache instead of main memory
COMPILED_ROWS_ELEMENTS = 1 << 16
TEMP_MARK = ".h3bridge-fold-"     # in the temporary folder's name
INCOMPLETE_FILE = "h3bridge-fold-incomplete"   # inside it: the folding process, until the rename
PARTIAL_SUFFIX = ".partial"
FOLD_PHASE = "fold"
STOCHASTIC, NEAREST = "stochastic", "nearest"
ROUNDINGS = (STOCHASTIC, NEAREST)
BF16_MAX = float(np.float32(3.3895313892515355e38))
# a module whose update can reach this is refused before folding: bf16's largest value is 3.39e38
OVERFLOW_BOUND = BF16_MAX / 2
_NUMPY_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}


@dataclass(frozen=True)
class LoraSpec:
    """One LoRA to fold and its strength (1.0: as trained)."""

    path: Path
    strength: float = 1.0

    @classmethod
    def parse(cls, text: str) -> "LoraSpec":
        """FILE or FILE:STRENGTH (a file name holding ':' still works when no number follows it)."""
        head, colon, tail = text.rpartition(":")
        if colon and head:
            try:
                return cls(Path(head).expanduser(), float(tail))
            except ValueError:
                pass
        return cls(Path(text).expanduser(), 1.0)

    @classmethod
    def of(cls, value: "LoraSpec | str | os.PathLike[str] | tuple[object, float]") -> "LoraSpec":
        if isinstance(value, LoraSpec):
            return value
        if isinstance(value, tuple):
            return cls(Path(value[0]).expanduser(), float(value[1]))   # type: ignore[arg-type]
        return cls.parse(os.fspath(value))


@dataclass(frozen=True)
class Update:
    """One LoRA module applied to one tensor: factor * (up @ down)."""

    lora_index: int
    module: keys.LoraModule
    factor: float             # strength * alpha / rank (or strength)
    rows: np.ndarray | None = None    # the target row of each up row (None: row i is row i)


@dataclass
class TensorJob:
    tensor: TensorInfo
    updates: list[Update] = field(default_factory=list)


@dataclass
class ShardJob:
    source: Path
    relative: Path
    data_start: int
    tensors: dict[str, TensorJob] = field(default_factory=dict)

    @property
    def tensor_bytes(self) -> int:
        return sum(job.tensor.nbytes for job in self.tensors.values())


@dataclass
class FoldPlan:
    inventory: ModelInventory
    specs: list[LoraSpec]
    loras: list[keys.LoraFile]
    partitions: list[str]
    shards: dict[Path, ShardJob]            # by source path, in checkpoint order
    distilled: list[bool]
    qkv_layouts: list[str] = field(default_factory=list)    # each LoRA's qkv layout (layout.py)
    rounding: str = STOCHASTIC
    values_checked: bool = False            # NaN/Inf and bf16 overflow (reads every LoRA matrix)

    def check_values(self) -> None:
        """Refuse LoRAs holding NaN/Inf or updates that could overflow bf16 (reads their data)."""
        if not self.values_checked:
            _check_values(self.shards, self.specs, self.loras)
            self.values_checked = True

    @property
    def targeted_bytes(self) -> int:
        return sum(shard.tensor_bytes for shard in self.shards.values())

    @property
    def largest_tensor_bytes(self) -> int:
        return max((job.tensor.nbytes for s in self.shards.values() for job in s.tensors.values()), default=0)

    @property
    def tensor_count(self) -> int:
        return sum(len(shard.tensors) for shard in self.shards.values())

    def content_key(self) -> str:
        """Base identity + LoRAs (by content) + strengths + partitions: equal keys, equal folds."""
        return keys.content_digest(["h3bridge lora fold 2", base_identity(self.inventory), *self.partitions,
                                    f"rounding {self.rounding}",
                                    *(f"{lora.sha256}:{spec.strength!r}:{lora.peft_scale!r}:qkv {qkv}"
                                      for lora, spec, qkv in zip(self.loras, self.specs, self.qkv_layouts))])


@dataclass(frozen=True)
class FoldResult:
    output: Path
    provenance: Provenance
    placed: dict[str, int]                  # clone / hardlink / copy -> files
    tensors: int
    targeted_bytes: int
    seconds: float
    survival: list[survival.Survival] = field(default_factory=list)


# ----------------------------------------------------------------------------- planning (refusals)


def _examples(items: Sequence[str]) -> str:
    shown = ", ".join(items[:keys.EXAMPLES])
    return shown + (f" (and {len(items) - keys.EXAMPLES} more)" if len(items) > keys.EXAMPLES else "")


def _read_scalar(lora: keys.LoraFile, tensor: TensorInfo) -> float:
    values = _load_matrix(lora.path, lora.header.data_start, tensor)
    return float(values.reshape(-1)[0])


def _load_matrix(path: Path, data_start: int, tensor: TensorInfo) -> np.ndarray:
    """A (small) LoRA tensor as float64."""
    dtype = _NUMPY_DTYPES[tensor.dtype]
    with open(path, "rb") as handle:
        handle.seek(data_start + tensor.begin)
        raw = np.frombuffer(handle.read(tensor.nbytes), dtype=dtype).reshape(tensor.shape)
    return bf16_to_float64(raw) if tensor.dtype == "BF16" else raw.astype(np.float64)


def plan_fold(model_dir: str | Path, loras: Sequence[LoraSpec | str | tuple[object, float]], *,
              partitions: Sequence[str] = (FL2VA,), distilled: bool | None = None,
              inventory: ModelInventory | None = None, qkv_layout: str | None = None,
              rounding: str = STOCHASTIC, check_values: bool = True) -> FoldPlan:
    """Map every LoRA onto the model's transformer(s); raise LoraError (with examples) for
    anything that would not fold. Reads headers, and each LoRA's bytes (its SHA-256; NaN/Inf and
    updates that would overflow bf16 are refused here, before anything is written).
    `qkv_layout`: the rows of every LoRA's qkv up/B ("flat" or "per-head"); None: each LoRA's
    metadata, else flat. `rounding`: "stochastic" (default) or "nearest". `check_values=False`
    leaves the LoRAs' data unread (a cache lookup); fold_model checks it before writing anyway."""
    specs = [LoraSpec.of(value) for value in loras]
    if not specs:
        raise RequestError("no LoRA given", field="lora", hint="pass --lora FILE[:STRENGTH] at least once")
    for spec in specs:
        if not math.isfinite(spec.strength):
            raise RequestError(f"LoRA strength {spec.strength} for {spec.path} is not a finite number",
                               field="lora", hint="give a strength such as 1.0 or 0.8")
    if qkv_layout is not None and qkv_layout not in layout.QKV_LAYOUTS:
        raise RequestError(f"unknown qkv layout {qkv_layout!r}", field="qkv_layout",
                           hint=f"use --qkv-layout {' or '.join(layout.QKV_LAYOUTS)}")
    if rounding not in ROUNDINGS:
        raise RequestError(f"unknown rounding {rounding!r}", field="rounding",
                           hint=f"use --rounding {' or '.join(ROUNDINGS)}")
    unknown = [p for p in partitions if p not in PARTITIONS]
    if unknown or not partitions:
        raise RequestError(f"unknown partition(s) {', '.join(unknown) or '(none)'}", field="partition",
                           hint=f"use {' or '.join(PARTITIONS)}")
    inventory = inventory or inspect_model(model_dir)
    inventory.raise_for_problems()
    targets: dict[str, dict[str, tuple[Path, TensorInfo, int]]] = {}
    for partition in partitions:
        component = inventory.component(partition, "transformer")
        if component is None or not component.shards or not inventory.partitions[partition].enabled:
            raise LoraError(f"{inventory.root} has no usable {partition}/transformer to fold into",
                            hint=f"fold into {FL2VA} (the default), or download the {partition} checkpoint first")
        table: dict[str, tuple[Path, TensorInfo, int]] = {}
        for shard in component.shards:
            for tensor in shard.tensors:
                table[tensor.name] = (shard.path, tensor, shard.data_start)
        targets[partition] = table
    read = [keys.read_lora(spec.path) for spec in specs]
    layouts = [qkv_layout or layout.layout_from_metadata(lora.header.metadata) or layout.FLAT for lora in read]
    indexes = {partition: keys.target_index(table) for partition, table in targets.items()}
    infos = {partition: {name: info for name, (_, info, _) in table.items()} for partition, table in targets.items()}
    shards: dict[Path, ShardJob] = {}
    unmatched: list[str] = []
    foreign: list[str] = []
    shapes: list[str] = []
    dtypes: list[str] = []
    duplicates: list[str] = []
    unpaired: list[str] = []
    diffs: list[str] = []
    feed_forward: list[str] = []
    no_heads: list[str] = []
    for index, (spec, lora) in enumerate(zip(specs, read)):
        diffs += [f"{name} (in {lora.path.name})" for name in lora.diffs]
        unpaired += [f"{name} (in {lora.path.name})" for name in lora.unsupported if name not in lora.diffs]
        seen: set[tuple[str, str, int | None]] = set()
        for module in lora.modules:
            if module.module.endswith(("ff.net.0.proj", "ff_net_0_proj", "ff.net.2", "ff_net_2")):
                feed_forward.append(f"{module.module} (in {lora.path.name})")
                continue
            fused, slot = layout.split_slot(module.module)
            for partition, table in targets.items():
                names, flat = indexes[partition]
                target = keys.map_module(fused, names, flat)
                if target is not None and slot is not None and not layout.is_qkv(target):
                    target = None
                if target is None:
                    part = keys.foreign_part(module.module)
                    (foreign if part else unmatched).append(
                        f"{module.module} (in {lora.path.name}{', for ' + part if part else ''})")
                    break
                if (partition, target, slot) in seen:
                    duplicates.append(f"{target} (twice in {lora.path.name})")
                    continue
                seen.add((partition, target, slot))
                path, tensor, data_start = table[target]
                heads = layout.head_shape(infos[partition], target) if layout.is_qkv(target) else None
                rows_map = None
                out_rows = tensor.shape[0] if tensor.shape else -1
                if layout.is_qkv(target) and (slot is not None or layouts[index] == layout.FLAT):
                    if heads is None:
                        no_heads.append(f"{target} (for {module.module} in {lora.path.name})")
                        continue
                    if slot is not None:
                        rows_map, out_rows = layout.slot_to_per_head(heads, slot), heads.inner
                    else:
                        rows_map = layout.flat_to_per_head(heads)
                rank = module.rank
                expected = f"[{out_rows if out_rows >= 0 else '?'}, {rank}] @ [{rank}, " \
                           f"{tensor.shape[1] if len(tensor.shape) > 1 else '?'}]"
                if (len(tensor.shape) != 2 or len(module.down.shape) != 2 or len(module.up.shape) != 2
                        or module.up.shape[1] != rank or module.up.shape[0] != out_rows
                        or module.down.shape[1] != tensor.shape[1]
                        or (module.alpha is not None and module.alpha.elements != 1)):
                    shapes.append(f"{module.module}: up {list(module.up.shape)} @ down {list(module.down.shape)} "
                                  f"for {target} {list(tensor.shape)} (needs {expected})")
                    continue
                if tensor.dtype not in keys.TARGET_DTYPES:
                    dtypes.append(f"{target} is {tensor.dtype}")
                    continue
                if module.alpha is not None and rank:
                    scale = _read_scalar(lora, module.alpha) / rank
                else:
                    scale = lora.peft_scale if lora.peft_scale is not None else 1.0
                shard = shards.setdefault(path, ShardJob(path, path.relative_to(inventory.root), data_start))
                shard.tensors.setdefault(target, TensorJob(tensor)).updates.append(
                    Update(index, module, spec.strength * scale, rows_map))
    kinds = (
        (foreign, "LoRA module(s) are for another part of the model, which h3bridge does not fold (it folds "
                  "the transformer)"),
        (unmatched, "LoRA module(s) match no tensor of the transformer"),
        (diffs, "full-weight difference tensor(s) (.diff/.diff_b), which are no low-rank update and which "
                "h3bridge does not fold"),
        (feed_forward, "diffusers feed-forward module(s) (ff.net.*), whose gate/value halves are stored in "
                       "either order by different exports, so h3bridge does not guess which is mlp.fc1's gate "
                       "half (h3 and ComfyUI: gate first)"),
        (unpaired, "LoRA tensor(s) are no part of a down/up pair (biases or a lone half)"),
        (shapes, "LoRA module(s) do not fit their tensor's shape"),
        (no_heads, "qkv tensor(s) whose heads cannot be told from the checkpoint (no attn.q_norm.weight, or rows "
                   "that are not 3 x heads x its length), so flat rows cannot be placed"),
        (dtypes, f"targeted tensor(s) have dtypes h3bridge cannot rewrite for h3 (it rewrites "
                 f"{'/'.join(sorted(keys.TARGET_DTYPES))})"),
        (duplicates, "tensor(s) are updated twice by one LoRA file"),
    )
    refusals = [f"{len(items)} {what}: {_examples(items)}" for items, what in kinds if items]
    if refusals:
        raise LoraError("cannot fold: " + "; ".join(refusals) + "; nothing was written",
                        hint="use a LoRA trained for MiniMax-H3's transformer (the checkpoint's own key names, "
                             "optionally prefixed diffusion_model./transformer., or kohya's lora_unet_ names); "
                             f"`{h3bridge_command('info', '-d', 'MODEL_DIR', '--json')}` lists the transformer's tensors")
    ordered = dict(sorted(shards.items(), key=lambda item: str(item[1].relative)))
    flags = [distilled if distilled is not None else keys.looks_distilled(lora.path, lora.header.metadata)
             for lora in read]
    plan = FoldPlan(inventory=inventory, specs=specs, loras=read, partitions=list(partitions), shards=ordered,
                    distilled=flags, qkv_layouts=layouts, rounding=rounding)
    if check_values:
        plan.check_values()
    return plan


def _check_values(shards: dict[Path, ShardJob], specs: list[LoraSpec], loras: list[keys.LoraFile]) -> None:
    """Refuse, before writing, LoRAs holding NaN or infinity and updates that can overflow bf16.
    The bound: |strength * scale * (up @ down)[i, j]| <= |factor| * ||up[i]|| * ||down[:, j]||
    (Cauchy-Schwarz), its largest value taken over i and j."""
    bounds: dict[tuple[int, str], float] = {}
    not_finite: list[str] = []
    too_large: list[str] = []
    for shard in shards.values():
        for job in shard.tensors.values():
            for update in job.updates:
                lora = loras[update.lora_index]
                key = (update.lora_index, update.module.module)
                if key not in bounds:
                    down = _load_matrix(lora.path, lora.header.data_start, update.module.down)
                    up = _load_matrix(lora.path, lora.header.data_start, update.module.up)
                    bad = [t.name for t, v in ((update.module.down, down), (update.module.up, up))
                           if not np.isfinite(v).all()]
                    if bad:
                        not_finite += [f"{name} (in {lora.path.name})" for name in bad]
                        bounds[key] = math.nan
                        continue
                    with np.errstate(over="ignore"):
                        bounds[key] = float(np.sqrt((up * up).sum(axis=1).max(initial=0.0))
                                            * np.sqrt((down * down).sum(axis=0).max(initial=0.0)))
                bound = abs(update.factor) * bounds[key]
                if math.isfinite(bounds[key]) and not bound < OVERFLOW_BOUND:
                    spec = specs[update.lora_index]
                    too_large.append(f"{job.tensor.name} by {update.module.module} (in {lora.path.name}, strength "
                                     f"{spec.strength:g}: update up to {bound:.3g})")
    if not_finite:
        raise LoraError(f"cannot fold: {len(not_finite)} LoRA tensor(s) hold NaN or infinity: "
                        f"{_examples(sorted(set(not_finite)))}; nothing was written",
                        hint="use an intact copy of the LoRA (a NaN in a LoRA is a broken training run or download)")
    if too_large:
        raise LoraError(f"cannot fold: {len(too_large)} update(s) can exceed bf16's largest value "
                        f"({BF16_MAX:.3g}): {_examples(too_large)}; nothing was written",
                        hint="use a strength near 1.0 (e.g. --lora FILE:1.0), or check the LoRA was trained for "
                             "this model (its values are far too large for a weight update)")


# ----------------------------------------------------------------------------- output folder


def _temporary_folders(parent: Path, name: str) -> list[Path]:
    try:
        return [p for p in parent.iterdir() if p.name.startswith(f".{name}{TEMP_MARK}") and p.is_dir()]
    except OSError:
        return []


def _owner_alive(folder: Path) -> bool:
    """Is the process that made this temporary folder still folding into it?"""
    import psutil
    try:
        # a few bytes of our own; a FIFO or a device planted there is never waited on nor read whole
        marker = read_text_capped(folder / INCOMPLETE_FILE, 256, not_regular, too_large, follow_symlinks=False)
        pid_text, started_text = marker.split()
        process = psutil.Process(int(pid_text))
        return abs(process.create_time() - float(started_text)) < 1.0
    except (OSError, ValueError, psutil.Error):
        return False


def remove_stale_folds(output: Path) -> list[Path]:
    """Temporary folders that dead folds into `output` left (SIGKILL, power loss): removed."""
    removed = []
    for folder in _temporary_folders(output.parent, output.name):
        if not _owner_alive(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _check_output(base: Path, output: Path) -> None:
    if output.exists() or output.is_symlink():
        raise OutputExistsError(f"the output folder {output} already exists; a fold never writes into or over one",
                                hint="choose a new -o folder, or remove that one first")
    base_resolved, output_resolved = base.resolve(), output.parent.resolve() / output.name
    if output_resolved == base_resolved or base_resolved in output_resolved.parents:
        raise RequestError(f"the output folder {output} is inside the model folder {base}", field="output",
                           hint="put the folded model beside the base, e.g. -o ../MiniMax-H3-turbo")
    if not output.parent.is_dir():
        raise RequestError(f"the folder {output.parent} that should hold {output.name} does not exist",
                           field="output", hint=f"create it first (mkdir -p {output.parent})")


def _source_files(root: Path) -> list[Path]:
    """Every file of the base model the folded one gets, in a stable order. Left out: the
    `--local-dir` download cache (its ETags describe the base's shards, not the folded ones) and
    a folded base's own record (the new record nests it). An entry that is not a regular file (a
    FIFO, a device such as a link to /dev/zero, a socket, a dangling link) is refused here, before
    anything is written: copying it would hang the fold or fill the disk."""
    found = []
    for directory, subdirs, files in os.walk(root, followlinks=True):     # a Ref2VA/ linked from another disk too
        subdirs[:] = sorted(d for d in subdirs if not (Path(directory) == root and d == ".cache"))
        for name in sorted(files):
            path = Path(directory) / name
            if path.parent == root and name == PROVENANCE_FILE:
                continue
            kind = non_regular_kind(path)      # stat only: never opened
            if kind is not None:
                raise not_a_model_file(path, kind)
            found.append(path)
    return found


def _known_sha256(root: Path, path: Path) -> str | None:
    """The base file's SHA-256 when it is known without reading it (HF names, ETags, the hash cache)."""
    from ..model.verify import FileIdentity, HashCache, _hf_cache_sha256, _hf_local_dir_sha256
    return (_hf_cache_sha256(path) or _hf_local_dir_sha256(root, path.relative_to(root))
            or HashCache().load().get(FileIdentity.of(path)))


def _disk_need(plan: FoldPlan, folder: Path, files: list[Path]) -> int:
    clones = clone_supported(folder)
    links = same_file_system(plan.inventory.root, folder)
    rewritten = {shard.source for shard in plan.shards.values()}
    need = plan.targeted_bytes if clones else sum(p.stat().st_size for p in rewritten)
    for path in files:
        if path in rewritten or clones:
            continue
        if not (links and path.name.endswith(".safetensors")):
            need += path.stat().st_size
    return need + (1 << 20)


def _check_disk(plan: FoldPlan, folder: Path, files: list[Path]) -> None:
    from ..engines.disk import DiskNeed, check_disk_space
    try:                                # can the folder take a file at all (before probing for clones there)
        check_disk_space([DiskNeed(folder, "the output folder", 0)])
    except DiskError as error:
        raise DiskError(error.message + ", so the folded model cannot be written there",
                        folder=error.folder, before_start=True,
                        hint="choose -o in a folder you can write to, on a writable disk "
                             "(e.g. -o ~/models/MiniMax-H3-folded)") from None
    need = _disk_need(plan, folder, files)
    try:
        check_disk_space([DiskNeed(folder, "the output folder", need)])
    except DiskError as error:
        raise DiskError(error.message + " for the folded model", folder=error.folder, free=error.free,
                        needed=error.needed, before_start=True,
                        hint=f"free at least {format_bytes(need)} on that disk, or choose -o on a disk with room "
                             "(on the base's own APFS/Btrfs/XFS volume, untouched shards cost nothing)") from None


# ----------------------------------------------------------------------------- the fold itself


@dataclass
class _FoldRun:
    """What one fold carries from tensor to tensor: its identity (the dither's key), the tallies,
    and the threads that fold blocks (each with its own working arrays)."""

    plan: FoldPlan
    key: str
    tallies: dict[str, survival.Tally] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    threads: int = 1
    pool: ThreadPoolExecutor | None = None
    local: threading.local = field(default_factory=threading.local)

    def seed(self, shard: "ShardJob", tensor: TensorInfo) -> int:
        """The dither's seed for one tensor: (fold identity, partition, tensor name)."""
        digest = keys.content_digest([self.key, shard.relative.parts[0], tensor.name])
        return int(digest[:32], 16)

    def tally(self, target: str) -> survival.Tally:
        name = survival.module_class(target)
        self.counts[name] = self.counts.get(name, 0) + 1
        return self.tallies.setdefault(name, survival.Tally())

    def scratch(self) -> "_Scratch":
        """The calling thread's working arrays."""
        scratch = getattr(self.local, "scratch", None)
        if scratch is None:
            scratch = self.local.scratch = _Scratch()
        return scratch


def _encode_rows(values: np.ndarray, dtype: str, rounding: str = NEAREST, seed: int = 0,
                 first_index: int = 0, dither: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Values -> the tensor's dtype. bf16 stochastic: `values` are the float32 nearest the exact
    values (overwritten), dithered by seed and element index (`dither`: dither16(seed, first_index,
    values.size) drawn ahead); bf16 nearest: the float64 values themselves; float32: their nearest
    float32 (float32 values are returned as they are)."""
    if dtype != "BF16":
        return values.astype("<f4", copy=False)
    if rounding == STOCHASTIC:
        if dither is None:
            dither = dither16(seed, first_index, values.size)
        return float64_to_bf16_stochastic(values, dither, out)
    return float64_to_bf16(values)


def _probe(work: "_TensorWork", start: int, encoded: np.ndarray) -> None:
    """Recompute a few rows of a block independently (the source rows read again, the update as a
    small matrix product of those rows, the dither drawn again from each row's first index) and
    check each value about to be written: nearest rounding, the target dtype's nearest value;
    stochastic, one of the two bf16 neighbours of the exact value and the one the dither picks.
    The rows are checked together (one pass over all of them). Raises LoraError."""
    tensor = work.job.tensor
    columns, bf16 = tensor.shape[1], tensor.dtype == "BF16"
    picks = sorted({0, len(encoded) - 1, work.probe_row % len(encoded)})[:PROBE_ROWS]
    rows = [start + pick for pick in picks]
    raw = b"".join(os.pread(work.source_fd, work.row_bytes, work.offset + row * work.row_bytes) for row in rows)
    if bf16:
        exact = (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4").astype(np.float64)
    else:
        exact = np.frombuffer(raw, "<f4").astype(np.float64)
    exact = exact.reshape(len(rows), columns)
    for down, up, factor in work.matrices:
        exact = exact + factor * (up[rows] @ down)
    written = encoded[picks]
    value = (written.astype("<u4") << 16).view("<f4").astype(np.float64) if bf16 else written.astype(np.float64)
    if bf16 and work.dither is not None:
        low, high = bf16_neighbours(exact)
        dither = work.dither.at(np.add.outer(np.asarray(rows, dtype=np.uint64) * np.uint64(columns),
                                             np.arange(columns, dtype=np.uint64)))
        picked = (float64_to_bf16_stochastic(exact, dither).astype("<u4") << 16).view("<f4").astype(np.float64)
        bad = np.argwhere(~(((value == low) | (value == high)) & (value == picked)))
        detail = lambda r, c: (f" (its bf16 neighbours {low[r, c]!r} and {high[r, c]!r}; the dither picks "
                               f"{picked[r, c]!r})")
    else:
        magnitude = np.maximum(np.abs(exact), np.abs(value))
        spacing = bf16_spacing(magnitude) if bf16 else np.spacing(magnitude.astype(np.float32))
        error = np.abs(value - exact)
        bad = np.argwhere(~(error <= spacing * 0.5 * (1 + 1e-9) + 1e-300))
        detail = lambda r, c: ""
    if bad.size:
        number, column = (int(v) for v in bad[0])
        raise LoraError(f"parity probe failed for {tensor.name} row {rows[number]} column {column}: about to write "
                        f"{value[number, column]!r}, an independent recomputation gives {exact[number, column]!r}"
                        f"{detail(number, column)}; nothing was published",
                        hint="report this as an h3bridge bug, with the LoRA and the model", before_start=False)


def _load_updates(job: TensorJob, plan: FoldPlan) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """(down [rank, in], up [rows, rank] in the tensor's row order, factor) for each update."""
    rows = job.tensor.shape[0]
    matrices = []
    for update in job.updates:
        lora = plan.loras[update.lora_index]
        down = _load_matrix(lora.path, lora.header.data_start, update.module.down)
        up = _load_matrix(lora.path, lora.header.data_start, update.module.up)
        if update.rows is not None:                 # flat or split Q/K/V rows -> the per-head rows h3 reads
            placed = np.zeros((rows, up.shape[1]), dtype=np.float64)
            placed[update.rows] = up
            up = placed
        matrices.append((down, up, update.factor))
    return matrices


def _overflow(job: TensorJob, plan: FoldPlan) -> LoraError:
    named = ", ".join(f"{plan.loras[u.lora_index].path.name} at strength {plan.specs[u.lora_index].strength:g}"
                      for u in job.updates)
    return LoraError(f"folding {named} pushes {job.tensor.name} past the largest value {job.tensor.dtype} holds; "
                     "nothing was published", hint="use a lower strength (e.g. --lora FILE:1.0), or check the LoRA "
                                                   "was trained for this model", before_start=False)


class _Scratch:
    """One thread's working arrays, allocated once and reused block after block (fresh arrays per
    block cost a page fault per 4 KiB each time; blocks sized for the CPU's caches,
    CHUNK_ELEMENTS, keep every pass over them out of main memory). One flat buffer per name,
    grown when a block needs more, viewed in each block's dtype and shape."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def array(self, name: str, dtype: np.dtype | type, shape: tuple[int, ...]) -> np.ndarray:
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        buffer = self._buffers.get(name)
        if buffer is None or buffer.nbytes < size:
            buffer = self._buffers[name] = np.empty(max(size, 8), dtype=np.uint64).view(np.uint8)   # 8-aligned
        return buffer[:size].view(dtype).reshape(shape)


def _read_rows(fd: int, into: np.ndarray, offset: int) -> None:
    """Fill `into` (C-contiguous) with the file's bytes at `offset`, without a memory map (whose
    page faults cost more than the copy)."""
    view = memoryview(into).cast("B")
    done = 0
    while done < len(view):
        if hasattr(os, "preadv"):
            count = os.preadv(fd, [view[done:]], offset + done)
        else:                                           # platforms without preadv
            chunk = os.pread(fd, len(view) - done, offset + done)
            count = len(chunk)
            view[done:done + count] = chunk
        if count <= 0:
            raise LoraError(f"the model file ended early at byte {offset + done}; nothing was published",
                            hint=f"check the model with `{h3bridge_command('verify', '-d', 'MODEL_DIR')}`", before_start=False)
        done += count


@dataclass
class _TensorWork:
    """One tensor's fold, read (never changed) by every thread folding one of its blocks."""

    job: TensorJob
    plan: FoldPlan
    matrices: list[tuple[np.ndarray, np.ndarray, float]]
    seed: int
    dither: Dither | None             # bf16 stochastic rounding only
    compiled: bool                    # its blocks go through the compiled kernels (compiled.py)
    step: int                         # rows per block
    data_start: int
    source_fd: int
    target_fd: int
    probe_row: int                    # each block's probe checks its first and last row and this one (mod rows)

    @property
    def offset(self) -> int:
        return self.data_start + self.job.tensor.begin

    @property
    def row_bytes(self) -> int:
        return self.job.tensor.shape[1] * DTYPE_SIZES[self.job.tensor.dtype]


def _tensor_work(job: TensorJob, run: _FoldRun, shard: ShardJob, source_fd: int, target_fd: int) -> _TensorWork:
    tensor = job.tensor
    rows, columns = tensor.shape
    seed = run.seed(shard, tensor)
    stochastic = tensor.dtype == "BF16" and run.plan.rounding == STOCHASTIC
    kernels = stochastic and compiled.available()
    chunk = COMPILED_CHUNK_ELEMENTS if kernels else CHUNK_ELEMENTS
    step = min(rows, max(1, chunk // max(columns, 1))) if rows else 1
    return _TensorWork(job, run.plan, _load_updates(job, run.plan), seed,
                       Dither(seed, step * columns) if stochastic else None, kernels, step, shard.data_start,
                       source_fd, target_fd, zlib.crc32(tensor.name.encode()))


def _fold_block(work: _TensorWork, start: int, scratch: _Scratch) -> survival.Tally:
    """Fold rows start .. start+step of one tensor and write them; returns the block's tally.
    x = W + sum(factor * up @ down) in float64 (W exact in it; the LoRAs added in the order given,
    as earlier versions did, so --rounding nearest writes their bytes), rounded once (bf16.py),
    checked by the parity probe, tallied for the survival report, written. For stochastic
    rounding and float32 targets only the float32 nearest x is needed: the last addition is done
    in float64 and written straight to float32 (one pass, no float64 result stored); that never
    crosses a bf16 value (bf16 values are float32 values, and rounding to nearest is monotone).
    Each element's float64 arithmetic is the same whatever the block (a matrix product's element
    is its own sum over the rank) and its dither depends on its index only, so neither the block
    size nor the thread that folds it changes the bytes."""
    tensor = work.job.tensor
    rows, columns = tensor.shape
    dtype, rounding = tensor.dtype, work.plan.rounding
    count = min(rows, start + work.step) - start
    shape = (count, columns)
    raw = scratch.array("raw", _NUMPY_DTYPES[dtype], shape)
    _read_rows(work.source_fd, raw, work.offset + start * work.row_bytes)
    if work.compiled:
        return _fold_block_compiled(work, start, count, raw, scratch)
    weight = scratch.array("weight", np.float32, shape)
    if dtype == "BF16":                                   # bf16 bits are a float32's high half
        np.left_shift(raw, 16, out=weight.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(weight, raw)
    exact = scratch.array("exact", np.float64, shape)
    rounded = scratch.array("rounded", np.float32, shape)
    keep_exact = dtype == "BF16" and rounding == NEAREST  # the float64 values decide ties and near-ties
    rows = slice(start, start + count)
    prefix = _earlier_loras(work, rows, weight, scratch)
    down, up, factor = work.matrices[-1]
    term = scratch.array("term", np.float64, shape)
    np.matmul(up[rows], down, out=term)
    if factor != 1.0:                                     # x * 1.0 == x: skip the pass
        term *= factor
    total = weight if prefix is None else prefix          # W is widened exactly inside the add
    if keep_exact:
        np.add(total, term, out=exact)
        with np.errstate(over="ignore"):
            np.copyto(rounded, exact, casting="same_kind")
    else:                                                 # float64 sum, its nearest float32 stored
        with np.errstate(over="ignore"):                  # past float32's range: refused below (_overflow)
            np.add(total, term, out=rounded, dtype=np.float64, casting="same_kind")
    update = np.subtract(rounded, weight, out=scratch.array("update", np.float32, shape))   # dW, for the tally
    dither = None
    if work.dither is not None:
        words = scratch.array("words", np.uint32, (count * columns // 2 + 2,))
        dither = work.dither.draw(start * columns, count * columns, words,
                                  scratch.array("mix", np.uint32, words.shape)).reshape(shape)
    encoded = _encode_rows(exact if keep_exact else rounded, dtype, rounding, work.seed, start * columns, dither,
                           scratch.array("encoded", np.uint16, shape) if dtype == "BF16" else None)
    stored = scratch.array("stored", np.float32, shape)
    if dtype == "BF16":
        np.left_shift(encoded, 16, out=stored.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(stored, encoded)
    stored -= weight                                      # D: what the file stores of the update
    tally = survival.Tally.of_block(weight, update, stored, scratch.array("changed", np.bool_, shape))
    if not tally.finite():                                # an infinity written, or float32 sums too large
        overflowed = (np.bitwise_and(encoded, np.uint16(0x7FFF)).max() >= 0x7F80 if dtype == "BF16"
                      else not np.isfinite(encoded).all())
        if overflowed:
            raise _overflow(work.job, work.plan)
        tally = survival.Tally.of_block(weight.astype(np.float64), update.astype(np.float64),
                                        stored.astype(np.float64))
    _probe(work, start, encoded)
    os.pwrite(work.target_fd, np.ascontiguousarray(encoded), work.offset + start * work.row_bytes)
    return tally


def _earlier_loras(work: _TensorWork, rows: slice, weight: np.ndarray, scratch: _Scratch) -> np.ndarray | None:
    """W + the updates of every LoRA but the last, in float64, in the order given (W widened
    exactly inside the first add): what the last update is added to before the one rounding.
    None with a single LoRA (its update is added to W itself). Uses the scratch arrays "term"
    and "prefix"."""
    prefix = None
    for down, up, factor in work.matrices[:-1]:
        term = scratch.array("term", np.float64, weight.shape)
        np.matmul(up[rows], down, out=term)
        if factor != 1.0:                                 # x * 1.0 == x: skip the pass
            term *= factor
        if prefix is None:
            prefix = np.add(weight, term, out=scratch.array("prefix", np.float64, weight.shape))
        else:
            prefix += term
    return prefix


def _fold_block_compiled(work: _TensorWork, start: int, count: int, raw: np.ndarray, scratch: _Scratch) -> survival.Tally:
    """_fold_block's default case (bf16, stochastic rounding) with the element-wise work in one
    compiled pass (compiled.py): the same float64 sums, the same rounding and dither, the same
    bytes. The matrix products stay with BLAS, a few rows at a time (COMPILED_ROWS_ELEMENTS), so
    the float64 product is still in the CPU's cache when the compiled pass reads it."""
    columns = work.job.tensor.shape[1]
    encoded = scratch.array("encoded", np.uint16, (count, columns))
    step = max(1, COMPILED_ROWS_ELEMENTS // max(columns, 1))
    down, up, factor = work.matrices[-1]
    sums = np.zeros(len(compiled.SUMS), dtype=np.float64)
    for first in range(0, count, step):
        rows = min(step, count - first)
        shape = (rows, columns)
        block_rows = slice(start + first, start + first + rows)
        prefix = None
        if len(work.matrices) > 1:                        # the kernels widen W themselves otherwise
            weight = scratch.array("weight", np.float32, shape)
            np.left_shift(raw[first:first + rows], 16, out=weight.view(np.uint32), dtype=np.uint32)
            prefix = _earlier_loras(work, block_rows, weight, scratch)
        term = scratch.array("term", np.float64, shape)
        np.matmul(up[block_rows], down, out=term)         # the kernels apply the factor
        compiled.stochastic_bf16(raw[first:first + rows], term, factor, (start + first) * columns,
                                 work.dither.offset, work.dither.stride, encoded[first:first + rows], sums, prefix)
    if sums[compiled.OVERFLOWED]:
        raise _overflow(work.job, work.plan)
    tally = survival.Tally(elements=count * columns, unchanged=int(sums[compiled.UNCHANGED]),
                           weight_sq=float(sums[compiled.WEIGHT_SQ]), update_sq=float(sums[compiled.UPDATE_SQ]),
                           stored_dot=float(sums[compiled.STORED_DOT]), stored_sq=float(sums[compiled.STORED_SQ]))
    _probe(work, start, encoded)
    os.pwrite(work.target_fd, encoded, work.offset + start * work.row_bytes)
    return tally


def _fold_tensors(run: _FoldRun, shard: ShardJob, source_fd: int, target_fd: int,
                  advance: Callable[[int], None], cancel: CancelToken | None) -> None:
    """Fold every targeted tensor of a shard, a block of rows at a time, on run.threads threads.
    Blocks are handed out in file order, at most IN_FLIGHT per thread ahead of the oldest one
    unfinished, and taken back in that order: the tallies add up in the same order (the same
    report) and progress, cancelling and errors are handled here, on the calling thread, whatever
    the number of threads. No block is left running when this returns (the file descriptors
    stay valid for every write)."""
    window: deque[tuple[_TensorWork, survival.Tally, Future[survival.Tally]]] = deque()

    def blocks() -> Iterator[tuple[_TensorWork, survival.Tally, int]]:
        for job in shard.tensors.values():
            rows, columns = job.tensor.shape
            tally = run.tally(job.tensor.name)
            if rows == 0 or columns == 0:
                continue
            work = _tensor_work(job, run, shard, source_fd, target_fd)
            for start in range(0, rows, work.step):
                yield work, tally, start

    def take_back() -> None:
        work, tally, future = window.popleft()
        block = future.result()
        tally.merge(block)
        advance(block.elements * DTYPE_SIZES[work.job.tensor.dtype])

    try:
        for work, tally, start in blocks():
            if cancel is not None and cancel.cancelled:
                raise GenerationCancelled("fold cancelled; no output was left behind")
            if run.pool is None:
                future: Future[survival.Tally] = Future()
                future.set_result(_fold_block(work, start, run.scratch()))
            else:
                future = run.pool.submit(lambda w=work, s=start: _fold_block(w, s, run.scratch()))
            window.append((work, tally, future))
            while len(window) > IN_FLIGHT * run.threads or (window and window[0][2].done()):
                take_back()
        while window:
            take_back()
    finally:
        for _, _, future in window:                       # an error or a cancel: let the rest finish
            future.cancel()
        for _, _, future in window:
            if not future.cancelled():
                future.exception()                        # waits; its error (if any) is not the first


def _flush_and_hash(path: Path) -> str:
    """Flush a rewritten shard to the disk and return its SHA-256, on the hashing thread: the
    fsync waits for the disk, and waiting there instead of between shards lets the next shard
    fold meanwhile (on a 2-core machine the serial fsyncs were a fifth of the fold's time)."""
    from ..model.verify import sha256_file
    descriptor = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return sha256_file(path)


def _write_shard(run: _FoldRun, shard: ShardJob, target: Path, advance: Callable[[int], None],
                 cancel: CancelToken | None) -> str:
    """The rewritten shard at `target`: a clone patched in place, or written whole, not yet
    flushed to the disk (_flush_and_hash does that while the next shard folds). Returns how."""
    cloned = clone_file(shard.source, target)
    with open(shard.source, "rb") as source:
        flags = os.O_RDWR | os.O_CLOEXEC | (0 if cloned else os.O_CREAT | os.O_EXCL)
        target_fd = os.open(target, flags, 0o644)
        try:
            if not cloned:
                # the header, then every untouched tensor's bytes (in file order)
                copy_range(source.fileno(), target_fd, 0, shard.data_start)
                rewritten = {job.tensor.name for job in shard.tensors.values()}
                header = next(s for c in run.plan.inventory.partitions.values() for comp in c.components.values()
                              for s in comp.shards if s.path == shard.source)
                for tensor in sorted(header.tensors, key=lambda t: t.begin):
                    if tensor.name not in rewritten and tensor.nbytes:
                        copy_range(source.fileno(), target_fd, shard.data_start + tensor.begin, tensor.nbytes)
                os.ftruncate(target_fd, header.file_size)
            _fold_tensors(run, shard, source.fileno(), target_fd, advance, cancel)
        finally:
            os.close(target_fd)
    if target.stat().st_size != shard.source.stat().st_size or header_sha256(target) != header_sha256(shard.source):
        raise LoraError(f"{target}: the rewritten shard's header or size differs from {shard.source}; nothing was "
                        "published", hint="report this as an h3bridge bug", before_start=False)
    return CLONE if cloned else "write"


def fold_model(model_dir: str | Path, loras: Sequence[LoraSpec | str | tuple[object, float]], output: str | Path, *,
               partitions: Sequence[str] = (FL2VA,), distilled: bool | None = None, progress: bool | None = None,
               on_progress: ProgressCallback | None = None, cancel: CancelToken | None = None,
               plan: FoldPlan | None = None, qkv_layout: str | None = None,
               rounding: str = STOCHASTIC) -> FoldResult:
    """Fold `loras` (LoraSpec, "FILE[:STRENGTH]" or (path, strength)) into a copy of the model at
    `model_dir`, published at `output` (which must not exist). `progress`: a tqdm bar (None: only
    on a terminal). `distilled`: whether the LoRAs are step-distillation LoRAs (None: by name).
    `qkv_layout` and `rounding`: as plan_fold takes them."""
    started = time.monotonic()
    output = Path(output).expanduser()
    base_root = Path(model_dir).expanduser()
    _check_output(base_root, output)
    plan = plan or plan_fold(model_dir, loras, partitions=partitions, distilled=distilled, qkv_layout=qkv_layout,
                             rounding=rounding)
    plan.check_values()
    root = plan.inventory.root
    _check_output(root, output)
    remove_stale_folds(output)
    files = _source_files(root)
    _check_disk(plan, output.parent, files)      # a full or read-only disk, in -o's words
    # and safeio.outputs' own check every output passes (nothing at the name, a folder taking files)
    check_output(output, overwrite=False, field="-o", label="the output folder", make_parents=False,
                 folder_output=True)
    try:
        base_record = read_provenance(root)
    except ValueError as error:
        raise LoraError(f"the base model's fold record cannot be read: {error}",
                        hint=f"fold from the original model, or remove {root / PROVENANCE_FILE}") from None

    import psutil
    from tqdm import tqdm
    temporary = output.parent / f".{output.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    temporary.mkdir()
    (temporary / INCOMPLETE_FILE).write_text(f"{os.getpid()} {psutil.Process().create_time()}\n")
    placed: dict[str, int] = {}
    records: list[FileRecord] = []
    threads = max(1, FOLD_THREADS)
    run = _FoldRun(plan, plan.content_key(), threads=threads,
                   pool=ThreadPoolExecutor(threads, thread_name_prefix="h3bridge-fold") if threads > 1 else None)
    # a rewritten shard is flushed to the disk and its SHA-256 (for `verify --checksums`) computed
    # while the next one folds; every shard is flushed before anything is renamed into place
    hasher = ThreadPoolExecutor(1, thread_name_prefix="h3bridge-fold-sha256")
    bar = tqdm(total=plan.targeted_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="fold",
               disable=None if progress is None else not progress, leave=False)
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        bar.update(count)
        if on_progress is not None:
            total = max(plan.targeted_bytes, 1)
            on_progress(ProgressEvent(FOLD_PHASE, done, total, done / total, time.monotonic() - started))

    try:
        from threadpoolctl import threadpool_limits
        # one BLAS thread: a block's matmul is small, and threaded BLAS hand-offs cost the whole
        # fold 5x on a busy 2-core machine (bench/bench_lora.py)
        blas = threadpool_limits(limits=1, user_api="blas")
        rewritten = {shard.source: shard for shard in plan.shards.values()}
        for path in files:                                       # untouched files first: cheap
            if path in rewritten:
                continue
            target = temporary / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            how = place_file(path, target)
            placed[how] = placed.get(how, 0) + 1
            records.append(FileRecord(str(path.relative_to(root)), path.stat().st_size, how,
                                      sha256=_known_sha256(root, path) if path.name.endswith(".safetensors") else None))
        hashed: list[tuple[ShardJob, Path, Path, Future[str]]] = []
        for shard in plan.shards.values():
            final = temporary / shard.relative
            partial = final.with_name(final.name + PARTIAL_SUFFIX)
            final.parent.mkdir(parents=True, exist_ok=True)
            _write_shard(run, shard, partial, advance, cancel)
            hashed.append((shard, partial, final, hasher.submit(_flush_and_hash, partial)))
        for shard, partial, final, digest in hashed:
            records.append(FileRecord(str(shard.relative), partial.stat().st_size, "folded",
                                      header_sha256=header_sha256(partial), sha256=digest.result(),
                                      tensors=len(shard.tensors)))
            os.rename(partial, final)
        provenance = Provenance(
            base_path=str(root.resolve()), base_identity=base_identity(plan.inventory),
            loras=[LoraRecord(name=lora.path.name, path=str(lora.path.resolve()), sha256=lora.sha256,
                              strength=spec.strength, conventions=list(lora.conventions), modules=len(lora.modules),
                              distilled=flag, qkv_layout=qkv)
                   for lora, spec, flag, qkv in zip(plan.loras, plan.specs, plan.distilled, plan.qkv_layouts)],
            partitions=plan.partitions, files=sorted(records, key=lambda r: r.relative),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"), content_key=run.key,
            base_provenance=None if base_record is None else base_record.to_dict(), rounding=plan.rounding,
            survival=survival.report(run.tallies, run.counts))
        write_provenance(temporary, provenance)
        (temporary / INCOMPLETE_FILE).unlink()
        # never over anything that appeared meanwhile, not even an empty folder (OutputExistsError)
        publish_folder(temporary, output, field="the output folder")
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    finally:
        if run.pool is not None:
            run.pool.shutdown(wait=True, cancel_futures=True)
        hasher.shutdown(wait=True, cancel_futures=True)
        bar.close()
        if "blas" in locals():
            blas.restore_original_limits()
    return FoldResult(output=output, provenance=provenance, placed=placed, tensors=plan.tensor_count,
                      targeted_bytes=plan.targeted_bytes, seconds=time.monotonic() - started,
                      survival=provenance.survival)
