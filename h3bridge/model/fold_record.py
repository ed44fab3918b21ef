"""The record a folded model carries: which base it came from and which LoRAs at which strengths.

`h3bridge-lora.json` at the model's root. `h3bridge info` shows it (ModelInventory.provenance),
`h3bridge verify` checks that every shard the fold rewrote is still the one it wrote (size and
header always; SHA-256 with --checksums), and a request on a folded step-distillation model is
warned when it uses --reuse/--core-reuse or more steps than the distillation was made for. A
folded model is therefore never taken for its base: its record, its identity and its cache key
all differ.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fixes import Fix, Words, changes, given, literal, python_words, said
from .fold_survival import INT8_NOTE, Survival, format_report, warnings
from .problem import Problem
from ..runnable import h3bridge_command
from ..safeio.outputs import write_output
from ..safeio.paths import not_regular, read_announced, read_json_capped, too_large
from .safetensors import MAX_HEADER_BYTES, open_regular_file

if TYPE_CHECKING:
    from .inventory import ModelInventory
    from ..request import GenerationRequest

PROVENANCE_FILE = "h3bridge-lora.json"
FORMAT = "h3bridge-lora-fold"
VERSION = 1
# A record lists the folded model's files and LoRAs: kilobytes. Read with a cap, so a damaged one
# (or a link to /dev/zero) is "damaged", not a MemoryError.
MAX_RECORD_BYTES = 16 * 1024 * 1024
# h3.c PR #14 (README "Distilled sampling"): sample with --steps 5 or 6 and no other speed flags;
# "4 steps showed motion smear; 5 is the validated floor"; the distilled schedule removes the
# redundancy --reuse and --core-reuse exploit. More than a few steps only costs time.
DISTILLED_STEPS = (5, 6)
DISTILLED_MAX_STEPS = 8


@dataclass(frozen=True)
class LoraRecord:
    name: str                 # the file's name
    path: str                 # where it was read from (informative: the hash identifies it)
    sha256: str
    strength: float
    conventions: list[str]
    modules: int
    distilled: bool
    # the rows its qkv up/B were taken as: "flat" (permuted to h3's per-head rows) or "per-head"
    # (added in place; what every fold before layouts were handled did, hence the default)
    qkv_layout: str = "per-head"


@dataclass(frozen=True)
class FileRecord:
    relative: str             # inside the model folder
    size: int
    how: str                  # "folded", or how an untouched file was placed: clone / hardlink / copy
    header_sha256: str | None = None       # folded shards: the 8-byte length + JSON header
    sha256: str | None = None              # folded shards: always; untouched files: the base's, when known
    tensors: int = 0                       # folded shards: how many tensors were rewritten


@dataclass
class Provenance:
    base_path: str
    base_identity: str
    loras: list[LoraRecord]
    partitions: list[str]
    files: list[FileRecord]
    created: str
    content_key: str
    base_provenance: dict[str, Any] | None = None   # when the base was itself a folded model
    rounding: str = "nearest"            # bf16 rounding: "stochastic" or "nearest" (records before it: nearest)
    survival: list[Survival] = field(default_factory=list)    # what survived, per module class (survival.py)
    format: str = FORMAT
    version: int = VERSION

    @property
    def distilled(self) -> bool:
        return any(lora.distilled for lora in self.loras)

    @property
    def folded_files(self) -> list[FileRecord]:
        return [f for f in self.files if f.how == "folded"]

    def expected_sha256(self, relative: str) -> str | None:
        return next((f.sha256 for f in self.files if f.relative == relative), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> "Provenance":
        values = dict(document)
        values["loras"] = [LoraRecord(**entry) for entry in values["loras"]]
        values["files"] = [FileRecord(**entry) for entry in values["files"]]
        values["survival"] = [Survival(**entry) for entry in values.get("survival", [])]
        return cls(**values)

    def summary(self, words: Words = python_words) -> str:
        """One line per LoRA, for `h3bridge info`; the settings it names said with `words` (the
        interface's renderer, h3bridge.fixes)."""
        lines = [f"folded model (h3bridge lora fold, {self.created}): base {self.base_path} "
                 f"(identity {self.base_identity[:12]}), partitions {', '.join(self.partitions)}, "
                 f"{sum(f.tensors for f in self.folded_files)} tensors rewritten in {len(self.folded_files)} shard(s)"]
        for number, lora in enumerate(self.loras, 1):
            lines.append(f"  LoRA {number}: {lora.name} x{lora.strength:g} (sha256 {lora.sha256[:16]}, "
                         f"{lora.modules} modules, qkv rows {lora.qkv_layout}"
                         f"{', step-distilled' if lora.distilled else ''})")
        if self.survival:
            lines += ["  " + line for line in format_report(self.survival, self.rounding).splitlines()]
            lines += [f"  warning: {said(text, words)}" for text in warnings(self.survival, self.rounding)]
            lines.append(f"  note: {INT8_NOTE}")
        else:
            lines.append(f"  (folded before h3bridge measured what survives; rounding {self.rounding})")
        if self.distilled:
            lines.append("  " + Fix("sample with {} ({}), no {}/{}",
                                    (changes(preset="turbo"), changes(steps=DISTILLED_STEPS[-1]), given("reuse"),
                                     given("core_reuse"))).say(words))
        return "\n".join(lines)


def header_sha256(path: Path) -> str:
    """SHA-256 of a safetensors file's 8-byte length and JSON header (what a fold keeps byte-identical)."""
    with open_regular_file(path) as handle:
        prefix = handle.read(8)
        size = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        return hashlib.sha256(prefix + read_announced(handle, path, size, MAX_HEADER_BYTES, too_large)).hexdigest()


def base_identity(inventory: "ModelInventory") -> str:
    """What identifies a model folder without reading its 130 GiB: every shard's path, size and
    header bytes, and its fold record when it has one. Two folders with the same identity hold
    the same tensors at the same offsets; data is compared by `verify --checksums`."""
    digest = hashlib.sha256(b"h3bridge model identity 1\0")
    for path in sorted(inventory.shard_paths):
        relative = path.relative_to(inventory.root)
        digest.update(f"{relative}\0{path.stat().st_size}\0{header_sha256(path)}\0".encode())
    record = inventory.root / PROVENANCE_FILE
    if record.is_file():
        digest.update(hashlib.sha256(record.read_bytes()).hexdigest().encode())
    return digest.hexdigest()


def write_provenance(root: Path, provenance: Provenance) -> None:
    """The fold record, written through safeio.outputs (staged, fsynced) into the fold's folder."""
    write_output(root / PROVENANCE_FILE, json.dumps(provenance.to_dict(), indent=1, sort_keys=True) + "\n",
                 overwrite=False, field="the fold record", make_parents=False)


def read_provenance(root: Path) -> Provenance | None:
    """The fold record of a model folder; None when it has none. ValueError when it is damaged."""
    path = Path(root) / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        document = read_json_capped(path, MAX_RECORD_BYTES, not_regular, too_large)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError("not an h3bridge fold record")
        if document.get("version") != VERSION:
            raise ValueError(f"record version {document.get('version')!r}, this h3bridge reads {VERSION}")
        return Provenance.from_dict(document)
    except (OSError, TypeError, KeyError, ValueError) as error:
        raise ValueError(f"{path} is damaged ({error})") from None


def check_provenance(root: Path, provenance: Provenance) -> list[Problem]:
    """The folded shards are the ones the fold wrote (size and header; cheap, on every check)."""
    problems: list[Problem] = []
    for record in provenance.folded_files:
        path = root / record.relative
        fix = (f"fold again (`{h3bridge_command('lora', 'fold')}` with the base and LoRAs the record names): this "
               "file is not the one the fold wrote, so the model is "
               "neither the base nor the folded model its record describes")
        if not path.is_file():
            problems.append(Problem("error", "fold-record", f"{path}: folded shard listed in {PROVENANCE_FILE} "
                                    "is missing", fix, path))
        elif path.stat().st_size != record.size or header_sha256(path) != record.header_sha256:
            problems.append(Problem("error", "fold-record", f"{path}: folded shard differs from the one recorded "
                                    f"in {PROVENANCE_FILE} (size or header changed)", fix, path))
    return problems


def request_warnings(request: "GenerationRequest", provenance: Provenance | None) -> "list[str | Fix]":
    """What upstream's Turbo measurements (h3.c PR #14) say about this request on this model (each
    a Fix: it names settings, which each interface says in its words)."""
    if provenance is None or not provenance.distilled:
        return []
    names = ", ".join(lora.name for lora in provenance.loras if lora.distilled)
    warnings: list[str | Fix] = []
    folded = literal(f"this model has a step-distillation LoRA folded in ({names}); ")
    if request.reuse > 1 or request.core_reuse > 1:
        warnings.append(Fix(folded + "the distilled schedule removes the redundancy {} and {} rely on, so they "
                            "cost quality (fix: {}, as {} sets)",
                            (given("reuse"), given("core_reuse"), changes(reuse=1, core_reuse=1),
                             changes(preset="turbo"))))
    if request.steps > DISTILLED_MAX_STEPS:
        warnings.append(Fix(folded + f"it is sampled with {DISTILLED_STEPS[0]}-{DISTILLED_STEPS[1]} steps, and "
                            f"{request.steps} only cost time (fix: {{}}, or {{}})",
                            (changes(steps=DISTILLED_STEPS[-1]), changes(preset="turbo"))))
    elif request.steps < DISTILLED_STEPS[0]:
        warnings.append(Fix(f"{request.steps} steps on a step-distilled model: upstream saw motion smear at 4 steps, "
                            "5 is the validated floor (fix: {} or {})",
                            (changes(steps=DISTILLED_STEPS[0]), changes(steps=DISTILLED_STEPS[1]))))
    return warnings

