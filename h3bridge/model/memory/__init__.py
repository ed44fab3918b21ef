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

Where each part lives (one concern a module, each importing only the ones above it):
  constants  upstream's geometry and buffer constants, published figures, estimates, reserve
  machine    MachineFacts: the Mac's memory and chip, and the budget left for h3
  sizes      ModelSizes: bytes each component loads, from the inventory or upstream's shapes
  geometry   Geometry: the request's sequence rows, reference media probed (geometry())
  phases     DitPath, per-row buffers, weights, and each phase's memory (PhaseMemory)
  suggest    Suggestion: the cheapest change that fits, as request fields (h3bridge.fixes.Change)
  plan       MemoryPlan and plan_memory: phases, peak, budget, verdict
  check      check_model_for, require_fit, preflight: before an engine starts
Each interface says a suggestion in its own words (h3bridge.fixes); nothing here spells a flag.
"""

from __future__ import annotations

from .constants import (  # noqa: F401
    GIB, VAE_SPATIAL_RATIO, DIT_PATCH, AUDIO_LATENT_FPS, AUDIO_HOP, AUDIO_STREAMS, DIT_BLOCKS,
    TEXT_LAYERS_USED, INT8_MIN_SEQUENCE, DIT_VIDEO_PATCH, DIT_AUDIO_CHANNELS, DIT_ROPE_HALF, INT8_SCALE_GROUP,
    INT8_ROW_PAD, TEXT_ROPE_HALF, VISION_PATCH, VISION_MERGE, VISION_ROPE_HALF, VISION_DEEPSTACKS,
    VIDEO_FRAMES_PER_VISION_SAMPLE, VISION_SAMPLES_PER_BLOCK, REFERENCE_IMAGE_MAX_EDGE, VAE_WORKSPACE_RATIO,
    AUDIO_WORKSPACE_RATIO, PROCESS_BASE, FFMPEG_MUX, PROMPT_TEMPLATE_TOKENS, BYTES_PER_PROMPT_TOKEN,
    RESERVE_FRACTION, RESERVE_MINIMUM,
)
from .machine import (  # noqa: F401
    MachineFacts,
)
from .sizes import (  # noqa: F401
    ModelSizes,
)
from .geometry import (  # noqa: F401
    probe_reference, VisualInput, Geometry, geometry,
)
from .phases import (  # noqa: F401
    PhaseMemory, DitPath, dit_path_for, dit_bytes_per_row, text_token_bytes, vision_output_bytes,
    vision_patch_bytes,
)
from .suggest import (  # noqa: F401
    Option, Suggestion,
)
from .plan import (  # noqa: F401
    MemoryPlan, plan_memory,
)
from .check import (  # noqa: F401
    check_model_for, fold_warnings, require_fit, preflight,
)
# names the old single module re-exported, imported from here by callers
from ...geometry import reference_image_canvas, reference_video_canvas, video_latent_t  # noqa: F401

__all__ = [
    "AUDIO_HOP", "AUDIO_LATENT_FPS", "AUDIO_STREAMS", "AUDIO_WORKSPACE_RATIO", "BYTES_PER_PROMPT_TOKEN",
    "DIT_AUDIO_CHANNELS", "DIT_BLOCKS", "DIT_PATCH", "DIT_ROPE_HALF", "DIT_VIDEO_PATCH", "DitPath",
    "FFMPEG_MUX", "GIB", "Geometry", "INT8_MIN_SEQUENCE", "INT8_ROW_PAD", "INT8_SCALE_GROUP", "MachineFacts",
    "MemoryPlan", "ModelSizes", "Option", "PROCESS_BASE", "PROMPT_TEMPLATE_TOKENS", "PhaseMemory",
    "REFERENCE_IMAGE_MAX_EDGE", "RESERVE_FRACTION", "RESERVE_MINIMUM", "Suggestion", "TEXT_LAYERS_USED",
    "TEXT_ROPE_HALF", "VAE_SPATIAL_RATIO", "VAE_WORKSPACE_RATIO", "VIDEO_FRAMES_PER_VISION_SAMPLE",
    "VISION_DEEPSTACKS", "VISION_MERGE", "VISION_PATCH", "VISION_ROPE_HALF", "VISION_SAMPLES_PER_BLOCK",
    "VisualInput", "check_model_for", "dit_bytes_per_row", "dit_path_for", "fold_warnings", "geometry",
    "plan_memory", "preflight", "probe_reference", "reference_image_canvas", "reference_video_canvas",
    "require_fit", "text_token_bytes", "video_latent_t", "vision_output_bytes", "vision_patch_bytes",
]
