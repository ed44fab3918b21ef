"""What each phase of a job holds: upstream's per-row buffers, the DiT path h3 will take, the
weights, and the phases of a one-shot run or a warm session."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...geometry import FPS, SAMPLE_RATE
from ...request import GenerationRequest, SlowerPath
from .constants import (
    AUDIO_WORKSPACE_RATIO, DIT_AUDIO_CHANNELS, DIT_PATCH, DIT_ROPE_HALF, DIT_VIDEO_PATCH, FFMPEG_MUX,
    INT8_MIN_SEQUENCE, INT8_ROW_PAD, INT8_SCALE_GROUP, PROCESS_BASE, TEXT_ROPE_HALF, VAE_SPATIAL_RATIO,
    VAE_WORKSPACE_RATIO, VISION_DEEPSTACKS, VISION_MERGE, VISION_ROPE_HALF,
)
from .machine import MachineFacts
from .sizes import ModelSizes
from .geometry import Geometry, geometry


@dataclass(frozen=True)
class PhaseMemory:
    name: str
    parts: tuple[tuple[str, int], ...]     # (what, bytes), summed

    @property
    def total(self) -> int:
        return sum(size for _, size in self.parts)


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
