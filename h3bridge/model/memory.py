"""Memory plan: will this request fit this Mac's unified memory, and if not, what is the cheapest change?

One-shot: h3 loads and releases its models phase by phase ("Model phases are loaded and released
separately so the 33B transformer, Qwen encoder, and decoders never have to coexist in unified
memory", upstream README "Checkpoint layout and media pipeline"), so the process peak is the
largest phase, not the sum.

Warm session (h3's interactive mode, `h3bridge generate --engine session`, ComfyUI "warm session"):
h3_cli_run turns the caches on (h3_cli.c:697). The prepared DiT is retained after denoising
(h3.c:1522-1531; not freed at h3.c:1591), the video decoder is then loaded next to it and
retained too (h3.c:1604-1616, h3_acquire_video_decoder h3.c:693-717), and a later job at the same
latent size keeps that decoder through its own prompt encoding and DiT load (h3.c:955-961; the
old DiT is freed there only because the new prompt changes its key). `plan_memory(session=True)`
adds what stays resident to each phase.

Each phase's figure is built from the component sizes in the model inventory (tensor bytes and
shapes read from the shard headers), from the request's geometry (sequence rows from
upstream's layout, reference media read with PyAV and sized with upstream's canvas functions)
and from the buffers upstream allocates; each constant names its source.

Checks against upstream's published measurements (tests/test_memory.py):
  full-residency DiT, 50 layers, 512x512x22:  35.9 GiB blocks + 0.36 GiB AdaLN + buffers ~= 36.4 GiB
      (README "Profiling": "the BF16 path's 36.4 GiB"; "about 36.5 GiB" in the SSD section)
  --ssd-streaming: 2 block slots 1.44 GiB + AdaLN + buffers ~= 2.0 GiB at 512x512, 2.1 GiB at 864x480
      (README "For a low-memory run")
  text encoder, ring of 2: 3 layers x 0.91 GiB ~= 2.7 GiB (upstream issue 17: measured ~2.7 GiB)
  video VAE decoder: 9.0 GiB of F32 weights (README / facts: "~9 GiB"); preview VAE ~10 GiB (README)
"""
from __future__ import annotations

import functools
import math
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import MediaError, MemoryPlanError, ModelError, RequestError
from .inventory import FL2VA, REF2VA, Component, ModelInventory, format_bytes
from ..request import (
    MAX_AUDIO_SAMPLES,
    MIN_LAYERS,
    GenerationRequest,
    ReferenceImageSize,
    ReferenceKind,
    SlowerPath,
)
from ..geometry import (
    CANVAS_MULTIPLE,
    FPS,
    SAMPLE_RATE,
    round_to_canvas,
    legal_frame_counts,
    reference_image_canvas,
    reference_video_canvas,
    reference_video_frames,
    video_encoder_latent_t,
    video_latent_t,
)

if TYPE_CHECKING:
    from ..media.decode import MediaInfo

GIB = 2**30

# --- upstream geometry (h3_host.c / h3_host.h / h3_dit.c at 8974cc0)
VAE_SPATIAL_RATIO = 16        # h3_host.h H3_VAE_SPATIAL_RATIO
DIT_PATCH = 2                 # video patches are 2x2 latents: rows = (H/32)*(W/32) per latent frame
AUDIO_LATENT_FPS = 40         # h3_host.h H3_AUDIO_LATENT_FPS
AUDIO_HOP = SAMPLE_RATE // AUDIO_LATENT_FPS   # h3_audio_vae.c HOP_LENGTH 800: latent length = ceil(samples/800)
AUDIO_STREAMS = 2             # h3_host.c h3_audio_grid / h3_dit.c AUDIO_STREAMS: 2 rows per audio latent step
DIT_BLOCKS = 50               # h3_dit_schedule.h H3_DIT_BLOCKS
TEXT_LAYERS_USED = 50         # h3_text_encoder.c TEXT_LAYERS
INT8_MIN_SEQUENCE = 128       # h3_dit.c load_dit: int8 QKV/attention-output need dit->sequence >= 128
DIT_VIDEO_PATCH = 96          # h3_dit.c VIDEO_PATCH: 24 latent channels x 2 x 2
DIT_AUDIO_CHANNELS = 32       # h3_dit.c AUDIO_CHANNELS
DIT_ROPE_HALF = 48            # h3_dit.c ROPE_HALF
INT8_SCALE_GROUP = 1024       # h3_dit.c allocate_activations: one F32 scale per 1,024 FFN channels
INT8_ROW_PAD = 128            # h3_dit.c allocate_activations: int8 rows padded to a multiple of 128
TEXT_ROPE_HALF = 64           # h3_text_encoder.c TEXT_ROPE_HALF (head dim 128 / 2), F32 tables
VISION_PATCH = 16             # h3_vision_encoder.c PATCH
VISION_MERGE = 2              # h3_vision_encoder.c MERGE: 2x2 patches -> one token
VISION_ROPE_HALF = 36         # h3_vision_encoder.c VISION_ROPE_HALF
VISION_DEEPSTACKS = 3         # h3_vision_encoder.h H3_VISION_DEEPSTACKS
VIDEO_FRAMES_PER_VISION_SAMPLE = 12   # h3.c h3_generate: a reference video is sampled every 12 frames ...
VISION_SAMPLES_PER_BLOCK = 2          # ... and the samples go to the vision tower in pairs
REFERENCE_IMAGE_MAX_EDGE = 2048       # h3.c h3_generate: --ref-image-size max caps the short edge at 2048
# --- published figures (upstream README, issues; /work/shared/h3-upstream-facts.md "Memory and speed")
VAE_WORKSPACE_RATIO = 1 / 9            # README: --show "adds roughly 10 GiB" = 9.0 GiB decoder + ~1 GiB tiles;
                                       # the final decode uses the same decoder and tile plan (README)
AUDIO_WORKSPACE_RATIO = 0.2            # facts: audio VAE decode ~0.3 GiB in total, weights (~0.25 GiB) included
# --- h3bridge estimates (not published upstream; deliberately generous)
PROCESS_BASE = GIB // 2                # Metal device, compiled shaders, binary, tokenizer, host state
FFMPEG_MUX = 300 * 2**20               # libx264 + AAC encoder processes while muxing
PROMPT_TEMPLATE_TOKENS = 48            # chat template around the prompt (tokens)
BYTES_PER_PROMPT_TOKEN = 3             # conservative: more tokens than the usual ~4 bytes/token
# --- safety margin for macOS and the user's apps
RESERVE_FRACTION = 0.20
RESERVE_MINIMUM = 6 * GIB


# ---------------------------------------------------------------------------------------------
# Machine


@dataclass(frozen=True)
class MachineFacts:
    """What the plan needs to know about the machine (inject one in tests)."""

    total_memory: int              # physical (unified) memory, bytes
    chip: str | None = None        # e.g. "Apple M4 Pro"; None when unknown (not a Mac)
    system: str = "Darwin"
    # H3_NAX=0 in the environment h3 inherits turns Metal TensorOps (and so the int8 DiT) off
    # (h3_gpu.m h3_gpu_create, l.363-368).
    tensor_ops_disabled: bool = False
    # Metal's recommendedMaxWorkingSetSize (libh3's h3_device): what the GPU may hold, when known
    # (the library engine asks the library); the budget never exceeds it.
    gpu_working_set: int | None = None

    @classmethod
    def detect(cls) -> "MachineFacts":
        import psutil
        system = platform.system()
        chip: str | None = None
        if system == "Darwin":
            try:
                chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                      text=True, timeout=5, check=False).stdout.strip() or None
            except (OSError, subprocess.SubprocessError):
                chip = None
        return cls(total_memory=psutil.virtual_memory().total, chip=chip, system=system,
                   tensor_ops_disabled=os.environ.get("H3_NAX") == "0")

    @classmethod
    def mac(cls, gigabytes: float, chip: str = "Apple M4 Pro") -> "MachineFacts":
        """A Mac sold as `gigabytes` GB (Apple's GB of unified memory are GiB)."""
        return cls(total_memory=int(gigabytes * GIB), chip=chip, system="Darwin")

    @property
    def is_m5(self) -> bool:
        """h3_gpu.m h3_gpu_is_m5 (l.531-535): the Metal device name contains "M5". The device name
        and the CPU brand string are both "Apple M5 ..." on Apple Silicon."""
        return "M5" in (self.chip or "")

    @property
    def int8_dit(self) -> bool:
        """h3_gpu_has_int8_mlp (h3_gpu.m l.543-546) is `tensorOpsEnabled`: an "M5" device, H3_NAX
        not "0", and a successful compile of the shaders with TensorOps (l.363-393). The compile
        is only known at run time; it fails on a Metal runtime without Metal 4 TensorOps, which M5
        Macs (shipped with macOS 26) have, so an M5 is planned with the int8 DiT and the plan notes
        what the BF16 fallback would need (see `plan_memory`)."""
        return self.is_m5 and not self.tensor_ops_disabled

    @property
    def text_ring_depth(self) -> int:
        # h3_text_encoder.c text_prefetch_depth (l.135-137): 3 on an M5 device name, else 2
        # (TensorOps not required); README "Weight residency": "two layers on M3/older hardware
        # and three on M5"
        return 3 if self.is_m5 else 2

    @property
    def reserve(self) -> int:
        """Memory left to macOS and apps: 20 % of RAM, at least 6 GiB (h3bridge policy)."""
        return max(RESERVE_MINIMUM, int(self.total_memory * RESERVE_FRACTION))

    @property
    def budget(self) -> int:
        budget = self.total_memory - self.reserve
        return budget if self.gpu_working_set is None else min(budget, self.gpu_working_set)

    def describe(self) -> str:
        return f"{self.chip or self.system}, {self.total_memory / GIB:.0f} GiB"


# ---------------------------------------------------------------------------------------------
# Component sizes


@dataclass(frozen=True)
class ModelSizes:
    """Bytes the phases load, per component, and the widths that size the activation buffers
    (from the inventory, or upstream's shapes)."""

    dit_blocks: int
    dit_qkv: int                   # per block, BF16 bytes of each matrix SSD streaming reads ...
    dit_out: int
    dit_mlp: int                   # ... (fc1 + fc2)
    dit_qkv_int8: int              # per block, the same matrices quantized by h3 (int8 + F32 row scales,
    dit_out_int8: int              # h3_dit.c quantize_block_*)
    dit_mlp_int8: int
    dit_block_norms: int           # per block: norm1/2, q/k norm (stay resident when streaming)
    dit_other: int                 # patch projections and final layer
    dit_hidden: int                # h3_dit.c HIDDEN, INNER, FFN: the activation buffers scale with them
    dit_inner: int
    dit_ffn: int
    adaln_row_bytes: int           # per timestep row, all blocks + final layer (BF16 outputs)
    text_layer: int                # one Qwen3 layer
    text_layers_used: int
    text_hidden: int               # h3_text_encoder.c TEXT_HIDDEN, TEXT_QUERY_DIM, TEXT_KV_DIM, TEXT_INTERMEDIATE
    text_query: int
    text_kv: int
    text_intermediate: int
    vision_tower: int
    vision_hidden: int             # h3_vision_encoder.c VISION_HIDDEN, VISION_INTERMEDIATE
    vision_intermediate: int
    video_decoder: int
    video_encoder: int
    audio_decoder: int
    audio_encoder: int
    source: str

    @property
    def dit_block_matrices(self) -> int:
        """Per block, the BF16 matrices (what SSD streaming reads, and the full-residency path)."""
        return self.dit_qkv + self.dit_out + self.dit_mlp

    @property
    def dit_block_int8(self) -> int:
        """Per block when h3 quantizes all four matrices."""
        return self.dit_qkv_int8 + self.dit_out_int8 + self.dit_mlp_int8

    @classmethod
    def published(cls) -> "ModelSizes":
        """From upstream's shapes (h3_dit.c / h3_dit_schedule.c / h3_text_encoder.c /
        h3_vision_encoder.c / h3_video_vae.c enums), for a plan without a model directory."""
        hidden, inner, ffn = 5376, 56 * 128, 14336                   # h3_dit.c HIDDEN, INNER, FFN

        def bf16(rows: int, columns: int) -> int:
            return rows * columns * 2

        def int8(rows: int, columns: int) -> int:
            return rows * columns + 4 * rows

        norms = (2 * hidden + 2 * 128) * 2
        te_h, te_i, te_q, te_kv = 5120, 25600, 64 * 128, 8 * 128     # h3_text_encoder.c enum
        text_layer = (te_h * te_q * 2 + te_h * te_kv * 2 + 3 * te_h * te_i + 2 * te_h + 2 * 128) * 2
        vae_h, vae_f = 2048, 8192                                     # h3_video_vae.c enum
        vae_block = (3 * vae_h * vae_h + vae_h * vae_h + 2 * vae_f * vae_h + vae_h * vae_f + 10 * vae_h) * 4
        return cls(
            dit_blocks=DIT_BLOCKS,
            dit_qkv=bf16(3 * inner, hidden), dit_out=bf16(hidden, inner),
            dit_mlp=bf16(2 * ffn, hidden) + bf16(hidden, ffn),
            dit_qkv_int8=int8(3 * inner, hidden), dit_out_int8=int8(hidden, inner),
            dit_mlp_int8=int8(2 * ffn, hidden) + int8(hidden, ffn),
            dit_block_norms=norms, dit_other=6 * 2**20,
            dit_hidden=hidden, dit_inner=inner, dit_ffn=ffn,
            adaln_row_bytes=(DIT_BLOCKS * 3 * 6 * hidden + 2 * hidden) * 2,
            text_layer=text_layer, text_layers_used=TEXT_LAYERS_USED,
            text_hidden=te_h, text_query=te_q, text_kv=te_kv, text_intermediate=te_i,
            vision_tower=int(1.2e9), vision_hidden=1152, vision_intermediate=4304,
            video_decoder=36 * vae_block + 50 * 2**20, video_encoder=int(0.6e9),
            audio_decoder=int(0.25e9), audio_encoder=int(0.05e9),
            source="upstream's published shapes (no model directory)")

    @classmethod
    def from_inventory(cls, inventory: ModelInventory, partition: str) -> "ModelSizes":
        fallback = cls.published()
        dit = inventory.component(partition, "transformer")
        text = inventory.component(partition, "text_encoder")
        video = inventory.component(partition, "video_vae")
        audio = inventory.component(partition, "audio_vae")

        def usable(component: Component | None) -> bool:
            return component is not None and bool(component.shards)

        values: dict[str, object] = {}
        if usable(dit):
            assert dit is not None
            values.update(_dit_sizes(dit))
        if usable(text):
            assert text is not None
            layers = _layer_indices(text, r"model\.language_model\.layers\.(\d+)\.")
            if layers:
                total = text.bytes_where(lambda n: n.startswith("model.language_model.layers."))
                values["text_layer"] = total // len(layers)
                values["text_layers_used"] = min(TEXT_LAYERS_USED, len(layers))
            values["vision_tower"] = text.bytes_where(lambda n: n.startswith("model.visual."))
            values.update(_widths(text, {
                "text_hidden": ("model.language_model.layers.0.input_layernorm.weight", 0, 1),
                "text_query": ("model.language_model.layers.0.self_attn.q_proj.weight", 0, 1),
                "text_kv": ("model.language_model.layers.0.self_attn.k_proj.weight", 0, 1),
                "text_intermediate": ("model.language_model.layers.0.mlp.gate_proj.weight", 0, 1),
                "vision_hidden": ("model.visual.blocks.0.norm1.weight", 0, 1),
                "vision_intermediate": ("model.visual.blocks.0.mlp.linear_fc1.weight", 0, 1)}))
        if usable(video):
            assert video is not None
            values["video_decoder"] = video.bytes_where(lambda n: n.startswith(("decoder.", "post_quant_conv.")))
            values["video_encoder"] = video.bytes_where(lambda n: n.startswith(("encoder.", "quant_conv.")))
        if usable(audio):
            assert audio is not None
            values["audio_decoder"] = audio.bytes_where(lambda n: n.startswith("decoder."))
            values["audio_encoder"] = audio.bytes_where(lambda n: n.startswith("encoder."))
        source = f"model inventory ({inventory.root / partition})"
        if not all(usable(c) for c in (dit, text, video, audio)):
            source += ", published shapes for missing components"
        return replace(fallback, **values, source=source)  # type: ignore[arg-type]


def _layer_indices(component: Component, pattern: str) -> set[int]:
    expression = re.compile(pattern)
    return {int(m.group(1)) for name in component.tensor_names() if (m := expression.match(name))}


def _widths(component: Component, wanted: dict[str, tuple[str, int, int]]) -> dict[str, int]:
    """{field: shape[axis] // divisor of the named tensor}, for the tensors the component has."""
    shapes = {tensor.name: tensor.shape for shard in component.shards for tensor in shard.tensors}
    found: dict[str, int] = {}
    for name, (tensor, axis, divisor) in wanted.items():
        shape = shapes.get(tensor)
        if shape and len(shape) > axis:
            found[name] = shape[axis] // divisor
    return found


_STREAMED = {"attn.qkv_proj.weight": "dit_qkv", "attn.out_proj.weight": "dit_out",      # h3_dit.c
             "mlp.fc1.weight": "dit_mlp", "mlp.fc2.weight": "dit_mlp"}


def _dit_sizes(dit: Component) -> dict[str, int]:
    blocks = _layer_indices(dit, r"blocks\.(\d+)\.")
    count = max(len(blocks), 1)
    totals = {name: 0 for name in ("dit_qkv", "dit_out", "dit_mlp", "dit_qkv_int8", "dit_out_int8",
                                   "dit_mlp_int8", "dit_block_norms")}
    adaln_rows = other = 0
    for shard in dit.shards:
        for tensor in shard.tensors:
            name = tensor.name
            if name.startswith("blocks."):
                suffix = name.split(".", 2)[2]
                if suffix in _STREAMED:
                    kind = _STREAMED[suffix]
                    totals[kind] += tensor.nbytes
                    # quantize_block_*: int8 values + one F32 scale per output row
                    totals[kind + "_int8"] += tensor.elements + 4 * (tensor.shape[0] if tensor.shape else 1)
                elif suffix.startswith("adaln_proj.linear.bias"):
                    adaln_rows += tensor.nbytes          # one BF16 output row per timestep row
                elif not suffix.startswith("adaln_proj."):
                    totals["dit_block_norms"] += tensor.nbytes
            elif name == "final_layer.adaln_proj.linear.bias":
                adaln_rows += tensor.nbytes
            elif name.startswith(("video_patch_proj.", "audio_patch_proj.", "final_layer.")) and "adaln" not in name:
                other += tensor.nbytes
    values = {name: total // count for name, total in totals.items()}
    values.update({"dit_blocks": len(blocks) or DIT_BLOCKS, "dit_other": other, "adaln_row_bytes": adaln_rows})
    values.update(_widths(dit, {"dit_hidden": ("blocks.0.norm1.weight", 0, 1),
                                "dit_inner": ("blocks.0.attn.qkv_proj.weight", 0, 3),
                                "dit_ffn": ("blocks.0.mlp.fc2.weight", 1, 1)}))
    return values


# ---------------------------------------------------------------------------------------------
# Upstream's canvas arithmetic (h3_host.c), for reference and anchor media


@functools.lru_cache(maxsize=64)
def _probe_file(path: str, modified_ns: int, size: int) -> "MediaInfo | None":
    from ..media.decode import probe_media  # PyAV is only needed when there are media files
    try:
        return probe_media(Path(path))
    except (MediaError, OSError):
        return None


def probe_reference(path: Path | None) -> "MediaInfo | None":
    """The file's size and length as request validation reads them (media.probe_media, PyAV),
    cached by path, size and modification time (the suggestion search re-plans many times);
    None when the file is missing or unreadable (the plan then assumes upstream's largest)."""
    if path is None:
        return None
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return _probe_file(os.fspath(path), stat.st_mtime_ns, stat.st_size)


# ---------------------------------------------------------------------------------------------
# Request geometry


def _tokens(text: str) -> int:
    """Token estimate for text h3 tokenizes (conservative: 3 bytes a token)."""
    return math.ceil(len(text.encode()) / BYTES_PER_PROMPT_TOKEN)


@dataclass(frozen=True)
class VisualInput:
    """One anchor or visual reference as h3 reads it (h3.c h3_generate): decoded at `width` x
    `height` for `frames` frames, VAE-encoded into DiT condition rows and shown to the Qwen vision
    tower (one call per image, one per pair of sampled frames of a video)."""

    what: str
    width: int
    height: int
    frames: int
    vision_calls: int
    assumed: bool = False          # the file could not be read: upstream's largest size assumed

    @property
    def condition_rows(self) -> int:
        """h3.c h3_generate (l.1262-1275): latent_t x (H/16) x (W/16) / 4 rows of 96 values."""
        latent_w, latent_h = self.width // VAE_SPATIAL_RATIO, self.height // VAE_SPATIAL_RATIO
        return video_encoder_latent_t(self.frames) * latent_h * latent_w // (DIT_PATCH * DIT_PATCH)

    @property
    def vision_tokens_per_call(self) -> int:
        """h3_vision_encoder.c h3_vision_encode_bf16: (H/16)(W/16) patches merged 2x2 into tokens."""
        patches = (self.height // VISION_PATCH) * (self.width // VISION_PATCH)
        return patches // (VISION_MERGE * VISION_MERGE)

    @property
    def vision_tokens(self) -> int:
        return self.vision_calls * self.vision_tokens_per_call

    @property
    def pixel_bytes(self) -> int:
        """h3_ffmpeg_read_*_f32: channel-major F32 pixels, held until the vision tower has run."""
        return self.frames * 3 * self.width * self.height * 4


@dataclass(frozen=True)
class Geometry:
    """Sequence rows of one DiT forward (h3_host.c layout) and the decoded frame sizes."""

    render_width: int
    render_height: int
    frames: int
    video_t: int
    text_rows: int                 # tokens the Qwen encoder runs over = DiT text rows (h3.c:1449)
    audio_rows: int
    video_rows: int
    condition_rows: int            # visual + audio condition rows
    time_rows: int
    condition_audio_rows: int = 0
    vision_tokens: int = 0         # picture tokens among the text rows
    visual_inputs: tuple[VisualInput, ...] = ()

    @property
    def sequence(self) -> int:
        return self.text_rows + self.audio_rows + self.video_rows + self.condition_rows

    @property
    def condition_video_rows(self) -> int:
        return self.condition_rows - self.condition_audio_rows

    @property
    def assumed_inputs(self) -> tuple[VisualInput, ...]:
        return tuple(v for v in self.visual_inputs if v.assumed)


def _vision_calls_for_video(frames: int) -> int:
    """h3.c h3_generate (l.1076-1077): one sample every 12 frames, two samples per vision call."""
    samples = math.ceil(frames / VIDEO_FRAMES_PER_VISION_SAMPLE)
    return math.ceil(samples / VISION_SAMPLES_PER_BLOCK)


def _video_timestamps(frames: int) -> list[str]:
    """h3.c h3_generate (l.1089-1093) + h3_multimodal.c: "<%.1f seconds>" before each vision pair."""
    samples = math.ceil(frames / VIDEO_FRAMES_PER_VISION_SAMPLE)
    stamps = []
    for block in range(_vision_calls_for_video(frames)):
        first = 2 * block
        second = first + 1 if first + 1 < samples else first
        stamps.append(f"<{(first + second) / 4.0:.1f} seconds>")
    return stamps


def _reference_visual(request: GenerationRequest, index: int, render: tuple[int, int]) -> VisualInput:
    reference = request.references[index]
    info = probe_reference(reference.path)
    known = info is not None and info.width and info.height
    what = f"reference {index + 1} ({reference.kind.value})"
    if reference.kind is ReferenceKind.IMAGE:
        cap = REFERENCE_IMAGE_MAX_EDGE if request.reference_image_size is ReferenceImageSize.MAX else 0
        if known:
            assert info is not None and info.width and info.height
            width, height = reference_image_canvas(info.width, info.height, *render, cap)
        elif cap:
            # unknown size: a 2048-pixel short edge at the render canvas's aspect
            scale = cap / min(render)
            width, height = round_to_canvas(render[0] * scale), round_to_canvas(render[1] * scale)
        else:
            width, height = render       # "match": never more than the render canvas's area
        return VisualInput(what, width, height, 1, 1, assumed=not known)
    if known:
        assert info is not None and info.width and info.height
        width, height = reference_video_canvas(info.width, info.height)
        frames = reference_video_frames(info.frames_at_24fps or request.frame_count, request.frame_count)
    else:
        width, height = 1344, 768        # h3_adapt_canvas's largest (H3_MAX_PIXELS), the whole clip
        frames = reference_video_frames(request.frame_count, request.frame_count)
    return VisualInput(what, width, height, frames, _vision_calls_for_video(frames), assumed=not known)


def _reference_audio_samples(request: GenerationRequest, visuals: dict[int, VisualInput]) -> list[int]:
    """Samples each reference soundtrack contributes (h3.c h3_generate l.1117-1160): a video's
    soundtrack is cut to its decoded frames, reference audio to 15 s; 15 s in total."""
    samples = []
    for index, reference in enumerate(request.references):
        if reference.kind in (ReferenceKind.IMAGE, ReferenceKind.SILENT_VIDEO):
            continue
        cap = MAX_AUDIO_SAMPLES
        if index in visuals:
            cap = min(cap, round(visuals[index].frames * SAMPLE_RATE / FPS))
        path = reference.audio_path if reference.kind is ReferenceKind.VIDEO_AUDIO else reference.path
        info = probe_reference(path)
        known = info is not None and info.audio_samples is not None
        samples.append(min(cap, info.audio_samples) if known and info is not None and info.audio_samples is not None
                       else cap)
    return samples


def geometry(request: GenerationRequest) -> Geometry:
    """Rows of h3's packed DiT sequence for `request` (h3.c h3_generate, h3_host.c layout).

    Anchors and references add rows twice: VAE-encoded condition rows, and picture tokens that the
    Qwen vision tower splices into the text (which becomes the DiT's text rows). Reference media
    are read with PyAV for their size and length; unreadable files are taken at upstream's
    largest (noted in the plan)."""
    width = request.render_width or request.width
    height = request.render_height or request.height
    frames = request.frame_count
    video_t = video_latent_t(frames)
    frame_rows = (height // (VAE_SPATIAL_RATIO * DIT_PATCH)) * (width // (VAE_SPATIAL_RATIO * DIT_PATCH))
    audio_t = int(frames * AUDIO_LATENT_FPS / FPS + 0.5)        # h3_host.c h3_temporal: llround
    text = PROMPT_TEMPLATE_TOKENS + _tokens(request.prompt)
    visuals: list[VisualInput] = []
    by_reference: dict[int, VisualInput] = {}
    if request.is_ref2va:
        # h3_multimodal.c h3_multimodal_encode_ref2va_bf16: "<Audio n>: " for a reference with
        # sound, "<Picture n>: " + picture tokens for an image, "<Video n>: " then per vision pair
        # "<t seconds>" + picture tokens for a video; each picture span adds start/end tokens.
        ordinals = {"image": 0, "video": 0, "audio": 0}
        for index, reference in enumerate(request.references):
            if reference.kind not in (ReferenceKind.IMAGE, ReferenceKind.SILENT_VIDEO):
                ordinals["audio"] += 1
                text += _tokens(f"<Audio {ordinals['audio']}>: ")
            if reference.kind is ReferenceKind.AUDIO:
                continue
            visual = _reference_visual(request, index, (width, height))
            visuals.append(visual)
            by_reference[index] = visual
            if reference.kind is ReferenceKind.IMAGE:
                ordinals["image"] += 1
                text += _tokens(f"<Picture {ordinals['image']}>: ") + 2
            else:
                ordinals["video"] += 1
                text += _tokens(f"<Video {ordinals['video']}>: ")
                text += sum(_tokens(stamp) + 2 for stamp in _video_timestamps(visual.frames))
    else:
        # h3.c h3_generate (l.1194-1222): anchors are read at the render canvas; h3_multimodal.c
        # h3_multimodal_encode_fl2va_bf16 presents each as "<Picture n>: " + picture tokens.
        for number, anchor in enumerate(a for a in (request.first_frame, request.last_frame) if a is not None):
            visuals.append(VisualInput("first/last frame", width, height, 1, 1))
            text += _tokens(f"<Picture {number + 1}>: ") + 2
    vision_tokens = sum(v.vision_tokens for v in visuals)
    condition_video = sum(v.condition_rows for v in visuals)
    audio_samples = _reference_audio_samples(request, by_reference) if request.is_ref2va else []
    # h3_audio_vae.c: latent length ceil(samples / 800), two streams; h3 refuses over 15 s in total
    condition_audio = sum(AUDIO_STREAMS * math.ceil(n / AUDIO_HOP) for n in audio_samples)
    condition_audio = min(condition_audio, AUDIO_STREAMS * math.ceil(MAX_AUDIO_SAMPLES / AUDIO_HOP))
    # h3_dit_schedule.c (l.100-118): a video and an audio timestep row per step, shared where the two
    # sigmas are equal (only the first step, where both shifted schedules start at 1:
    # h3_host.c h3_serving_schedule_build), + one row per condition kind (visual, audio)
    time_rows = 2 * request.steps - 1 + int(condition_video > 0) + int(condition_audio > 0)
    return Geometry(render_width=width, render_height=height, frames=frames, video_t=video_t,
                    text_rows=text + vision_tokens, audio_rows=AUDIO_STREAMS * audio_t,
                    video_rows=video_t * frame_rows, condition_rows=condition_video + condition_audio,
                    time_rows=time_rows, condition_audio_rows=condition_audio, vision_tokens=vision_tokens,
                    visual_inputs=tuple(visuals))


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class PhaseMemory:
    name: str
    parts: tuple[tuple[str, int], ...]     # (what, bytes), summed

    @property
    def total(self) -> int:
        return sum(size for _, size in self.parts)


@dataclass(frozen=True)
class Suggestion:
    changes: tuple[str, ...]               # human-readable, in the order applied
    flags: tuple[str, ...]                 # the CLI flags that make the change
    request: GenerationRequest
    preview: bool
    peak: int


@dataclass
class MemoryPlan:
    request: GenerationRequest
    machine: MachineFacts
    preview: bool
    sizes: ModelSizes
    phases: tuple[PhaseMemory, ...]
    suggestion: Suggestion | None = None
    dit_path: str = "BF16"                 # "BF16", "int8", "int8 MLP", ..., "SSD streaming"
    notes: list[str] = field(default_factory=list)
    session: bool = False                  # planned for a warm session (h3's interactive mode)
    # What the model check found that does not stop this job but its user should see (e.g. an
    # incomplete Ref2VA/ a job without references does not read); filled by `preflight`.
    model_warnings: list[str] = field(default_factory=list)
    # The request's shape as upstream computes it (reference inputs probed): read once per plan.
    geometry: Geometry | None = field(default=None, repr=False, compare=False)

    @property
    def peak_phase(self) -> PhaseMemory:
        return max(self.phases, key=lambda phase: phase.total)

    @property
    def peak(self) -> int:
        return self.peak_phase.total

    @property
    def budget(self) -> int:
        return self.machine.budget

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    @property
    def needs_ssd_streaming(self) -> bool:
        """Does not fit as asked, and the suggested fix turns SSD streaming on."""
        return (not self.fits and not self.request.ssd_streaming and self.suggestion is not None
                and self.suggestion.request.ssd_streaming)

    def phase(self, name: str) -> PhaseMemory:
        return next(p for p in self.phases if p.name == name)

    def verdict(self) -> str:
        head = (f"peak {format_bytes(self.peak)} ({self.peak_phase.name}) of {format_bytes(self.budget)} usable "
                f"({self.machine.describe()} minus {format_bytes(self.machine.reserve)} for macOS and apps)")
        if self.fits:
            return f"fits: {head}"
        if self.suggestion is None:
            return f"does not fit: {head}; no smaller setting fits this machine"
        return (f"does not fit: {head}; fits with {' + '.join(self.suggestion.changes)} "
                f"(peak {format_bytes(self.suggestion.peak)}): {' '.join(self.suggestion.flags)}")

    def verdict_without_flags(self) -> str:
        """The verdict without its closing CLI flags, for a refusal another interface words itself."""
        text = self.verdict()
        flags = ": " + " ".join(self.suggestion.flags) if self.suggestion else ""
        return text[:-len(flags)] if flags and text.endswith(flags) else text

    def suggested_changes(self) -> dict[str, object]:
        """The suggestion as the request fields it changes (name -> new value, in the fix's order),
        with "preview": False when the live preview has to go; empty without a suggestion. Each
        interface words these in its own names (CLI flags are `suggestion.flags`)."""
        if self.suggestion is None:
            return {}
        wanted, given = self.suggestion.request, self.request
        changes: dict[str, object] = {}
        if self.preview and not self.suggestion.preview:
            changes["preview"] = False
        for name in ("ssd_streaming", "int8_row_fc2", "layers", "render_width", "render_height"):
            if getattr(wanted, name) != getattr(given, name):
                changes[name] = getattr(wanted, name)
        if wanted.frame_count != given.frame_count:
            changes["frames"] = wanted.frame_count
        return changes

    def render(self, *, verdict: bool = True) -> str:
        """The plan as a table (CLI `h3bridge plan`, ComfyUI Memory Plan node), ending with its
        verdict unless `verdict` is False (a refusal, whose message is the verdict)."""
        g = self.geometry or geometry(self.request)
        lines = [f"request: {self.request.width}x{self.request.height}"
                 + (f" (render {g.render_width}x{g.render_height})" if self.request.render_width else "")
                 + f", {g.frames} frames, {self.request.layers} layers, DiT {self.dit_path}"
                 + (", preview" if self.preview else "") + (", warm session" if self.session else "")
                 + f"; sequence {g.sequence} rows"
                 + (f" ({g.text_rows} text incl. {g.vision_tokens} picture tokens, {g.condition_rows} condition)"
                    if g.vision_tokens else ""),
                 f"sizes from: {self.sizes.source}",
                 f"{'phase':<22} {'peak':>10}  made of"]
        for phase in self.phases:
            parts = ", ".join(f"{what} {format_bytes(size)}" for what, size in phase.parts if size)
            marker = " <- peak" if phase is self.peak_phase else ""
            lines.append(f"{phase.name:<22} {format_bytes(phase.total):>10}  {parts}{marker}")
        lines.extend(f"note: {note}" for note in self.notes)
        if verdict:
            lines.append(self.verdict())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "fits": self.fits, "peak_bytes": self.peak, "peak_phase": self.peak_phase.name,
            "budget_bytes": self.budget, "reserve_bytes": self.machine.reserve,
            "machine": {"total_memory": self.machine.total_memory, "chip": self.machine.chip},
            "dit_path": self.dit_path, "preview": self.preview, "session": self.session,
            "sizes_source": self.sizes.source,
            "phases": [{"name": p.name, "bytes": p.total, "parts": dict(p.parts)} for p in self.phases],
            "suggestion": None if self.suggestion is None else {
                "changes": list(self.suggestion.changes), "flags": list(self.suggestion.flags),
                "peak_bytes": self.suggestion.peak},
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------------
# Per-row buffers (what upstream allocates for a sequence of N rows)


@dataclass(frozen=True)
class DitPath:
    """Which DiT kernels h3 will use (h3_dit.c load_dit l.1632-1641)."""

    ssd_streaming: bool
    int8_mlp: bool
    int8_qkv: bool
    int8_attention_output: bool

    @property
    def any_int8(self) -> bool:
        return self.int8_mlp or self.int8_qkv or self.int8_attention_output

    @property
    def name(self) -> str:
        if self.ssd_streaming:
            return "SSD streaming"
        quantized = [name for name, on in (("MLP", self.int8_mlp), ("QKV", self.int8_qkv),
                                           ("attention output", self.int8_attention_output)) if on]
        if not quantized:
            return "BF16"
        return "int8" if len(quantized) == 3 else "int8 " + " + ".join(quantized)


def dit_path_for(request: GenerationRequest, machine: MachineFacts, sequence: int) -> DitPath:
    """h3_dit.c load_dit (l.1633-1641): int8 needs TensorOps (h3_gpu_has_int8_mlp) and no SSD
    streaming; QKV and attention output also need a sequence of >= 128 rows; each has its
    --use-slower-bf16-* opt-out. (The fused MLP, H3_DISABLE_FUSED_MLP unset, is assumed.)"""
    slower = request.slower_paths
    capable = machine.int8_dit and not request.ssd_streaming
    long_enough = sequence >= INT8_MIN_SEQUENCE
    return DitPath(ssd_streaming=request.ssd_streaming,
                   int8_mlp=capable and SlowerPath.BF16_MLP not in slower,
                   int8_qkv=capable and long_enough and SlowerPath.BF16_QKV not in slower,
                   int8_attention_output=capable and long_enough and SlowerPath.BF16_ATTENTION_OUTPUT not in slower)


def _dit_row_buffers(sizes: ModelSizes, path: DitPath, core_reuse: int) -> list[tuple[str, int, bool]]:
    """(what, bytes per sequence row, padded to 128 rows) of h3_dit.c allocate_activations:
      hidden, mod_attention, attention_output: HIDDEN BF16 each; qkv: 3 x INNER and query, key,
      value: INNER BF16 each (l.1369-1381); attention_heads and mod_mlp alias qkv (l.1418-1421)
      -> 118,272 B at the released widths;
      int8 MLP: `activated`, FFN BF16 (l.1481-1482); any int8 kernel: int8 activations FFN x 1 B
      + one F32 scale per 1,024 FFN channels, rows padded to 128 (l.1490-1495) -> +43,064 B on
      M5 by default;
      core reuse > 1: core_input + core_residual, HIDDEN BF16 each (l.1534-1538) -> +21,504 B."""
    h, inner, ffn = sizes.dit_hidden, sizes.dit_inner, sizes.dit_ffn
    buffers = [("activation arena", (3 * h + 6 * inner) * 2, False)]
    if path.int8_mlp:
        buffers.append(("int8 MLP activations", ffn * 2, False))
    if path.any_int8:
        buffers.append(("int8 activation arena", ffn + ffn // INT8_SCALE_GROUP * 4, True))
    if core_reuse > 1:
        buffers.append(("core-reuse residual cache", 2 * h * 2, False))
    return buffers


def dit_bytes_per_row(sizes: ModelSizes, path: DitPath, core_reuse: int = 1) -> int:
    """DiT activation bytes per sequence row for this kernel path (before the int8 padding)."""
    return sum(per_row for _, per_row, _ in _dit_row_buffers(sizes, path, core_reuse))


def _token_reduction_rows(g: Geometry) -> int:
    """h3_dit.c configure_token_reduction: the reduced sequence keeps every row before the target
    video and pools the target video's width in pairs."""
    latent_h = g.render_height // VAE_SPATIAL_RATIO // DIT_PATCH
    latent_w = g.render_width // VAE_SPATIAL_RATIO // DIT_PATCH
    return g.sequence - g.video_rows + g.video_t * latent_h * ((latent_w + 1) // 2)


def _dit_run_buffers(request: GenerationRequest, sizes: ModelSizes, g: Geometry,
                     path: DitPath) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The DiT's per-row buffers for this request (h3_dit.c), by what they are: (made before the
    blocks load: refine_text, prepare_rope, prepare_maps; made after: allocate_activations and the
    denoiser's latents)."""
    h, steps = sizes.dit_hidden, request.steps
    sequence = g.sequence
    video_total = g.video_rows + g.condition_video_rows
    audio_total = g.audio_rows + g.condition_audio_rows
    padded = -(-sequence // INT8_ROW_PAD) * INT8_ROW_PAD
    parts = [(f"{what} ({sequence} rows)" if what == "activation arena" else what,
              (padded if pad else sequence) * per_row)
             for what, per_row, pad in _dit_row_buffers(sizes, path, request.core_reuse)]
    reduced = 0
    if request.token_reduction:
        reduced = _token_reduction_rows(g)
        # allocate_activations (l.1507-1524): the full residual rides in qkv's unused tail when it fits
        fits_in_qkv = reduced * sizes.dit_inner * 3 + sequence * h <= sequence * sizes.dit_inner * 3
        parts.append(("token-reduction residual", 0 if fits_in_qkv else sequence * h * 2))
    # prepare_rope: BF16 cos/sin tables (and reduced ones); prepare_maps: a u32 row map per step for the
    # sequence (and the reduced one) and the target rows; prepare_projection_maps: u32 per latent row
    tables = ((sequence + reduced) * (2 * DIT_ROPE_HALF * 2 + 4 * steps)
              + (g.video_rows + g.audio_rows) * 4 * steps + (video_total + audio_total) * 4)
    before = [("RoPE tables and row maps", tables),
              # refine_text (l.827): the refined text rows stay for the run
              (f"refined text ({g.text_rows} rows)", g.text_rows * h * 2)]
    # allocate_activations: F32 latent inputs (condition + target); per target row an F32 inverse and a
    # BF16 output; h3.c h3_generate + h3_dit_denoise_euler_preview: two host F32 copies of the noise
    latents = (video_total * DIT_VIDEO_PATCH * 4 + audio_total * DIT_AUDIO_CHANNELS * 4
               + g.video_rows * (4 + DIT_VIDEO_PATCH * 2 + 2 * DIT_VIDEO_PATCH * 4)
               + g.audio_rows * (4 + DIT_AUDIO_CHANNELS * 2 + 2 * DIT_AUDIO_CHANNELS * 4))
    if request.reuse > 1:
        # ensure_previous_velocities (l.2596-2604): BF16 velocity cache for whole-velocity reuse
        latents += g.video_rows * DIT_VIDEO_PATCH * 2 + g.audio_rows * DIT_AUDIO_CHANNELS * 2
    parts.append(("latents, outputs and noise", latents))
    return before, parts


def text_token_bytes(sizes: ModelSizes, *, pictures: bool) -> int:
    """Qwen text encoder buffers per token (h3_text_encoder.c text_encode_bf16_impl): u32 id and
    F32 RoPE tables (l.533-566); hidden, norm, attention_output, mlp_output (TEXT_HIDDEN), query,
    attention_heads (QUERY_DIM), key, value (KV_DIM), gate, up (INTERMEDIATE), all BF16
    (l.577-586); with pictures three deepstack residuals (l.588-603); the output read back (l.724)."""
    bf16 = 4 * sizes.text_hidden + 2 * sizes.text_query + 2 * sizes.text_kv + 2 * sizes.text_intermediate
    if pictures:
        bf16 += VISION_DEEPSTACKS * sizes.text_hidden
    return 4 + 2 * TEXT_ROPE_HALF * 4 + bf16 * 2 + sizes.text_hidden * 2


def vision_output_bytes(sizes: ModelSizes) -> int:
    """Per picture token, the merged embedding + 3 deepstack rows (BF16, TEXT_HIDDEN wide) each
    vision call returns (h3_vision_encoder.c l.595-603), kept until the text encoder runs."""
    return (1 + VISION_DEEPSTACKS) * sizes.text_hidden * 2


def vision_patch_bytes(sizes: ModelSizes) -> int:
    """Qwen vision tower buffers per patch row (h3_vision_encoder.c h3_vision_encode_bf16): hidden,
    norm, qkv (3x), query, key, value, heads, branch (VISION_HIDDEN), fc1, activated
    (VISION_INTERMEDIATE), BF16 (l.509, 539-548), and BF16 RoPE tables (l.490-493)."""
    return (10 * sizes.vision_hidden + 2 * sizes.vision_intermediate) * 2 + 2 * VISION_ROPE_HALF * 2


# ---------------------------------------------------------------------------------------------
# Phases


def _dit_weights(request: GenerationRequest, sizes: ModelSizes,
                 path: DitPath) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(resident DiT weights, transient load buffers)."""
    layers = min(request.layers, sizes.dit_blocks)
    if path.ssd_streaming:
        # README: "keeps two DiT blocks in memory"; h3_dit.c load_core: norms stay resident, two
        # BF16 matrix slots (allocate_stream_slot) alternate.
        return [("2 streamed block slots", 2 * sizes.dit_block_matrices),
                (f"{layers} blocks' norms", layers * sizes.dit_block_norms)], []
    per_block = (sizes.dit_block_norms
                 + (sizes.dit_qkv_int8 if path.int8_qkv else sizes.dit_qkv)
                 + (sizes.dit_out_int8 if path.int8_attention_output else sizes.dit_out)
                 + (sizes.dit_mlp_int8 if path.int8_mlp else sizes.dit_mlp))
    resident = [(f"{layers} {path.name} blocks", layers * per_block)]
    # quantize_block_*: each block's BF16 copy lives until its quantization is submitted
    transient = [("one BF16 block while quantizing", sizes.dit_block_matrices)] if path.any_int8 else []
    return resident, transient


def _build_phases(request: GenerationRequest, preview: bool, sizes: ModelSizes,
                  machine: MachineFacts, session: bool = False,
                  g: Geometry | None = None) -> tuple[str, tuple[PhaseMemory, ...]]:
    g = g or geometry(request)
    base = ("process", PROCESS_BASE)
    pixels_out = request.width * request.height * 3
    pixels_render = g.render_width * g.render_height * 3
    path = dit_path_for(request, machine, g.sequence)
    vae_workspace = int(sizes.video_decoder * VAE_WORKSPACE_RATIO)
    decoder = sizes.video_decoder + vae_workspace
    # h3.c h3_generate: F32 condition rows, held from the reference encoding until the DiT has loaded
    condition_rows = g.condition_video_rows * DIT_VIDEO_PATCH * 4 + g.condition_audio_rows * DIT_AUDIO_CHANNELS * 4
    # h3.c h3_conditioning_cache_store (l.219-260): a session keeps the BF16 text embedding and the
    # condition rows of the last prompt
    conditioning = g.text_rows * sizes.text_hidden * 2 + condition_rows
    dit_weights, dit_transient = _dit_weights(request, sizes, path)
    before_load, after_load = _dit_run_buffers(request, sizes, g, path)
    dit_run = [
        ("patch/final layers", sizes.dit_other),
        # h3_dit_schedule.c: BLOCK_OUTPUT BF16 values per timestep row for every block, kept for the run
        (f"AdaLN schedule ({g.time_rows} timestep rows)", g.time_rows * sizes.adaln_row_bytes),
        *before_load, *after_load,
    ]
    # load_dit (l.1660-1665): load_core quantizes (its BF16 copies are gone) before
    # allocate_activations, so the transient only counts where it exceeds what comes after it
    excess = sum(size for _, size in dit_transient) - sum(size for _, size in after_load)
    dit_transient = [(f"{what}, beyond the activations", excess) for what, _ in dit_transient[:1]
                     if excess > 0]
    # Session: what the cache holds besides the phase's own work (see the module docstring)
    kept_decoder = [("retained video VAE decoder", decoder)] if session else []
    kept_dit = [("retained DiT", sum(size for _, size in dit_weights + dit_run))] if session else []
    kept_conditioning = [("conditioning cache", conditioning)] if session else []
    # the --show decoder stays loaded from the DiT phase to the end (freed at cleanup, h3.c:1718;
    # in a session it is the retained decoder)
    preview_decoder = [("preview VAE (--show)", decoder)] if preview and not session else []
    phases: list[PhaseMemory] = []

    # README "Weight residency": streamed Qwen encoder, current layer + a ring of future layers,
    # over the prompt tokens and the picture tokens of every anchor and reference.
    depth = machine.text_ring_depth
    pictures = g.vision_tokens > 0
    phases.append(PhaseMemory("prompt encoding", (
        base, (f"{depth + 1} text-encoder layers (ring of {depth})", (depth + 1) * sizes.text_layer),
        (f"text-encoder activations ({g.text_rows} tokens)", g.text_rows * text_token_bytes(sizes, pictures=pictures)),
        ("picture embeddings", g.vision_tokens * vision_output_bytes(sizes)),
        ("condition rows", condition_rows), *kept_decoder, *kept_conditioning)))
    if g.visual_inputs or g.condition_audio_rows:
        # h3.c h3_generate: every visual input is decoded to F32 up front, VAE-encoded, then shown to
        # the Qwen3-VL vision tower (whose outputs wait for the text encoder); audio through the
        # audio VAE encoder. The tower is counted whole although it streams its blocks.
        largest_patches = max((v.vision_tokens_per_call * VISION_MERGE * VISION_MERGE for v in g.visual_inputs),
                              default=0)
        phases.append(PhaseMemory("reference encoding", (
            base, ("vision tower", sizes.vision_tower if g.visual_inputs else 0),
            ("video VAE encoder", sizes.video_encoder if g.visual_inputs else 0),
            ("audio VAE encoder", sizes.audio_encoder if g.condition_audio_rows else 0),
            ("decoded inputs (F32)", sum(v.pixel_bytes for v in g.visual_inputs)),
            ("vision activations", largest_patches * vision_patch_bytes(sizes)),
            ("picture embeddings", g.vision_tokens * vision_output_bytes(sizes)),
            ("condition rows", condition_rows), *kept_decoder, *kept_conditioning)))
    # h3.c:1533-1537: the text embedding and condition rows are freed once the DiT has loaded
    inputs = ("text embedding + condition rows until loaded", g.text_rows * sizes.text_hidden * 2 + condition_rows)
    denoise = [base, *dit_weights, *dit_transient, *dit_run, inputs, *preview_decoder, *kept_decoder,
               *kept_conditioning]
    if preview and session:
        denoise = [part if part[0] != "retained video VAE decoder" else ("preview VAE (--show, retained)", decoder)
                   for part in denoise]
    phases.append(PhaseMemory("DiT load + denoise", tuple(denoise)))
    latents = g.video_t * (g.render_height // VAE_SPATIAL_RATIO) * (g.render_width // VAE_SPATIAL_RATIO) * 24 * 4
    samples = math.ceil(g.frames / FPS * SAMPLE_RATE)
    waveform = samples * 2 * 4
    # (a session's decoder from the previous clip at this latent size is still loaded here: only a
    # different size frees it, h3.c:955-961)
    phases.append(PhaseMemory("audio decode", (
        base, ("audio VAE decoder", sizes.audio_decoder),
        ("workspace", int(sizes.audio_decoder * AUDIO_WORKSPACE_RATIO)),
        ("latents", latents), ("waveform", waveform), *preview_decoder, *kept_dit, *kept_decoder,
        *kept_conditioning)))
    phases.append(PhaseMemory("video decode", (
        base, ("video VAE decoder", sizes.video_decoder), ("tile workspace", vae_workspace),
        ("latents", latents), ("decoded frames (F32)", g.frames * pixels_render * 4),
        ("output frames (RGB8)", g.frames * pixels_out), ("waveform", waveform), *kept_dit, *kept_conditioning)))
    phases.append(PhaseMemory("mux (FFmpeg)", (
        base, ("output frames (RGB8)", g.frames * pixels_out), ("waveform", waveform), ("ffmpeg", FFMPEG_MUX),
        *preview_decoder, *kept_dit, *kept_decoder, *kept_conditioning)))
    return path.name, tuple(phases)


def _render_canvas_options(request: GenerationRequest) -> list[tuple[int, int]]:
    """Same-aspect multiples of 32 no larger than the output (h3.c h3_valid_params), smaller than now,
    largest first."""
    width, height = request.width, request.height
    current = (request.render_width or width) * (request.render_height or height)
    options = [(w, w * height // width) for w in range(CANVAS_MULTIPLE, width + 1, CANVAS_MULTIPLE)
               if (w * height) % width == 0 and (w * height // width) % CANVAS_MULTIPLE == 0]
    return sorted([o for o in options if o[0] * o[1] < current], key=lambda o: -o[0] * o[1])


@dataclass(frozen=True)
class Option:
    """One step of one knob: a field change (and whether the preview stays on)."""

    change: str
    flag: str
    updates: tuple[tuple[str, object], ...] = ()
    preview_off: bool = False


def _stages(request: GenerationRequest, preview: bool) -> list[list[Option]]:
    """Each knob's options, mildest first, cheapest knob first: a display-only loss (preview),
    then speed (SSD streaming), then quality (layers, render canvas), then length (frames)."""
    stages: list[list[Option]] = []
    if preview:
        stages.append([Option("no live preview", "(omit --show)", preview_off=True)])
    if not request.ssd_streaming:
        # h3.c h3_valid_params: SSD streaming excludes --use-int8-row-fc2
        flag = "--ssd-streaming" + (" (without --int8-row-fc2)" if request.int8_row_fc2 else "")
        stages.append([Option("SSD streaming", flag, (("ssd_streaming", True), ("int8_row_fc2", False)))])
    stages.append([Option(f"{n} layers", f"--layers {n}", (("layers", n),))
                   for n in range(request.layers - 1, MIN_LAYERS - 1, -1)])
    stages.append([Option(f"render canvas {w}x{h}", f"--render-width {w} --render-height {h}",
                          (("render_width", w), ("render_height", h)))
                   for w, h in _render_canvas_options(request)])
    stages.append([Option(f"{n} frames", f"--frames {n}", (("frames", n), ("seconds", None)))
                   for n in sorted(legal_frame_counts(), reverse=True) if n < request.frame_count])
    return [stage for stage in stages if stage]


def _suggest(request: GenerationRequest, preview: bool, sizes: ModelSizes,
             machine: MachineFacts, session: bool = False) -> Suggestion | None:
    """The least costly combination that fits.

    Forward: for each knob in cost order, take its mildest option that fits; if none does, keep
    its strongest option when that lowers the peak (else leave the knob alone) and go on.
    Backward: with the later knobs fixed, relax each earlier knob to its mildest setting (or no
    change) that still fits, so no knob is pushed further than needed."""
    stages = _stages(request, preview)
    choice: list[int | None] = [None] * len(stages)

    def apply(picks: list[int | None]) -> tuple[GenerationRequest, bool, list[Option]]:
        changed, keep_preview, used = request, preview, []
        for stage, pick in zip(stages, picks):
            if pick is not None:
                option = stage[pick]
                changed = changed.with_changes(**dict(option.updates))
                keep_preview = keep_preview and not option.preview_off
                used.append(option)
        return changed, keep_preview, used

    def peak(picks: list[int | None]) -> int | float:
        changed, keep_preview, _ = apply(picks)
        try:
            changed.validate(check_files=False)    # a suggestion must itself pass every check
        except RequestError:
            return math.inf
        return max(p.total for p in _build_phases(changed, keep_preview, sizes, machine, session)[1])

    fitted_at: int | None = None
    for index, stage in enumerate(stages):
        for pick in range(len(stage)):
            choice[index] = pick
            if peak(choice) <= machine.budget:
                fitted_at = index
                break
        if fitted_at is not None:
            break
        strongest = peak(choice)            # choice[index] is the strongest option here
        choice[index] = None
        if strongest < peak(choice):
            choice[index] = len(stage) - 1
    if fitted_at is None:
        return None
    for index in range(fitted_at - 1, -1, -1):
        if choice[index] is None:
            continue
        for pick in [None, *range(len(stages[index]))]:
            trial = list(choice)
            trial[index] = pick
            if peak(trial) <= machine.budget:
                choice = trial
                break
    changed, keep_preview, used = apply(choice)
    return Suggestion(tuple(o.change for o in used), tuple(o.flag for o in used), changed, keep_preview,
                      peak(choice))


def plan_memory(request: GenerationRequest, inventory: ModelInventory | None = None, *,
                machine: MachineFacts | None = None, preview: bool = False, session: bool = False) -> MemoryPlan:
    """The plan for `request` on `machine` (detected when None), sized from `inventory` when given.
    `session`: planned for a warm engine (h3's interactive mode), which keeps the DiT and the
    video decoder loaded between clips. Never raises for not fitting: see `fits` and `suggestion`.
    Raises RequestError for a request h3 would refuse anyway (an 8192x8192 canvas is over the
    pixel limit, whatever the memory): its rules come before the plan, so that no suggestion is
    made from a canvas that cannot run."""
    request.validate(check_files=False)
    machine = machine or MachineFacts.detect()
    if inventory is not None:
        partition = REF2VA if request.is_ref2va and inventory.has_ref2va else FL2VA
        sizes = ModelSizes.from_inventory(inventory, partition)
    else:
        sizes = ModelSizes.published()
    g = geometry(request)
    dit_path, phases = _build_phases(request, preview, sizes, machine, session, g)
    plan = MemoryPlan(request=request, machine=machine, preview=preview, sizes=sizes, phases=phases,
                      dit_path=dit_path, session=session, geometry=g)
    if not plan.fits:
        plan.suggestion = _suggest(request, preview, sizes, machine, session)
    for visual in g.assumed_inputs:
        plan.notes.append(f"{visual.what} could not be read: planned at {visual.width}x{visual.height}"
                          + (f", {visual.frames} frames" if visual.frames > 1 else "") + " (upstream's largest)")
    if machine.int8_dit and not request.ssd_streaming:
        # h3_gpu.m h3_gpu_create: TensorOps is decided when h3 compiles its shaders; without it h3
        # falls back to BF16 kernels and weights
        bf16 = max(p.total for p in _build_phases(request, preview, sizes, replace(machine, tensor_ops_disabled=True),
                                                  session, g)[1])
        plan.notes.append(f"planned for h3's int8 DiT (M5 Metal TensorOps); if h3 cannot use TensorOps "
                          f"(H3_NAX=0, or its shaders fail to compile with them) it runs BF16, peak {format_bytes(bf16)}")
    if session:
        plan.notes.append("warm session: h3 keeps the DiT loaded after denoising and the video decoder after "
                          "decoding, so the next clip encodes its prompt with the decoder still loaded")
    if machine.system != "Darwin":
        plan.notes.append("not a Mac: the figures are what h3 would need on a Mac with this much memory")
    return plan


def check_model_for(request: GenerationRequest, inventory: ModelInventory) -> list[str]:
    """Raise ModelError / IntegrityError when h3 cannot run `request` from this model: layout
    and shard-header problems, or references without a complete Ref2VA checkpoint. Returns the
    warnings to show for this job (inventory.warnings_for): a job without references is not
    stopped by an incomplete Ref2VA/, since upstream loads it only for ordered references."""
    inventory.raise_for_problems(references=request.is_ref2va)
    if request.is_ref2va and not inventory.has_ref2va and REF2VA in inventory.partitions:
        raise inventory.incomplete_ref2va_error()     # e.g. Ref2VA/ without its index JSON
    if request.is_ref2va and not inventory.has_ref2va:
        # h3.c h3_generate: "ordered references require the Ref2VA checkpoint"
        raise ModelError("ordered references require the Ref2VA checkpoint, and "
                         f"{inventory.root} has no Ref2VA/transformer/model.safetensors.index.json",
                         hint="download the Ref2VA/ folder of MiniMaxAI/MiniMax-H3 next to FL2VA/")
    return inventory.warnings_for(references=request.is_ref2va) + fold_warnings(request, inventory)


def fold_warnings(request: GenerationRequest, inventory: ModelInventory) -> list[str]:
    """A folded step-distillation model sampled with --reuse/--core-reuse or many steps (fold_record.py)."""
    from .fold_record import request_warnings
    return request_warnings(request, inventory.provenance)   # type: ignore[arg-type]


def require_fit(plan: MemoryPlan) -> MemoryPlan:
    """`plan`, or MemoryPlanError (carrying the plan and its suggestion) when it does not fit."""
    if not plan.fits:
        fix = (f"use {' '.join(plan.suggestion.flags)}" if plan.suggestion else
               "this machine has too little memory for MiniMax-H3 even at the smallest settings")
        raise MemoryPlanError(plan.verdict(), plan=plan,
                              hint=fix + " (or pass --force / force=True to try anyway)")
    return plan


def preflight(request: GenerationRequest, model_dir: str | Path, *,
              machine: MachineFacts | Callable[[], MachineFacts | None] | None = None,
              preview: bool = False, force: bool = False, session: bool = False,
              inventory: ModelInventory | None = None) -> MemoryPlan:
    """Before starting an engine: layout + every shard header (fast; no tensor data read), then the
    memory plan. Raises ModelError / IntegrityError for a model h3 cannot use, and MemoryPlanError
    (carrying the plan and its suggestion) when the request will not fit, unless `force`.
    `session`: the request will run on a warm engine (see `plan_memory`). `inventory`: the
    model's inventory when the caller already holds it (a server checking every submission
    against one model), instead of reading the headers again. `machine` may be a function giving
    the facts (the library engine's, which start a worker that opens the model): it is called
    after the model check."""
    from .inventory import inspect_model

    if inventory is None:
        inventory = inspect_model(model_dir)
    warnings = (inventory.warnings_for(references=request.is_ref2va) + fold_warnings(request, inventory) if force
                else check_model_for(request, inventory))
    if callable(machine):       # facts that cost an engine start (the library's): after the model check
        machine = machine()
    plan = plan_memory(request, inventory, machine=machine, preview=preview, session=session)
    plan.model_warnings = warnings
    return plan if force else require_fit(plan)
