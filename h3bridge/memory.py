"""Memory plan: will this request fit this Mac's unified memory, and if not, what is the cheapest change?

h3 loads and releases its models phase by phase ("Model phases are loaded and released separately
so the 33B transformer, Qwen encoder, and decoders never have to coexist in unified memory",
upstream README "Checkpoint layout and media pipeline"), so the process peak is the largest phase,
not the sum. Each phase's figure is built from the component sizes in the model inventory (tensor
bytes read from the shard headers) and from the request's geometry, using upstream's published
mechanics; each constant names its source.

Checks against upstream's published measurements (tests/test_memory.py):
  full-residency DiT, 50 layers, 512x512x22:  35.9 GiB blocks + 0.36 GiB AdaLN + arena ~= 36.4 GiB
      (README "Profiling": "the BF16 path's 36.4 GiB"; "about 36.5 GiB" in the SSD section)
  --ssd-streaming: 2 block slots 1.44 GiB + AdaLN + arena ~= 2.0 GiB at 512x512, 2.1 GiB at 864x480
      (README "For a low-memory run")
  text encoder, ring of 2: 3 layers x 0.91 GiB ~= 2.7 GiB (upstream issue 17: measured ~2.7 GiB)
  video VAE decoder: 9.0 GiB of F32 weights (README / facts: "~9 GiB"); preview VAE ~10 GiB (README)
"""
from __future__ import annotations

import math
import platform
import re
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import MemoryPlanError, ModelError
from .model import FL2VA, REF2VA, Component, ModelInventory, format_bytes
from .request import (
    CANVAS_MULTIPLE,
    FPS,
    MIN_LAYERS,
    GenerationRequest,
    ReferenceKind,
    SlowerPath,
    legal_frame_counts,
)

GIB = 2**30

# --- upstream geometry (h3_host.c / h3_host.h / h3_dit.c at 8974cc0)
VAE_SPATIAL_RATIO = 16        # h3_host.h H3_VAE_SPATIAL_RATIO
DIT_PATCH = 2                 # video patches are 2x2 latents: rows = (H/32)*(W/32) per latent frame
AUDIO_LATENT_FPS = 40         # h3_host.h H3_AUDIO_LATENT_FPS
AUDIO_STREAMS = 2             # h3_host.c h3_audio_grid: 2 rows per audio latent step
DIT_BLOCKS = 50               # h3_dit_schedule.h H3_DIT_BLOCKS
TEXT_LAYERS_USED = 50         # h3_text_encoder.c TEXT_LAYERS
INT8_MIN_SEQUENCE = 128       # h3_dit.c: int8 QKV/attention-output need dit->sequence >= 128
# --- published figures (upstream README, issues; /work/shared/h3-upstream-facts.md "Memory and speed")
# Workspaces scale with the model that uses them (a smaller model has narrower activations), so
# each published figure is stored with the size it was measured at.
ACTIVATION_BYTES_PER_ROW = 96_800      # "activation arena ~96.8 KB per sequence row" ...
ACTIVATION_HIDDEN = 5376               # ... at the DiT width H3_DIT_HIDDEN (h3_dit_schedule.h)
VAE_WORKSPACE_RATIO = 1 / 9            # README: --show "adds roughly 10 GiB" = 9.0 GiB decoder + ~1 GiB tiles;
                                       # the final decode uses the same decoder and tile plan (README)
AUDIO_WORKSPACE_RATIO = 0.2            # facts: audio VAE decode ~0.3 GiB in total, weights (~0.25 GiB) included
REFERENCE_AUDIO_SECONDS_MAX = 15       # h3.c: reference audio <= 15 s in total
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
        return cls(total_memory=psutil.virtual_memory().total, chip=chip, system=system)

    @classmethod
    def mac(cls, gigabytes: float, chip: str = "Apple M4 Pro") -> "MachineFacts":
        """A Mac sold as `gigabytes` GB (Apple's GB of unified memory are GiB)."""
        return cls(total_memory=int(gigabytes * GIB), chip=chip, system="Darwin")

    @property
    def apple_generation(self) -> int | None:
        match = re.search(r"\bM(\d+)\b", self.chip or "")
        return int(match.group(1)) if match else None

    @property
    def int8_dit(self) -> bool:
        """h3_gpu_has_int8_mlp: the native int8 engine needs Metal 4 TensorOps (M5)."""
        return (self.apple_generation or 0) >= 5

    @property
    def text_ring_depth(self) -> int:
        # README "Weight residency": "two layers on M3/older hardware and three on M5"
        return 3 if (self.apple_generation or 0) >= 5 else 2

    @property
    def reserve(self) -> int:
        """Memory left to macOS and apps: 20 % of RAM, at least 6 GiB (h3bridge policy)."""
        return max(RESERVE_MINIMUM, int(self.total_memory * RESERVE_FRACTION))

    @property
    def budget(self) -> int:
        return self.total_memory - self.reserve

    def describe(self) -> str:
        return f"{self.chip or self.system}, {self.total_memory / GIB:.0f} GiB"


# ---------------------------------------------------------------------------------------------
# Component sizes


@dataclass(frozen=True)
class ModelSizes:
    """Bytes the phases load, per component (from the inventory, or upstream's shapes)."""

    dit_blocks: int
    dit_block_matrices: int        # per block: qkv, out, fc1, fc2 (BF16) - what SSD streaming reads
    dit_block_norms: int           # per block: norm1/2, q/k norm (stay resident when streaming)
    dit_block_int8: int            # per block when h3 quantizes all four matrices (int8 + F32 row scales)
    dit_block_int8_mlp_only: int   # per block with int8 MLP, BF16 QKV/out
    dit_other: int                 # patch projections and final layer
    dit_hidden: int                # DiT width (activation rows scale with it)
    adaln_row_bytes: int           # per timestep row, all blocks + final layer (BF16 outputs)
    text_layer: int                # one Qwen3 layer
    text_layers_used: int
    vision_tower: int
    video_decoder: int
    video_encoder: int
    audio_decoder: int
    audio_encoder: int
    source: str

    @classmethod
    def published(cls) -> "ModelSizes":
        """From upstream's shapes (h3_dit.c / h3_dit_schedule.c / h3_text_encoder.c / h3_video_vae.c
        enums), for a plan without a model directory."""
        hidden, inner, ffn = 5376, 56 * 128, 14336                   # h3_dit.c HIDDEN, INNER, FFN
        matrices = [(3 * inner, hidden), (hidden, inner), (2 * ffn, hidden), (hidden, ffn)]
        stream = sum(r * c for r, c in matrices) * 2
        norms = (2 * hidden + 2 * 128) * 2
        int8 = sum(r * c + 4 * r for r, c in matrices)
        int8_mlp = sum(r * c * 2 for r, c in matrices[:2]) + sum(r * c + 4 * r for r, c in matrices[2:])
        te_h, te_i, te_q, te_kv = 5120, 25600, 64 * 128, 8 * 128     # h3_text_encoder.c enum
        text_layer = (te_h * te_q * 2 + te_h * te_kv * 2 + 3 * te_h * te_i + 2 * te_h + 2 * 128) * 2
        vae_h, vae_f = 2048, 8192                                     # h3_video_vae.c enum
        vae_block = (3 * vae_h * vae_h + vae_h * vae_h + 2 * vae_f * vae_h + vae_h * vae_f + 10 * vae_h) * 4
        return cls(
            dit_blocks=DIT_BLOCKS, dit_block_matrices=stream, dit_block_norms=norms, dit_block_int8=int8,
            dit_block_int8_mlp_only=int8_mlp, dit_other=6 * 2**20, dit_hidden=hidden,
            adaln_row_bytes=(DIT_BLOCKS * 3 * 6 * hidden + 2 * hidden) * 2,
            text_layer=text_layer, text_layers_used=TEXT_LAYERS_USED, vision_tower=int(1.2e9),
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
        if usable(video):
            assert video is not None
            values["video_decoder"] = video.bytes_where(lambda n: n.startswith(("decoder.", "post_quant_conv.")))
            values["video_encoder"] = video.bytes_where(lambda n: n.startswith(("encoder.", "quant_conv.")))
        if usable(audio):
            assert audio is not None
            values["audio_decoder"] = audio.bytes_where(lambda n: n.startswith("decoder."))
            values["audio_encoder"] = audio.bytes_where(lambda n: n.startswith("encoder."))
        source = f"model inventory ({inventory.root / partition})"
        if len(values) < 10:
            source += ", published shapes for missing components"
        return replace(fallback, **values, source=source)  # type: ignore[arg-type]


def _layer_indices(component: Component, pattern: str) -> set[int]:
    expression = re.compile(pattern)
    return {int(m.group(1)) for name in component.tensor_names() if (m := expression.match(name))}


_STREAMED = ("attn.qkv_proj.weight", "attn.out_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight")   # h3_dit.c


def _dit_sizes(dit: Component) -> dict[str, int]:
    blocks = _layer_indices(dit, r"blocks\.(\d+)\.")
    count = max(len(blocks), 1)
    matrices = norms = int8 = int8_mlp = adaln_rows = hidden = 0
    other = 0
    for shard in dit.shards:
        for tensor in shard.tensors:
            name = tensor.name
            if name.startswith("blocks."):
                suffix = name.split(".", 2)[2]
                if suffix in _STREAMED:
                    matrices += tensor.nbytes
                    quantized = tensor.elements + 4 * (tensor.shape[0] if tensor.shape else 1)
                    int8 += quantized
                    int8_mlp += quantized if suffix.startswith("mlp.") else tensor.nbytes
                elif suffix.startswith("adaln_proj.linear.bias"):
                    adaln_rows += tensor.nbytes          # one BF16 output row per timestep row
                elif not suffix.startswith("adaln_proj."):
                    norms += tensor.nbytes
                    if suffix == "norm1.weight" and tensor.shape:
                        hidden = tensor.shape[0]
            elif name == "final_layer.adaln_proj.linear.bias":
                adaln_rows += tensor.nbytes
            elif name.startswith(("video_patch_proj.", "audio_patch_proj.", "final_layer.")) and "adaln" not in name:
                other += tensor.nbytes
    return {"dit_blocks": len(blocks) or DIT_BLOCKS, "dit_block_matrices": matrices // count,
            "dit_block_norms": norms // count, "dit_block_int8": int8 // count,
            "dit_block_int8_mlp_only": int8_mlp // count, "dit_other": other, "adaln_row_bytes": adaln_rows,
            "dit_hidden": hidden or ACTIVATION_HIDDEN}


# ---------------------------------------------------------------------------------------------
# Request geometry


@dataclass(frozen=True)
class Geometry:
    """Sequence rows of one DiT forward (h3_host.c layout) and the decoded frame sizes."""

    render_width: int
    render_height: int
    frames: int
    video_t: int
    text_rows: int
    audio_rows: int
    video_rows: int
    condition_rows: int
    time_rows: int

    @property
    def sequence(self) -> int:
        return self.text_rows + self.audio_rows + self.video_rows + self.condition_rows


def video_latent_t(frames: int) -> int:
    """h3_host.c h3_video_latent_t: ((F - 5) / 17) * 5 + 2."""
    return ((frames - 5) // 17) * 5 + 2


def geometry(request: GenerationRequest) -> Geometry:
    width = request.render_width or request.width
    height = request.render_height or request.height
    frames = request.frame_count
    video_t = video_latent_t(frames)
    frame_rows = (height // (VAE_SPATIAL_RATIO * DIT_PATCH)) * (width // (VAE_SPATIAL_RATIO * DIT_PATCH))
    audio_t = int(frames * AUDIO_LATENT_FPS / FPS + 0.5)        # h3_host.c h3_temporal: llround
    text = PROMPT_TEMPLATE_TOKENS + math.ceil(len(request.prompt.encode()) / BYTES_PER_PROMPT_TOKEN)
    condition = 0
    anchors = int(request.first_frame is not None) + int(request.last_frame is not None)
    condition += anchors * frame_rows                            # one latent frame per anchor
    audio_references = 0
    for reference in request.references:
        if reference.kind is ReferenceKind.IMAGE:
            condition += frame_rows                              # match-size image: one latent frame
        elif reference.kind is not ReferenceKind.AUDIO:
            condition += video_t * frame_rows                    # bounded like the output clip (upper bound)
        if reference.kind in (ReferenceKind.AUDIO, ReferenceKind.VIDEO, ReferenceKind.VIDEO_AUDIO):
            audio_references += 1
    if audio_references:
        condition += AUDIO_STREAMS * AUDIO_LATENT_FPS * REFERENCE_AUDIO_SECONDS_MAX   # <= 15 s in total (h3.c)
    # h3_dit_schedule.c: one video and one audio timestep row per step, + one per condition kind
    time_rows = 2 * request.steps + int(anchors > 0 or bool(request.references)) + int(audio_references > 0)
    return Geometry(render_width=width, render_height=height, frames=frames, video_t=video_t, text_rows=text,
                    audio_rows=AUDIO_STREAMS * audio_t, video_rows=video_t * frame_rows,
                    condition_rows=condition, time_rows=time_rows)


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
    dit_path: str = "BF16"                 # "BF16", "int8", "int8 MLP", "SSD streaming"
    notes: list[str] = field(default_factory=list)

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

    def render(self) -> str:
        """The plan as a table (CLI `h3bridge plan`, ComfyUI Memory Plan node)."""
        g = geometry(self.request)
        lines = [f"request: {self.request.width}x{self.request.height}"
                 + (f" (render {g.render_width}x{g.render_height})" if self.request.render_width else "")
                 + f", {g.frames} frames, {self.request.layers} layers, DiT {self.dit_path}"
                 + (", preview" if self.preview else "") + f"; sequence {g.sequence} rows",
                 f"sizes from: {self.sizes.source}",
                 f"{'phase':<22} {'peak':>10}  made of"]
        for phase in self.phases:
            parts = ", ".join(f"{what} {format_bytes(size)}" for what, size in phase.parts if size)
            marker = " <- peak" if phase is self.peak_phase else ""
            lines.append(f"{phase.name:<22} {format_bytes(phase.total):>10}  {parts}{marker}")
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(self.verdict())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "fits": self.fits, "peak_bytes": self.peak, "peak_phase": self.peak_phase.name,
            "budget_bytes": self.budget, "reserve_bytes": self.machine.reserve,
            "machine": {"total_memory": self.machine.total_memory, "chip": self.machine.chip},
            "dit_path": self.dit_path, "preview": self.preview, "sizes_source": self.sizes.source,
            "phases": [{"name": p.name, "bytes": p.total, "parts": dict(p.parts)} for p in self.phases],
            "suggestion": None if self.suggestion is None else {
                "changes": list(self.suggestion.changes), "flags": list(self.suggestion.flags),
                "peak_bytes": self.suggestion.peak},
            "notes": list(self.notes),
        }


def _dit_residency(request: GenerationRequest, sizes: ModelSizes, machine: MachineFacts,
                   g: Geometry) -> tuple[str, list[tuple[str, int]]]:
    layers = min(request.layers, sizes.dit_blocks)
    if request.ssd_streaming:
        # README: "keeps two DiT blocks in memory"; h3_dit.c load_core: norms stay resident, two
        # BF16 matrix slots (allocate_stream_slot) alternate.
        return "SSD streaming", [("2 streamed block slots", 2 * sizes.dit_block_matrices),
                                 (f"{layers} blocks' norms", layers * sizes.dit_block_norms)]
    slower = request.slower_paths
    int8_capable = machine.int8_dit and g.sequence >= INT8_MIN_SEQUENCE
    # h3_dit.c (~l.1633): int8 MLP/QKV/attention-output by default where the GPU has the int8 engine
    int8_all = int8_capable and not slower & {SlowerPath.BF16_MLP, SlowerPath.BF16_QKV,
                                               SlowerPath.BF16_ATTENTION_OUTPUT}
    if int8_all:
        return "int8", [(f"{layers} int8 blocks", layers * (sizes.dit_block_int8 + sizes.dit_block_norms)),
                        # quantize_block_*: each block's BF16 copy lives until its quantization is submitted
                        ("one BF16 block while quantizing", sizes.dit_block_matrices)]
    if int8_capable and SlowerPath.BF16_MLP not in slower:
        return "int8 MLP", [(f"{layers} blocks (int8 MLP)",
                             layers * (sizes.dit_block_int8_mlp_only + sizes.dit_block_norms)),
                            ("one BF16 block while quantizing", sizes.dit_block_matrices)]
    return "BF16", [(f"{layers} BF16 blocks", layers * (sizes.dit_block_matrices + sizes.dit_block_norms))]


def _build_phases(request: GenerationRequest, preview: bool, sizes: ModelSizes,
                  machine: MachineFacts) -> tuple[str, tuple[PhaseMemory, ...]]:
    g = geometry(request)
    base = ("process", PROCESS_BASE)
    pixels_out = request.width * request.height * 3
    pixels_render = g.render_width * g.render_height * 3
    phases: list[PhaseMemory] = []
    # README "Weight residency": streamed Qwen encoder, current layer + a ring of future layers.
    depth = machine.text_ring_depth
    phases.append(PhaseMemory("prompt encoding", (
        base, (f"{depth + 1} text-encoder layers (ring of {depth})", (depth + 1) * sizes.text_layer))))
    if request.first_frame or request.last_frame or request.references:
        # first/last frames and references: Qwen3-VL vision tower + video VAE encoder (+ audio VAE encoder)
        audio_refs = any(r.kind is not ReferenceKind.IMAGE and r.kind is not ReferenceKind.SILENT_VIDEO
                         for r in request.references)
        phases.append(PhaseMemory("reference encoding", (
            base, ("vision tower", sizes.vision_tower), ("video VAE encoder", sizes.video_encoder),
            ("audio VAE encoder", sizes.audio_encoder if audio_refs else 0))))
    dit_path, dit_parts = _dit_residency(request, sizes, machine, g)
    shared = [
        ("patch/final layers", sizes.dit_other),
        # h3_dit_schedule.c: BLOCK_OUTPUT BF16 values per timestep row for every block, kept for the run
        (f"AdaLN schedule ({g.time_rows} timestep rows)", g.time_rows * sizes.adaln_row_bytes),
        (f"activation arena ({g.sequence} rows)",
         g.sequence * ACTIVATION_BYTES_PER_ROW * sizes.dit_hidden // ACTIVATION_HIDDEN),
    ]
    denoise = [base, *dit_parts, *shared]
    vae_workspace = int(sizes.video_decoder * VAE_WORKSPACE_RATIO)
    if preview:
        denoise.append(("preview VAE (--show)", sizes.video_decoder + vae_workspace))
    phases.append(PhaseMemory("DiT load + denoise", tuple(denoise)))
    latents = g.video_t * (g.render_height // VAE_SPATIAL_RATIO) * (g.render_width // VAE_SPATIAL_RATIO) * 24 * 4
    samples = math.ceil(g.frames / FPS * 32000)
    waveform = samples * 2 * 4
    phases.append(PhaseMemory("audio decode", (
        base, ("audio VAE decoder", sizes.audio_decoder),
        ("workspace", int(sizes.audio_decoder * AUDIO_WORKSPACE_RATIO)),
        ("latents", latents), ("waveform", waveform))))
    phases.append(PhaseMemory("video decode", (
        base, ("video VAE decoder", sizes.video_decoder), ("tile workspace", vae_workspace),
        ("latents", latents), ("decoded frames (F32)", g.frames * pixels_render * 4),
        ("output frames (RGB8)", g.frames * pixels_out), ("waveform", waveform))))
    phases.append(PhaseMemory("mux (FFmpeg)", (
        base, ("output frames (RGB8)", g.frames * pixels_out), ("waveform", waveform), ("ffmpeg", FFMPEG_MUX))))
    return dit_path, tuple(phases)


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
        flag = "--ssd-streaming" + (" (without --use-int8-row-fc2)" if request.int8_row_fc2 else "")
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
             machine: MachineFacts) -> Suggestion | None:
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

    def peak(picks: list[int | None]) -> int:
        changed, keep_preview, _ = apply(picks)
        return max(p.total for p in _build_phases(changed, keep_preview, sizes, machine)[1])

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
                machine: MachineFacts | None = None, preview: bool = False) -> MemoryPlan:
    """The plan for `request` on `machine` (detected when None), sized from `inventory` when given.
    Never raises for not fitting: see `fits` and `suggestion`."""
    machine = machine or MachineFacts.detect()
    if inventory is not None:
        partition = REF2VA if request.is_ref2va and inventory.has_ref2va else FL2VA
        sizes = ModelSizes.from_inventory(inventory, partition)
    else:
        sizes = ModelSizes.published()
    dit_path, phases = _build_phases(request, preview, sizes, machine)
    plan = MemoryPlan(request=request, machine=machine, preview=preview, sizes=sizes, phases=phases,
                      dit_path=dit_path)
    if not plan.fits:
        plan.suggestion = _suggest(request, preview, sizes, machine)
    if machine.system != "Darwin":
        plan.notes.append("not a Mac: the figures are what h3 would need on a Mac with this much memory")
    return plan


def check_model_for(request: GenerationRequest, inventory: ModelInventory) -> None:
    """Raise ModelError / IntegrityError when h3 cannot run `request` from this model: layout
    and shard-header problems, or references without the Ref2VA checkpoint."""
    inventory.raise_for_problems()
    if request.is_ref2va and not inventory.has_ref2va:
        # h3.c h3_generate: "ordered references require the Ref2VA checkpoint"
        raise ModelError("ordered references require the Ref2VA checkpoint, and "
                         f"{inventory.root} has no Ref2VA/transformer/model.safetensors.index.json",
                         hint="download the Ref2VA/ folder of MiniMaxAI/MiniMax-H3 next to FL2VA/")


def require_fit(plan: MemoryPlan) -> MemoryPlan:
    """`plan`, or MemoryPlanError (carrying the plan and its suggestion) when it does not fit."""
    if not plan.fits:
        fix = (f"use {' '.join(plan.suggestion.flags)}" if plan.suggestion else
               "this machine has too little memory for MiniMax-H3 even at the smallest settings")
        raise MemoryPlanError(plan.verdict(), plan=plan,
                              hint=fix + " (or pass --force / force=True to try anyway)")
    return plan


def preflight(request: GenerationRequest, model_dir: str | Path, *, machine: MachineFacts | None = None,
              preview: bool = False, force: bool = False) -> MemoryPlan:
    """Before starting an engine: layout + every shard header (fast; no tensor data read), then the
    memory plan. Raises ModelError / IntegrityError for a model h3 cannot use, and MemoryPlanError
    (carrying the plan and its suggestion) when the request will not fit, unless `force`."""
    from .model import inspect_model

    inventory = inspect_model(model_dir)
    if not force:
        check_model_for(request, inventory)
    plan = plan_memory(request, inventory, machine=machine, preview=preview)
    return plan if force else require_fit(plan)
