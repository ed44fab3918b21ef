"""Model inventory: what is in a MiniMax-H3 directory, and what is wrong with it, before h3 loads it.

The official layout is the one h3.c reads (8974cc0):
  h3.c `h3_load_dir`: FL2VA/transformer/config.json and FL2VA/tokenizer/tokenizer.json must be
    files; FL2VA/{text_encoder,transformer,video_vae/source,audio_vae} must each hold >= 1
    `*.safetensors` (h3_safetensors.c `h3_st_inventory_dir`, which skips dotfiles);
    Ref2VA is enabled only when Ref2VA/transformer/model.safetensors.index.json is a file, and then
    Ref2VA/transformer is inventoried too.
  h3.c `h3_generate`: reference jobs read the Ref2VA/{tokenizer,text_encoder,transformer,video_vae/source,
    audio_vae} copies.
  h3_video_vae.c / h3_audio_vae.c `load_latent_normalization`: video_vae/config.json and
    audio_vae/config.json, read when decoding.
  h3_weights.c `h3_weight_store_open`: loads every `*.safetensors` in a component directory,
    dotfiles included, so an AppleDouble `._x.safetensors` passes `--info` and fails at load.

Layouts users end up with by mistake are reported as `Problem`s with a fix.

Ref2VA is optional upstream ("Keep prompt-only FL2VA usable while that optional 62 GiB checkpoint
is not installed", h3.c `h3_load_dir`): a problem inside Ref2VA/ stops only reference jobs
(`Problem.references_only`), except what h3_load_dir itself reads for every job once the Ref2VA
index exists: the headers of the visible Ref2VA/transformer shards.

Nothing here opens a FIFO, device or socket: paths are stat'ed first, and what is opened is
opened with O_NONBLOCK (safetensors.open_regular_file).
"""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from ..errors import IntegrityError, ModelError
from ..fixes import Fix, Words, changes, joined, literal, python_words, said
from ..safeio.paths import UNENDING_KINDS, non_regular_kind, not_regular, read_json_capped, symlink_note, too_large
from .safetensors import (
    GGUF_MAGIC,
    GIT_LFS_POINTER_PREFIX,
    ShardHeader,
    not_a_file_error,
    open_regular_file,
    read_header,
)
from .fold_record import PROVENANCE_FILE, check_provenance, read_provenance
from .problem import Problem
from ..runnable import command, h3bridge_command

FL2VA, REF2VA = "FL2VA", "Ref2VA"
PARTITIONS = (FL2VA, REF2VA)
OFFICIAL_REPO = "MiniMaxAI/MiniMax-H3"
DOWNLOAD_HINT = (f"download the official layout: `{h3bridge_command('model', 'download', 'DIR')}` (or "
                 f"`{command('hf', 'download', OFFICIAL_REPO, '--local-dir', 'DIR')}`)")
HF_DOWNLOAD_CACHE = Path(".cache") / "huggingface" / "download"   # `--local-dir` keeps partial files here

# h3_text_encoder.c's vocabulary (151936 rows of the text encoder's embedding): upstream hard-codes the
# released dimensions and refuses any other ("weight model.language_model.embed_tokens.weight shape
# mismatch at dimension 0"). h3-sim's small fixture (h3-sim-model DIR, the demo's model) has 16 rows.
EMBED_TOKENS = "model.language_model.embed_tokens.weight"
RELEASED_VOCAB = 151936


def small_fixture_note() -> Fix:
    """What to know about h3-sim's small fixture model, and the fixture upstream's h3 can run (a
    Fix: it names a setting, which each interface says in its words)."""
    return Fix(literal("h3-sim's small fixture model (tiny tensors): only h3-sim runs it; upstream's h3 (build-engine's, "
                       f"or the Metal h3) needs the released shapes: `{command('h3-sim-model', '--realistic', 'DIR')}` "
                       "writes them as sparse files (no disk used; render with ") + "{} on a machine under ~32 GB)",
               (changes(ssd_streaming=True),))


@dataclass(frozen=True)
class ComponentSpec:
    key: str
    relative: str        # inside a partition
    label: str


# h3.c h3_load_dir inventory order.
COMPONENTS: tuple[ComponentSpec, ...] = (
    ComponentSpec("text_encoder", "text_encoder", "text encoder (Qwen3-VL)"),
    ComponentSpec("transformer", "transformer", "transformer (DiT)"),
    ComponentSpec("video_vae", "video_vae/source", "video VAE"),
    ComponentSpec("audio_vae", "audio_vae", "audio VAE"),
)
REQUIRED_FILES = ("transformer/config.json", "tokenizer/tokenizer.json")   # h3.c h3_require_file
DECODE_CONFIGS = ("video_vae/config.json", "audio_vae/config.json")       # load_latent_normalization
REF2VA_MARKER = "transformer/model.safetensors.index.json"                 # h3.c h3_load_dir

PARTIAL_SUFFIXES = (".incomplete", ".part", ".partial", ".aria2", ".crdownload", ".download", ".tmp")
QUANTIZED_NAME = re.compile(r"(int8|fp8|f8_e|nvfp4|mxfp4|awq|gptq|convrot|w[468]a[468]|q[2-8]_k|bnb|4bit|8bit)",
                            re.IGNORECASE)
QUANT_TENSOR_SUFFIXES = (".weight_scale", ".weight_scale_2", ".scale_weight", ".input_scale", ".comfy_quant",
                         ".qweight", ".scales", ".absmax")
COMFY_MODEL_DIRS = ("diffusion_models", "text_encoders", "vae", "checkpoints", "unet")


@dataclass
class Component:
    partition: str
    spec: ComponentSpec
    directory: Path
    shards: list[ShardHeader] = field(default_factory=list)
    shard_paths: list[Path] = field(default_factory=list)   # every *.safetensors h3 would open

    @property
    def files(self) -> int:
        return len(self.shard_paths)

    @property
    def tensors(self) -> int:
        return sum(len(shard.tensors) for shard in self.shards)

    @property
    def file_bytes(self) -> int:
        return sum(shard.file_size for shard in self.shards)

    @property
    def tensor_bytes(self) -> int:
        return sum(shard.tensor_bytes for shard in self.shards)

    @property
    def dtype_bytes(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for shard in self.shards:
            for tensor in shard.tensors:
                counts[tensor.dtype] += tensor.nbytes
        return dict(counts.most_common())

    def bytes_where(self, predicate: Callable[[str], bool]) -> int:
        return sum(t.nbytes for shard in self.shards for t in shard.tensors if predicate(t.name))

    def tensor_names(self) -> Iterator[str]:
        for shard in self.shards:
            for tensor in shard.tensors:
                yield tensor.name


@dataclass
class Partition:
    name: str
    directory: Path
    components: dict[str, Component] = field(default_factory=dict)
    enabled: bool = True       # Ref2VA: whether h3 would use it (its index JSON exists)


@dataclass
class ModelInventory:
    root: Path
    partitions: dict[str, Partition] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    provenance: object | None = None     # fold_record.Provenance: this is a folded model (h3bridge lora fold)

    @property
    def errors(self) -> list[Problem]:
        """Errors that stop every job (h3 fails to load or render)."""
        return [p for p in self.problems if p.severity == "error" and not p.references_only]

    @property
    def reference_errors(self) -> list[Problem]:
        """Errors in the optional Ref2VA checkpoint: only reference jobs fail on them."""
        return [p for p in self.problems if p.severity == "error" and p.references_only]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def has_ref2va(self) -> bool:
        """Reference (Ref2VA) jobs can run: h3 enables Ref2VA (its index exists) and it is complete."""
        partition = self.partitions.get(REF2VA)
        return partition is not None and partition.enabled and not self.reference_errors

    @property
    def shard_paths(self) -> list[Path]:
        return [path for partition in self.partitions.values()
                for component in partition.components.values() for path in component.shard_paths]

    @property
    def file_bytes(self) -> int:
        return sum(c.file_bytes for p in self.partitions.values() for c in p.components.values())

    @property
    def small_fixture(self) -> bool:
        """The text encoder has h3-sim's small fixture shapes (see RELEASED_VOCAB): no real h3 runs it."""
        encoder = self.component(FL2VA, "text_encoder")
        rows = [t.shape[0] for shard in (encoder.shards if encoder else []) for t in shard.tensors
                if t.name == EMBED_TOKENS and t.shape]
        return bool(rows) and rows[0] < RELEASED_VOCAB

    def component(self, partition: str, key: str) -> Component | None:
        found = self.partitions.get(partition)
        return found.components.get(key) if found else None

    def raise_for_problems(self, *, references: bool = False) -> None:
        """Raise the first error as its typed exception (IntegrityError for damaged shards).
        `references`: for a reference (Ref2VA) job, which also fails on Ref2VA's own problems;
        other jobs never read Ref2VA beyond its transformer headers, as upstream."""
        if self.errors:
            first = self.errors[0].exception()
            if len(self.errors) == 1:
                raise first
            message = f"{first.message} (and {len(self.errors) - 1} more problem(s): run `{h3bridge_command('info', '-d', self.root)}`)"
            if isinstance(first, IntegrityError):
                raise IntegrityError(message, path=first.path, tensor=first.tensor, hint=first.hint)
            raise ModelError(message, hint=first.hint)
        if references and self.reference_errors:
            raise self.incomplete_ref2va_error()

    def incomplete_ref2va_error(self) -> ModelError:
        """Why a reference job cannot run from this Ref2VA/: every piece it lacks (errors first)."""
        problems = self.reference_errors + [p for p in self.warnings if p.references_only]
        shown = "; ".join(p.message for p in problems[:4])
        more = f"; and {len(problems) - 4} more (run `{h3bridge_command('info', '-d', self.root)}`)" if len(problems) > 4 else ""
        message = (f"references need h3's Ref2VA checkpoint, and {self.root / REF2VA} is incomplete: "
                   f"{shown}{more}")
        fix = self.ref2va_download_fix + " (jobs without references do not need Ref2VA and still run)"
        first = problems[0].exception()
        if len(problems) == 1 and isinstance(first, IntegrityError):
            return IntegrityError(message, path=first.path, tensor=first.tensor, hint=fix)
        return ModelError(message, hint=fix)

    def warnings_for(self, *, references: bool = False) -> "list[str | Fix]":
        """What a user starting a job should be told but not stopped by, one line each: the
        warnings, and for a job without references, that Ref2VA is incomplete (a Fix where a
        problem's fix names settings)."""
        lines = [joined(f"{p.message} (fix: ", p.fix, ")") for p in self.warnings if not p.references_only]
        problems = self.reference_errors + [p for p in self.warnings if p.references_only]
        if problems and not references:
            lines.append(f"{self.root / REF2VA} is incomplete ({len(problems)} problem(s), e.g. {problems[0].message}); "
                         "this job does not use it, but jobs with references will be refused until it is "
                         f"complete (fix: {self.ref2va_download_fix})")
        return lines

    @property
    def ref2va_download_fix(self) -> str:
        # A Hugging Face cache snapshot is filled by downloading into the cache, not into a folder.
        into = () if hf_cache_blobs_dir(self.root) is not None else ("--local-dir", self.root)
        download = command("hf", "download", OFFICIAL_REPO, "--include", "Ref2VA/*", *into)
        return (f"finish the Ref2VA download: `{download}` "
                f"(it continues where it stopped), then `{h3bridge_command('verify', '-d', self.root)}`")

    def to_dict(self, words: Words = python_words) -> dict[str, object]:
        """The inventory as JSON; the fixes said with `words` (the interface's renderer)."""
        return {
            "root": str(self.root), "ref2va": self.has_ref2va, "file_bytes": self.file_bytes,
            "partitions": {name: {"enabled": partition.enabled, "components": {
                key: {"directory": str(c.directory), "files": c.files, "tensors": c.tensors,
                      "file_bytes": c.file_bytes, "tensor_bytes": c.tensor_bytes, "dtype_bytes": c.dtype_bytes}
                for key, c in partition.components.items()}} for name, partition in self.partitions.items()},
            "problems": [{"severity": p.severity, "kind": p.kind, "message": p.message, "fix": said(p.fix, words),
                          "references_only": p.references_only,
                          "path": None if p.path is None else str(p.path)} for p in self.problems],
            "provenance": None if self.provenance is None else self.provenance.to_dict(),  # type: ignore[attr-defined]
            "small_fixture": self.small_fixture,
        }

    def table(self, words: Words = python_words) -> str:
        """The inventory as a fixed-width table, then problems with their fixes (the settings they
        name said with `words`, the interface's renderer)."""
        lines = [f"model: {self.root}"]
        if self.partitions:
            lines.append(f"{'component':<30} {'files':>5} {'tensors':>8} {'size':>10}  dtypes")
        for partition in self.partitions.values():
            state = "" if partition.enabled else "  (ignored by h3: no transformer/model.safetensors.index.json)"
            lines.append(f"{partition.name}{state}")
            for component in partition.components.values():
                dtypes = ", ".join(f"{name} {format_bytes(size)}" for name, size in component.dtype_bytes.items())
                lines.append(f"  {component.spec.relative:<28} {component.files:>5} {component.tensors:>8} "
                             f"{format_bytes(component.file_bytes):>10}  {dtypes}")
        if self.partitions:
            lines.append(f"{'total':<30} {len(self.shard_paths):>5} "
                         f"{sum(c.tensors for p in self.partitions.values() for c in p.components.values()):>8} "
                         f"{format_bytes(self.file_bytes):>10}")
        if FL2VA in self.partitions and not self.has_ref2va:
            state = "incomplete" if REF2VA in self.partitions else "not installed"
            lines.append(f"Ref2VA: {state} (prompt-only and first/last-frame jobs work; references need it)")
        if self.provenance is not None:
            lines.append(self.provenance.summary(words))      # type: ignore[attr-defined]
        if self.small_fixture:
            lines.append(f"note: {small_fixture_note().say(words)}")
        for problem in self.problems:
            lines.append(f"{problem.label}: {problem.message}")
            lines.append(f"  fix: {said(problem.fix, words)}")
        if not self.problems:
            lines.append(f"layout: OK (headers checked; `{h3bridge_command('verify', '-d', self.root, '--checksums')}` "
                         "also hashes the data)")
        return "\n".join(lines)


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


# ---------------------------------------------------------------------------------------------
# Detection of mistaken layouts


def _walk_files(root: Path) -> Iterator[Path]:
    """Every entry below `root` but directories, and also directories named *.safetensors
    (h3 would try to open those as shards)."""
    for directory, subdirs, files in os.walk(root):
        for name in files:
            yield Path(directory) / name
        for name in subdirs:
            if name.endswith(".safetensors"):
                yield Path(directory) / name


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open_regular_file(path) as handle:     # a FIFO or device is never opened blocking
            return handle.read(len(magic)) == magic
    except (OSError, IntegrityError):
        return False


def _is_lfs_pointer(path: Path) -> bool:
    try:
        return path.stat().st_size < 1024 and _starts_with(path, GIT_LFS_POINTER_PREFIX)
    except OSError:
        return False


def hf_cache_blobs_dir(root: Path) -> Path | None:
    """For a Hugging Face cache snapshot (hub/models--org--name/snapshots/<rev>), its blobs dir."""
    resolved = root.resolve()
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        return resolved.parent.parent / "blobs"
    return None


def _ref2va_enabled(root: Path) -> bool:
    return (root / REF2VA / REF2VA_MARKER).is_file()


def _references_only(root: Path, path: Path) -> bool:
    """Does a problem at `path` stop only reference jobs? Yes inside Ref2VA/ (or the `--local-dir`
    download cache's copy of it), except for the files h3_load_dir reads for every job once the
    Ref2VA index exists: the visible *.safetensors of Ref2VA/transformer."""
    try:
        relative = path.relative_to(root)
    except ValueError:
        return False
    cached = relative.parts[:len(HF_DOWNLOAD_CACHE.parts)] == HF_DOWNLOAD_CACHE.parts
    if cached:
        relative = relative.relative_to(HF_DOWNLOAD_CACHE)
    if not relative.parts or relative.parts[0] != REF2VA:
        return False
    loaded_at_start = (not cached and _ref2va_enabled(root) and relative.parent == Path(REF2VA, "transformer")
                       and relative.name.endswith(".safetensors") and not relative.name.startswith("."))
    return not loaded_at_start


def _files_h3_reads(root: Path) -> "_ReadByH3":
    """Which paths h3 opens: every *.safetensors of a component folder (both partitions), and the
    config and tokenizer files it requires or decodes with."""
    return _ReadByH3({root / partition / spec.relative for partition in PARTITIONS for spec in COMPONENTS},
                     {root / partition / name for partition in PARTITIONS for name in REQUIRED_FILES + DECODE_CONFIGS})


@dataclass(frozen=True)
class _ReadByH3:
    shard_dirs: set[Path]
    files: set[Path]

    def __contains__(self, path: object) -> bool:
        assert isinstance(path, Path)
        return path in self.files or (path.parent in self.shard_dirs and path.name.endswith(".safetensors"))


def _scan_tree(root: Path, inventory: ModelInventory) -> None:
    found: dict[str, list[Path]] = {}
    not_files: list[tuple[Path, str]] = []
    for path in _walk_files(root):
        name = path.name
        kind = non_regular_kind(path)    # stat only: a FIFO or device must never be opened
        # Any file that would hang a reader or never end (tools that read or copy every file of
        # the model, `lora fold`, must not meet one unwarned); and for weights, anything not a file.
        if kind is not None and (name.endswith(".safetensors") or kind in UNENDING_KINDS):
            not_files.append((path, kind))
            continue
        if name.startswith("._"):
            found.setdefault("appledouble", []).append(path)
        elif name.endswith(PARTIAL_SUFFIXES):
            found.setdefault("partial", []).append(path)
        elif name.endswith(".gguf") or (name.endswith(".safetensors") and _starts_with(path, GGUF_MAGIC)):
            found.setdefault("gguf", []).append(path)
        elif name.endswith(".safetensors") and _is_lfs_pointer(path):
            found.setdefault("lfs", []).append(path)
    blobs = hf_cache_blobs_dir(root)
    if blobs is not None and blobs.is_dir():
        found.setdefault("partial", []).extend(sorted(p for p in blobs.iterdir() if p.name.endswith(".incomplete")))
    # One problem per kind for what stops every job, and one for what stops only reference jobs.
    for references_only in (False, True):
        def add(problem: Problem) -> None:
            inventory.problems.append(replace(problem, references_only=references_only))

        def pick(kind: str) -> list[Path]:
            return [p for p in found.get(kind, []) if _references_only(root, p) == references_only]

        _report_tree_findings(root, add, pick("appledouble"), pick("partial"), pick("gguf"), pick("lfs"),
                              [(p, k) for p, k in not_files if _references_only(root, p) == references_only])


def _report_tree_findings(root: Path, add: Callable[[Problem], None], appledouble: list[Path], partial: list[Path],
                          gguf: list[Path], lfs: list[Path], not_files: list[tuple[Path, str]]) -> None:
    if not_files:
        read_by_h3 = _files_h3_reads(root)
        loaded = [(p, k) for p, k in not_files if p in read_by_h3]
        path, kind = (loaded or not_files)[0]
        count = f" (and {len(not_files) - 1} more such entries)" if len(not_files) > 1 else ""
        if loaded or path.name.endswith(".safetensors"):
            error = not_a_file_error(path, kind)
            message, fix = error.message, error.hint or ""
        else:
            error = None
            message = f"{path}: is {kind}{symlink_note(path)}, not a file: reading it would block or never end"
            fix = f"remove it (`rm {path}`); `{h3bridge_command('lora', 'fold')}` copies every file of the model and refuses it"
        unread = "folder" if path.parent not in read_by_h3.shard_dirs else "file"
        add(Problem("error" if loaded else "warning", "not-a-file",
                    message + count + ("" if loaded else f"; h3 does not read this {unread}, but tools that scan "
                                                         "the model do"),
                    fix, path, error if loaded else None))
    if appledouble:
        weights = [p for p in appledouble if p.name.endswith(".safetensors")]
        add(Problem(
            "error" if weights else "warning", "appledouble",
            f"{len(appledouble)} AppleDouble '._*' file(s) (macOS metadata left by copying through exFAT/SMB), "
            f"e.g. {appledouble[0]}"
            + ("; h3 skips them in --info but tries to load them as weights and fails" if weights else ""),
            f"delete them: `dot_clean -m {root}` or `find {root} -name '._*' -delete`", appledouble[0]))
    if partial:
        ours = root / ".cache" / "h3bridge" in partial[0].parents     # `h3bridge model download`'s .part files
        resume = (f"`{h3bridge_command('model', 'download', root)}`" if ours
                  else f"`{command('hf', 'download', OFFICIAL_REPO, '--local-dir', root)}`")
        add(Problem("error", "partial-download",
                    f"unfinished download: {len(partial)} partial file(s), e.g. {partial[0]}",
                    f"resume the download ({resume} continues where it stopped), then run "
                    f"`{h3bridge_command('verify', '-d', root, '--checksums')}`", partial[0]))
    if gguf:
        add(Problem("error", "gguf",
                    f"GGUF file(s) h3 cannot read (it reads BF16/F32 safetensors only), e.g. {gguf[0]}",
                    DOWNLOAD_HINT, gguf[0]))
    if lfs:
        add(Problem("error", "git-lfs-pointer",
                    f"{len(lfs)} Git LFS pointer file(s) instead of weights (cloned without LFS), e.g. {lfs[0]}",
                    f"run `git lfs pull` in {root}, or {DOWNLOAD_HINT}", lfs[0]))


def _detect_foreign_layout(root: Path, inventory: ModelInventory) -> bool:
    """No FL2VA/: say what the directory looks like instead. True when something was reported."""
    add = inventory.problems.append
    if root.name in PARTITIONS and (root / "transformer").is_dir():
        add(Problem("error", "partition-given",
                    f"{root} is the {root.name} partition, not the model directory",
                    Fix("pass its parent: {}", (changes(model_dir=str(root.parent)),)), root))
        return True
    children = [c for c in root.iterdir() if c.is_dir()] if root.is_dir() else []
    nested = [c for c in children if (c / FL2VA).is_dir()]
    if nested:
        add(Problem("error", "nested-model", f"{root} holds the model one level down, in {nested[0]}",
                    Fix("pass {}", (changes(model_dir=str(nested[0])),)), nested[0]))
        return True
    singles = [p for p in root.glob("*.safetensors") if not p.name.startswith("._")]
    for sub in COMFY_MODEL_DIRS:
        singles += [p for p in (root / sub).glob("*.safetensors") if not p.name.startswith("._")]
    if singles:
        quantized = [p for p in singles if QUANTIZED_NAME.search(p.name)]
        detail = (f"; {len(quantized)} of them quantized ({quantized[0].name}), which h3 cannot read either"
                  if quantized else "")
        add(Problem("error", "comfyui-repack",
                    f"{root} holds single-file repacks (e.g. {singles[0].name}), as ComfyUI uses; h3 reads only the "
                    f"official sharded FL2VA/ and Ref2VA/ tree{detail}",
                    f"{DOWNLOAD_HINT} (ComfyUI repacks also misalign data, upstream issue 18)", singles[0]))
        return True
    if (root / REF2VA).is_dir():
        add(Problem("error", "missing-partition",
                    f"{root} has Ref2VA/ but no FL2VA/; h3 needs FL2VA for every job (missing required model file: "
                    f"{root / FL2VA / REQUIRED_FILES[0]})",
                    f"{DOWNLOAD_HINT} (include the FL2VA/ folder)", root / FL2VA))
        return True
    return False


# model.safetensors.index.json names each tensor's shard: a few hundred KiB for H3; read with a cap
# (safeio.paths), so one padded to gigabytes is a bad index, not a MemoryError.
MAX_INDEX_BYTES = 64 * 1024 * 1024


def _check_index(component: Component, add: Callable[[Problem], None]) -> None:
    """model.safetensors.index.json lists every shard and tensor; a gap means a partial download."""
    index_path = component.directory / "model.safetensors.index.json"
    if not index_path.is_file():
        return
    try:
        weight_map = read_json_capped(index_path, MAX_INDEX_BYTES, not_regular, too_large)["weight_map"]
        listed = set(weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        add(Problem("error", "bad-index", f"{index_path} is not a valid shard index ({error})",
                    f"download it again ({DOWNLOAD_HINT})", index_path))
        return
    present = {p.name for p in component.shard_paths}
    missing = sorted(listed - present)
    if missing:
        add(Problem("error", "missing-shards",
                    f"{component.directory}: {len(missing)} of {len(listed)} shards listed in "
                    f"model.safetensors.index.json are missing (e.g. {missing[0]}): a partial download",
                    f"resume the download ({DOWNLOAD_HINT})", component.directory / missing[0]))
        return
    if component.shards and len(component.shards) == len(component.shard_paths):
        names = set(component.tensor_names())
        absent = sorted(set(weight_map) - names)
        if absent:
            add(Problem("error", "missing-tensors",
                        f"{component.directory}: {len(absent)} tensor(s) listed in the index are in no shard "
                        f"(e.g. {absent[0]})", f"download the shards again ({DOWNLOAD_HINT})", component.directory))


def _check_quantized(component: Component, add: Callable[[Problem], None]) -> None:
    """int8 / nvfp4 style checkpoints use dtypes upstream parses (I8, U8) but cannot load as weights."""
    quant_tensors = [n for n in component.tensor_names() if n.endswith(QUANT_TENSOR_SUFFIXES)]
    int_matrices = [t.name for s in component.shards for t in s.tensors
                    if t.dtype in ("I8", "U8") and len(t.shape) >= 2]
    if quant_tensors or int_matrices:
        example = (int_matrices or quant_tensors)[0]
        add(Problem("error", "quantized",
                    f"{component.directory} is a quantized checkpoint (e.g. tensor {example!r}); h3 loads BF16/F32 "
                    "weights only (it quantizes at load time itself on M5)",
                    f"{DOWNLOAD_HINT} (the BF16 release)", component.directory))


def _component_shards(directory: Path) -> list[Path]:
    """What h3_weights.c opens: every name ending in .safetensors, dotfiles included, sorted.
    FIFOs, devices and directories are left out here (the tree scan reports them)."""
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(".safetensors") and p.is_file())
    except OSError:
        return []


def _inventory_partition(root: Path, name: str, inventory: ModelInventory, *, read_headers: bool) -> None:
    base = root / name

    partition = Partition(name=name, directory=base)

    def add(problem: Problem) -> None:
        # In Ref2VA, only what h3_load_dir reads for every job stops every job: once the index
        # exists, the inventory of Ref2VA/transformer (its visible shards, see _references_only).
        inventory_fails = partition.enabled and problem.path is not None and (
            (problem.kind == "missing-component" and problem.path == base / "transformer")
            or (problem.kind == "integrity" and not _references_only(root, problem.path)))
        scoped = name == REF2VA and not inventory_fails
        inventory.problems.append(replace(problem, references_only=True) if scoped else problem)

    if name == REF2VA:
        partition.enabled = _ref2va_enabled(root)
        if not partition.enabled:
            add(Problem("warning", "ref2va-ignored",
                        f"{base} exists but has no {REF2VA_MARKER}; h3 ignores it, so reference jobs will fail",
                        f"finish the Ref2VA download ({DOWNLOAD_HINT})", base / REF2VA_MARKER))
    inventory.partitions[name] = partition
    severity = "error" if partition.enabled else "warning"

    def require_files(names: tuple[str, ...]) -> None:
        for relative in names:
            if not (base / relative).is_file():
                # h3.c h3_require_file: "missing required model file: %s"
                add(Problem(severity, "missing-file", f"missing required model file: {base / relative}",
                            f"{DOWNLOAD_HINT} (config and tokenizer files are part of the snapshot)",
                            base / relative))

    # Problems in upstream's order: h3_load_dir's required files, then its component inventories,
    # then the VAE configs that decoding reads later.
    require_files(REQUIRED_FILES)
    for spec in COMPONENTS:
        directory = base / spec.relative
        component = Component(partition=name, spec=spec, directory=directory,
                              shard_paths=_component_shards(directory))
        partition.components[spec.key] = component
        visible = [p for p in component.shard_paths if not p.name.startswith(".")]
        if not visible:
            # h3_safetensors.c h3_st_inventory_dir: "%s: no safetensors files"
            add(Problem(severity, "missing-component", f"{directory}: no safetensors files",
                        DOWNLOAD_HINT, directory))
            continue
        if read_headers:
            for path in component.shard_paths:
                if path.name.startswith("._") or _is_lfs_pointer(path):
                    continue     # already reported by the tree scan, with its own fix
                try:
                    component.shards.append(read_header(path))
                except IntegrityError as error:
                    add(Problem("error", "integrity", error.message, error.hint or "", path, error))
            _check_quantized(component, add)
        _check_index(component, add)
    require_files(DECODE_CONFIGS)


def resolve_model_root(model_dir: str | Path) -> Path:
    """A Hugging Face cache repo folder (hub/models--org--name) stands for the snapshot its
    refs/main points at; any other path is itself."""
    root = Path(model_dir).expanduser()
    if root.name.startswith("models--") and (root / "snapshots").is_dir() and not (root / FL2VA).exists():
        try:
            reference = root / "refs" / "main"
            revision = reference.read_text().strip() if non_regular_kind(reference) is None else ""
        except OSError:
            revision = ""
        snapshots = sorted((root / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime)
        chosen = root / "snapshots" / revision if revision else (snapshots[-1] if snapshots else None)
        if chosen is not None and chosen.is_dir():
            return chosen
    return root


def inspect_model(model_dir: str | Path, *, read_headers: bool = True) -> ModelInventory:
    """Inventory a model directory; reads shard headers only. Never raises for layout problems:
    they are in `problems` (call `raise_for_problems`). Raises ModelError only if the path is unusable."""
    try:
        return _inspect_model(model_dir, read_headers=read_headers)
    except OSError as error:     # a folder we may not list, a file vanishing mid-scan, an I/O error
        raise ModelError(f"cannot read the model directory {model_dir}: {error}",
                         hint="check the folder's permissions and that its disk is attached") from None


def not_a_model_folder_error(path: Path) -> ModelError:
    """Why `path`, given as the model folder, is not one: missing, a repack file (GGUF or a
    single-file checkpoint, which h3 cannot load), or something else that is not a folder. One
    wording for `info FILE`, `-d FILE` and H3_MODEL_DIR=FILE."""
    from ..safeio.paths import not_a_folder
    if not os.path.lexists(path):
        return ModelError(f"the model directory {path} does not exist", hint=f"{DOWNLOAD_HINT}, or fix the path")
    if path.is_file() and non_regular_kind(path) is None:
        kind = "a GGUF file" if _starts_with(path, GGUF_MAGIC) else "a single-file checkpoint"
        return ModelError(f"{path} is {kind}; h3 needs the official model directory "
                          "(FL2VA/ and optional Ref2VA/ folders), not a ComfyUI-style repack",
                          hint=f"{DOWNLOAD_HINT}, then give that folder")
    return ModelError(f"{path} is {not_a_folder(path) or 'not a folder'}, not a model folder",
                      hint="pass the model folder, the one that holds FL2VA/")


def _inspect_model(model_dir: str | Path, *, read_headers: bool) -> ModelInventory:
    root = resolve_model_root(model_dir)
    inventory = ModelInventory(root=root)
    if not root.exists():
        raise ModelError(f"model directory not found: {root}", hint=DOWNLOAD_HINT)
    if root.is_file():
        raise not_a_model_folder_error(root)
    if not (root / FL2VA).is_dir():
        # Not a model folder: say so, and nothing else. Its files are not the model's, so there is
        # no tree to scan (`info /` walked the whole file system) and nothing in it to delete.
        if not _detect_foreign_layout(root, inventory):
            inventory.problems.append(Problem(
                "error", "not-a-model",
                f"{root} is not a MiniMax-H3 model directory (missing required model file: "
                f"{root / FL2VA / REQUIRED_FILES[0]})",
                f"pass the model folder, the one that holds FL2VA/; or {DOWNLOAD_HINT} (DIR: a new folder)", root))
        return inventory
    _scan_tree(root, inventory)
    for name in PARTITIONS:
        if name == FL2VA or (root / name).is_dir():
            _inventory_partition(root, name, inventory, read_headers=read_headers)
    _scope_unfinished_blobs(root, inventory)
    _read_fold_record(root, inventory)
    return inventory


def _read_fold_record(root: Path, inventory: ModelInventory) -> None:
    """A folded model's record (fold_record.py), and whether its shards still match it."""
    try:
        inventory.provenance = read_provenance(root)
    except ValueError as error:
        inventory.problems.append(Problem(
            "warning", "fold-record", f"{error}: this may be a folded model (h3bridge lora fold) whose base and "
            "LoRAs can no longer be told", f"fold it again, or remove {root / PROVENANCE_FILE} if it is the base",
            root / PROVENANCE_FILE))
        return
    if inventory.provenance is not None:
        inventory.problems.extend(check_provenance(root, inventory.provenance))   # type: ignore[arg-type]


def _scope_unfinished_blobs(root: Path, inventory: ModelInventory) -> None:
    """A Hugging Face cache's unfinished blobs are not linked into the snapshot yet. When nothing
    else stops every job, every file a job without references reads is there and checked, so
    the blobs can only hold what reference jobs read (a Ref2VA download under way, typically): like
    a Ref2VA problem, they stop only reference jobs."""
    blobs = hf_cache_blobs_dir(root)
    if blobs is None:
        return
    unfinished = [p for p in inventory.errors
                  if p.kind == "partial-download" and p.path is not None and p.path.parent == blobs]
    if unfinished and len(unfinished) == len(inventory.errors):
        inventory.problems = [replace(p, references_only=True) if any(p is u for u in unfinished) else p
                              for p in inventory.problems]
