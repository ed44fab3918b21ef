"""LoRA files: their naming conventions, and the mapping of their modules onto a checkpoint's keys.

Conventions read (the ones people have):
  PEFT / diffusers   MODULE.lora_A.weight [rank, in] + MODULE.lora_B.weight [out, rank]
                     (also MODULE.lora_A.default.weight, PEFT's adapter-named form, and the older
                     diffusers MODULE.lora.down.weight / MODULE.lora.up.weight)
  kohya / musubi     MODULE.lora_down.weight [rank, in] + MODULE.lora_up.weight [out, rank]
                     + MODULE.alpha (a scalar): the update is scaled by alpha / rank
MODULE is the checkpoint's own key without `.weight`, after an optional prefix
(`diffusion_model.`, `model.diffusion_model.`, `transformer.`, `base_model.model.`), or kohya's
flattened form `lora_unet_blocks_0_attn_qkv_proj` (dots turned into underscores), which is mapped
back through the checkpoint's own names (never by guessing where the dots were).
Upstream's Turbo LoRA (h3.c PR #14, larryvrh/MiniMax-H3-Turbo-Lora) is the PEFT form over the
transformer's key space, with no alpha: scale 1. A PEFT folder (adapter_model.safetensors beside
adapter_config.json) is read with its config's `lora_alpha` and `r` (scale lora_alpha / r, or
lora_alpha / sqrt(r) with `use_rslora`).

A module's update is strength * scale * (up @ down), scale = alpha / rank when the file has an
alpha, else the PEFT config's, else 1.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import IntegrityError, LoraError
from ..model.safetensors import ShardHeader, TensorInfo, read_header
from ..safeio.paths import not_regular, read_json_capped, too_large

PEFT, KOHYA = "PEFT/diffusers (lora_A/lora_B)", "kohya (lora_down/lora_up + alpha)"
# (suffix of the down tensor, suffix of the up tensor, convention)
_PAIRS: tuple[tuple[str, str, str], ...] = (
    (".lora_A.weight", ".lora_B.weight", PEFT),
    (".lora_A.default.weight", ".lora_B.default.weight", PEFT),
    (".lora.down.weight", ".lora.up.weight", PEFT),
    (".lora_down.weight", ".lora_up.weight", KOHYA),
)
_ALPHA_SUFFIX = ".alpha"
DOTTED_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.", "base_model.model.", "model.")
FLAT_PREFIXES = ("lora_unet_", "lora_transformer_", "lora_dit_")
FOREIGN_PREFIXES = {"lora_te_": "the text encoder", "lora_te1_": "the text encoder", "lora_te2_": "a second text "
                    "encoder", "text_encoder.": "the text encoder", "vae.": "the VAE"}
LORA_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})        # what the down/up/alpha tensors may be
TARGET_DTYPES = frozenset({"BF16", "F32"})                    # the weights h3 reads that we rewrite
EXAMPLES = 3
# A LoRA's header lists a few thousand tensors (hundreds of KiB, a few MiB with a trainer's metadata);
# read with this cap, not a model shard's 256 MiB, so a header of 200 MiB of spaces is refused unread.
LORA_MAX_HEADER_BYTES = 32 * 1024 * 1024
# adapter_config.json is a few hundred bytes
PEFT_CONFIG_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LoraModule:
    """One low-rank update, as the file names it."""

    module: str              # the file's module name (before mapping)
    convention: str
    down: TensorInfo         # [rank, in]
    up: TensorInfo           # [out, rank]
    alpha: TensorInfo | None

    @property
    def rank(self) -> int:
        return self.down.shape[0] if self.down.shape else 0


@dataclass(frozen=True)
class LoraFile:
    path: Path
    header: ShardHeader
    sha256: str
    modules: tuple[LoraModule, ...]
    unsupported: tuple[str, ...] = ()      # tensors that are no part of a down/up pair (biases, diffs, ...)
    peft_scale: float | None = None        # lora_alpha / r from a PEFT adapter_config.json

    @property
    def diffs(self) -> tuple[str, ...]:
        """Full-weight differences (kohya/LyCORIS `.diff`, `.diff_b`): not low-rank, never folded."""
        return tuple(name for name in self.unsupported if name.endswith((".diff", ".diff_b")))

    @property
    def conventions(self) -> tuple[str, ...]:
        return tuple(sorted({m.convention for m in self.modules}))


@dataclass(frozen=True)
class TargetUpdate:
    """A module mapped onto a checkpoint tensor."""

    lora_index: int
    module: LoraModule
    target: str              # the checkpoint's key


def sha256_of(path: Path) -> str:
    """A file's SHA-256, cached by path, size and mtime in the cache `verify --checksums` uses."""
    from ..model.verify import FileIdentity, HashCache, sha256_file   # the one hasher and its cache
    cache = HashCache().load()
    identity = FileIdentity.of(path)
    known = cache.get(identity)
    if known:
        return known
    digest = sha256_file(path)
    if FileIdentity.of(path) == identity:
        cache.put(identity, digest)
        cache.save()
    return digest


PEFT_WEIGHTS, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"


def peft_scale(config_path: Path) -> float:
    """lora_alpha / r (or / sqrt(r) with use_rslora) from a PEFT adapter_config.json. LoraError for
    a config h3bridge cannot apply exactly (per-module rank or alpha patterns)."""
    import math
    try:
        config = read_json_capped(config_path, PEFT_CONFIG_MAX_BYTES, not_regular, too_large)
        rank, alpha = config["r"], config.get("lora_alpha", config["r"])
        if isinstance(rank, bool) or isinstance(alpha, bool) or not isinstance(rank, int) or rank <= 0 \
                or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ValueError(f"r {rank!r}, lora_alpha {alpha!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise LoraError(f"{config_path} cannot be read as a PEFT adapter config ({error})",
                        hint="give the adapter_model.safetensors of an intact PEFT folder, with its "
                             "adapter_config.json (r, lora_alpha)") from None
    patterns = [key for key in ("rank_pattern", "alpha_pattern") if config.get(key)]
    if patterns:
        raise LoraError(f"{config_path} sets {' and '.join(patterns)} (per-module ranks or alphas), which h3bridge "
                        "does not apply", hint="merge the adapter with PEFT (merge_and_unload) or export it with one "
                                               "r and lora_alpha")
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def read_lora(path: str | Path, *, sha256: str | None = None) -> LoraFile:
    """Read a LoRA file's header (never its data) and group its tensors into modules. Raises
    LoraError for a file that is not a usable LoRA, naming examples. A PEFT folder (or its
    adapter_model.safetensors) is read with its adapter_config.json's scale."""
    path = Path(path).expanduser()
    if path.is_dir() and (path / PEFT_WEIGHTS).is_file():
        path = path / PEFT_WEIGHTS
    config = path.with_name(PEFT_CONFIG)
    scale = peft_scale(config) if path.name == PEFT_WEIGHTS and config.is_file() else None
    if not path.is_file():
        raise LoraError(f"LoRA file {path} does not exist or is not a file",
                        hint="give the path of the LoRA's .safetensors file")
    try:
        header = read_header(path, max_header_bytes=LORA_MAX_HEADER_BYTES)
    except IntegrityError as error:
        raise LoraError(f"LoRA {path} cannot be read: {error.message.removeprefix(f'{path}: ')}",
                        hint="use a BF16/F16/F32 .safetensors LoRA (quantized LoRAs cannot be folded into the "
                             "BF16 checkpoint h3 reads)") from None
    by_name = {tensor.name: tensor for tensor in header.tensors}
    modules: list[LoraModule] = []
    used: set[str] = set()
    for name, tensor in by_name.items():
        for down_suffix, up_suffix, convention in _PAIRS:
            if not name.endswith(down_suffix):
                continue
            module = name[: -len(down_suffix)]
            up = by_name.get(module + up_suffix)
            if up is None:
                continue                     # reported below as an unpaired tensor
            alpha = by_name.get(module + _ALPHA_SUFFIX)
            modules.append(LoraModule(module, convention, tensor, up, alpha))
            used.update({name, up.name} | ({alpha.name} if alpha else set()))
            break
    unsupported = tuple(sorted(set(by_name) - used))
    if not modules:
        shown = ", ".join(sorted(by_name)[:EXAMPLES]) or "no tensors at all"
        raise LoraError(f"{path} holds no LoRA pairs (lora_A/lora_B or lora_down/lora_up); its tensors are e.g. "
                        f"{shown}", hint="give a LoRA file (a full fine-tuned checkpoint is not a LoRA)")
    bad_dtypes = [t for m in modules for t in (m.down, m.up, m.alpha) if t is not None and t.dtype not in LORA_DTYPES]
    if bad_dtypes:
        examples = ", ".join(f"{t.name} ({t.dtype})" for t in bad_dtypes[:EXAMPLES])
        raise LoraError(f"LoRA {path}: {len(bad_dtypes)} tensor(s) have dtypes that cannot be folded, e.g. {examples}",
                        hint=f"use a LoRA saved as {'/'.join(sorted(LORA_DTYPES))}")
    return LoraFile(path=path, header=header, sha256=sha256 or sha256_of(path), modules=tuple(modules),
                    unsupported=unsupported, peft_scale=scale)


def _flat(name: str) -> str:
    return name.replace(".", "_")


def target_index(checkpoint_keys: Iterable[str]) -> tuple[set[str], dict[str, str]]:
    """The checkpoint's keys, and kohya's flattened module names mapped back to them."""
    keys = set(checkpoint_keys)
    flat: dict[str, str] = {}
    for key in keys:
        if key.endswith(".weight"):
            flat.setdefault(_flat(key[: -len(".weight")]), key)
    return keys, flat


def map_module(module: str, keys: set[str], flat: Mapping[str, str]) -> str | None:
    """The checkpoint key a LoRA module updates, or None."""
    candidates = [module] + [module[len(p):] for p in DOTTED_PREFIXES if module.startswith(p)]
    for candidate in candidates:
        if candidate + ".weight" in keys:
            return candidate + ".weight"
    for prefix in FLAT_PREFIXES:
        if module.startswith(prefix):
            return flat.get(module[len(prefix):])
    return flat.get(module) if "." not in module else None


def foreign_part(module: str) -> str | None:
    """What a module that matches nothing was trained for, when its prefix says (the text encoder)."""
    return next((what for prefix, what in FOREIGN_PREFIXES.items() if module.startswith(prefix)), None)


def content_digest(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


_DISTILLED_NAME = re.compile(r"(turbo|distill|lightning|lightx2v|\blcm\b|_lcm|hyper|causvid|fastvideo)", re.IGNORECASE)


def looks_distilled(path: Path, metadata: Mapping[str, str]) -> bool:
    """A step-distillation LoRA, going by its file name or metadata (larryvrh's Turbo LoRA:
    minimax_h3_turbo_v4_step600_ema.safetensors)."""
    text = " ".join([path.name, *(f"{k} {v}" for k, v in metadata.items() if len(v) < 1000)])
    return bool(_DISTILLED_NAME.search(text))
