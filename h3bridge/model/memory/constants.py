"""The numbers the memory plan is built from: upstream's geometry and buffer constants (each
names its source), published measurements, h3bridge's own estimates and the safety margin."""
from __future__ import annotations

from ...geometry import SAMPLE_RATE


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
