"""A MiniMax-H3 model directory for tests and for h3-sim: real layout, real names, fake numbers.

The layout is the one upstream h3.c reads (h3.c `h3_load_dir`, `h3_generate`'s component paths,
h3_video_vae.c / h3_audio_vae.c `load_latent_normalization`):

    FL2VA/transformer/config.json                 required file (h3.c h3_load_dir)
    FL2VA/transformer/model.safetensors.index.json + model-0000i-of-0000N.safetensors
    FL2VA/tokenizer/tokenizer.json                required file (h3.c h3_load_dir)
    FL2VA/text_encoder/*.safetensors (+ index)    Qwen3-VL-32B-shaped language + vision tower
    FL2VA/video_vae/config.json                   latents_mean / latents_std (24 channels)
    FL2VA/video_vae/source/*.safetensors          decoder + encoder
    FL2VA/audio_vae/config.json                   latents_mean / latents_std (32 channels)
    FL2VA/audio_vae/*.safetensors
    Ref2VA/...                                    the same tree; Ref2VA is enabled only when
                                                  Ref2VA/transformer/model.safetensors.index.json exists

Tensor names, dtypes and ranks are the ones upstream loads (h3_dit.c `load_block`/`load_core`,
h3_dit_schedule.c, h3_text_encoder.c, h3_vision_encoder.c, h3_video_vae.c, h3_audio_vae.c).
With ``realistic=False`` every tensor has tiny dimensions and holds real bytes (the whole tree is
a few hundred KB). With ``realistic=True`` the shapes are the released ones and each shard is a
sparse file (header written, data section made by truncate), so the directory reports the real
checkpoint's sizes at no disk cost. Both modes use the same shard split (computed from the real
sizes), so shard counts and names are the same.
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

DTYPE_SIZES = {"BOOL": 1, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

# Shard size limits of the tools that wrote the official checkpoint: transformers' save_pretrained
# default ("5GB") for the text encoder, diffusers' ("10GB") for the transformer.
TEXT_ENCODER_SHARD_BYTES = 5 * 10**9
TRANSFORMER_SHARD_BYTES = 10 * 10**9


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class Dims:
    """Model dimensions; REAL are upstream's enums, TINY keep every name and layer count."""

    # DiT (h3_dit.c enum, h3_dit_schedule.h/.c)
    dit_blocks: int
    dit_hidden: int
    dit_heads: int
    dit_head_dim: int
    dit_ffn: int
    text_dim: int
    time_input: int
    time_dim: int
    video_patch: int
    audio_channels: int
    # Qwen3-VL-32B text encoder (h3_text_encoder.c enum; the checkpoint stores all 64 layers,
    # upstream runs the first 50)
    te_layers: int
    te_vocab: int
    te_hidden: int
    te_intermediate: int
    te_q_heads: int
    te_kv_heads: int
    te_head_dim: int
    # Qwen3-VL vision tower (h3_vision_encoder.c)
    vis_blocks: int
    vis_hidden: int
    vis_intermediate: int
    vis_patch: int
    vis_positions: int
    vis_merge: int
    # Video VAE decoder (h3_video_vae.c enum) and encoder (h3_video_encoder.c)
    vae_blocks: int
    vae_hidden: int
    vae_ffn: int
    vae_registers: int
    vae_output_patch: int
    vae_latent: int
    vae_enc_channels: tuple[int, ...]
    # Audio VAE (h3_audio_vae.c): BigVGAN-style decoder, convolutional encoder
    audio_latent: int
    audio_latent_dim: int        # dec_in_proj's output, the decoder's conv_pre input
    audio_decoder_dim: int
    audio_upsample_kernels: tuple[int, ...]
    audio_resblock_kernels: tuple[int, ...]
    audio_encoder_dim: int
    audio_encoder_stages: int


REAL = Dims(
    dit_blocks=50, dit_hidden=5376, dit_heads=56, dit_head_dim=128, dit_ffn=14336, text_dim=5120,
    time_input=256, time_dim=2688, video_patch=96, audio_channels=32,
    te_layers=64, te_vocab=151936, te_hidden=5120, te_intermediate=25600, te_q_heads=64,
    te_kv_heads=8, te_head_dim=128,
    vis_blocks=27, vis_hidden=1152, vis_intermediate=4304, vis_patch=16, vis_positions=2304,
    vis_merge=2,
    vae_blocks=36, vae_hidden=2048, vae_ffn=8192, vae_registers=4, vae_output_patch=3 * 4 * 16 * 16,
    vae_latent=24, vae_enc_channels=(128, 256, 256, 512, 512, 1024),
    audio_latent=32, audio_latent_dim=2048, audio_decoder_dim=1024,
    audio_upsample_kernels=(9, 9, 4, 4, 4, 4, 4),
    audio_resblock_kernels=(3, 7, 11), audio_encoder_dim=64, audio_encoder_stages=5,
)

TINY = Dims(
    dit_blocks=50, dit_hidden=8, dit_heads=2, dit_head_dim=4, dit_ffn=8, text_dim=8,
    time_input=4, time_dim=4, video_patch=4, audio_channels=4,
    te_layers=64, te_vocab=16, te_hidden=8, te_intermediate=8, te_q_heads=2, te_kv_heads=1,
    te_head_dim=4,
    vis_blocks=27, vis_hidden=4, vis_intermediate=4, vis_patch=2, vis_positions=4, vis_merge=2,
    vae_blocks=36, vae_hidden=4, vae_ffn=4, vae_registers=1, vae_output_patch=4, vae_latent=24,
    vae_enc_channels=(2, 4, 4, 8, 8, 16),
    audio_latent=32, audio_latent_dim=8, audio_decoder_dim=128,
    audio_upsample_kernels=(2, 2, 2, 2, 2, 2, 2),
    audio_resblock_kernels=(1, 1, 1), audio_encoder_dim=2, audio_encoder_stages=5,
)


def _bf(name: str, *shape: int) -> TensorSpec:
    return TensorSpec(name, "BF16", tuple(shape))


def _f32(name: str, *shape: int) -> TensorSpec:
    return TensorSpec(name, "F32", tuple(shape))


def transformer_tensors(d: Dims) -> list[TensorSpec]:
    """DiT tensors in checkpoint order (h3_dit.c load_block/load_core/refine_text, h3_dit_schedule.c)."""
    inner = d.dit_heads * d.dit_head_dim
    adaln = 3 * 6 * d.dit_hidden   # H3_DIT_MODALITIES * H3_DIT_ADALN_SLOTS * H3_DIT_HIDDEN

    def block(prefix: str) -> list[TensorSpec]:
        return [
            _bf(prefix + "norm1.weight", d.dit_hidden),
            _bf(prefix + "attn.qkv_proj.weight", inner * 3, d.dit_hidden),
            _bf(prefix + "attn.q_norm.weight", d.dit_head_dim),
            _bf(prefix + "attn.k_norm.weight", d.dit_head_dim),
            _bf(prefix + "attn.out_proj.weight", d.dit_hidden, inner),
            _bf(prefix + "norm2.weight", d.dit_hidden),
            _bf(prefix + "mlp.fc1.weight", d.dit_ffn * 2, d.dit_hidden),
            _bf(prefix + "mlp.fc2.weight", d.dit_hidden, d.dit_ffn),
        ]

    specs = [
        _f32("time_embedder.proj_in.weight", d.dit_hidden, d.time_input),
        _f32("time_embedder.proj_in.bias", d.dit_hidden),
        _f32("time_embedder.proj_out.weight", d.time_dim, d.dit_hidden),
        _f32("time_embedder.proj_out.bias", d.time_dim),
        _bf("condition_proj.weight", d.dit_hidden, d.text_dim),
        _bf("condition_proj.bias", d.dit_hidden),
        *block("token_refiner.blocks.0."),
        *block("token_refiner.blocks.1."),
        _bf("token_refiner.final_norm.weight", d.dit_hidden),
        _f32("video_patch_proj.weight", d.dit_hidden, d.video_patch),
        _f32("video_patch_proj.bias", d.dit_hidden),
        _f32("audio_patch_proj.weight", d.dit_hidden, d.audio_channels),
        _f32("audio_patch_proj.bias", d.dit_hidden),
        # the RoPE inverse frequencies (h3_dit.c prepare_rope: F32, ROPE_FREQS = 16 in either mode)
        _f32("rope.inv_freq", 16),
    ]
    for index in range(d.dit_blocks):
        prefix = f"blocks.{index}."
        specs += [_bf(prefix + "adaln_proj.linear.weight", adaln, d.time_dim),
                  _bf(prefix + "adaln_proj.linear.bias", adaln), *block(prefix)]
    specs += [
        _bf("final_layer.adaln_proj.linear.weight", 2 * d.dit_hidden, d.time_dim),
        _bf("final_layer.adaln_proj.linear.bias", 2 * d.dit_hidden),
        _bf("final_layer.norm.weight", d.dit_hidden),
        _f32("final_layer.video_out.weight", d.video_patch, d.dit_hidden),
        _f32("final_layer.video_out.bias", d.video_patch),
        _f32("final_layer.audio_out.weight", d.audio_channels, d.dit_hidden),
        _f32("final_layer.audio_out.bias", d.audio_channels),
    ]
    return specs


def text_encoder_tensors(d: Dims) -> list[TensorSpec]:
    """Qwen3-VL names (h3_text_encoder.c, h3_vision_encoder.c)."""
    q = d.te_q_heads * d.te_head_dim
    kv = d.te_kv_heads * d.te_head_dim
    lm = "model.language_model."
    specs = [_bf(lm + "embed_tokens.weight", d.te_vocab, d.te_hidden)]
    for layer in range(d.te_layers):
        p = f"{lm}layers.{layer}."
        specs += [
            _bf(p + "input_layernorm.weight", d.te_hidden),
            _bf(p + "self_attn.q_proj.weight", q, d.te_hidden),
            _bf(p + "self_attn.k_proj.weight", kv, d.te_hidden),
            _bf(p + "self_attn.v_proj.weight", kv, d.te_hidden),
            _bf(p + "self_attn.q_norm.weight", d.te_head_dim),
            _bf(p + "self_attn.k_norm.weight", d.te_head_dim),
            _bf(p + "self_attn.o_proj.weight", d.te_hidden, q),
            _bf(p + "post_attention_layernorm.weight", d.te_hidden),
            _bf(p + "mlp.gate_proj.weight", d.te_intermediate, d.te_hidden),
            _bf(p + "mlp.up_proj.weight", d.te_intermediate, d.te_hidden),
            _bf(p + "mlp.down_proj.weight", d.te_hidden, d.te_intermediate),
        ]
    specs.append(_bf(lm + "norm.weight", d.te_hidden))
    v = "model.visual."
    merged = d.vis_hidden * d.vis_merge * d.vis_merge
    specs += [
        _bf(v + "patch_embed.proj.weight", d.vis_hidden, 3, 2, d.vis_patch, d.vis_patch),
        _bf(v + "patch_embed.proj.bias", d.vis_hidden),
        _bf(v + "pos_embed.weight", d.vis_positions, d.vis_hidden),
    ]
    for block in range(d.vis_blocks):
        p = f"{v}blocks.{block}."
        specs += [
            _bf(p + "norm1.weight", d.vis_hidden), _bf(p + "norm1.bias", d.vis_hidden),
            _bf(p + "attn.qkv.weight", 3 * d.vis_hidden, d.vis_hidden),
            _bf(p + "attn.qkv.bias", 3 * d.vis_hidden),
            _bf(p + "attn.proj.weight", d.vis_hidden, d.vis_hidden),
            _bf(p + "attn.proj.bias", d.vis_hidden),
            _bf(p + "norm2.weight", d.vis_hidden), _bf(p + "norm2.bias", d.vis_hidden),
            _bf(p + "mlp.linear_fc1.weight", d.vis_intermediate, d.vis_hidden),
            _bf(p + "mlp.linear_fc1.bias", d.vis_intermediate),
            _bf(p + "mlp.linear_fc2.weight", d.vis_hidden, d.vis_intermediate),
            _bf(p + "mlp.linear_fc2.bias", d.vis_hidden),
        ]
    mergers = [f"{v}merger."] + [f"{v}deepstack_merger_list.{i}." for i in range(3)]
    for p in mergers:
        width = d.vis_hidden if p.endswith("merger.") else merged
        specs += [
            _bf(p + "norm.weight", width), _bf(p + "norm.bias", width),
            _bf(p + "linear_fc1.weight", merged, merged), _bf(p + "linear_fc1.bias", merged),
            _bf(p + "linear_fc2.weight", d.te_hidden, merged), _bf(p + "linear_fc2.bias", d.te_hidden),
        ]
    specs.append(_bf("lm_head.weight", d.te_vocab, d.te_hidden))
    return specs


def video_vae_tensors(d: Dims) -> list[TensorSpec]:
    """h3_video_vae.c (decoder, F32) and h3_video_encoder.c (encoder)."""
    inner = d.vae_hidden
    specs = [
        _f32("post_quant_conv.weight", d.vae_latent, d.vae_latent, 1, 1, 1),
        _f32("post_quant_conv.bias", d.vae_latent),
        _f32("decoder.x_embedder.weight", d.vae_hidden, d.vae_latent),
        _f32("decoder.x_embedder.bias", d.vae_hidden),
        _f32("decoder.register_tokens", 1, d.vae_registers, d.vae_hidden),
    ]
    for index in range(d.vae_blocks):
        p = f"decoder.transformer_blocks.{index}."
        specs += [
            _f32(p + "norm1.weight", d.vae_hidden),
            _f32(p + "attn.to_qkv.weight", inner * 3, d.vae_hidden),
            _f32(p + "attn.to_qkv.bias", inner * 3),
            _f32(p + "attn.to_out.weight", d.vae_hidden, inner),
            _f32(p + "attn.to_out.bias", d.vae_hidden),
            _f32(p + "scale1", d.vae_hidden),
            _f32(p + "norm2.weight", d.vae_hidden),
            _f32(p + "ff.w1.weight", d.vae_ffn * 2, d.vae_hidden),
            _f32(p + "ff.w1.bias", d.vae_ffn * 2),
            _f32(p + "ff.w2.weight", d.vae_hidden, d.vae_ffn),
            _f32(p + "ff.w2.bias", d.vae_hidden),
            _f32(p + "scale2", d.vae_hidden),
        ]
    specs += [
        _f32("decoder.norm_out.weight", d.vae_hidden), _f32("decoder.norm_out.bias", d.vae_hidden),
        _f32("decoder.proj_out.weight", d.vae_output_patch, d.vae_hidden),
        _f32("decoder.proj_out.bias", d.vae_output_patch),
    ]
    channels = d.vae_enc_channels
    specs += [_f32("encoder.conv_in.weight", channels[0], 3, 3, 3, 3),
              _f32("encoder.conv_in.bias", channels[0])]
    previous = channels[0]
    for level, width in enumerate(channels):
        for block in range(2):
            p = f"encoder.down.{level}.block.{block}."
            specs += [
                _f32(p + "norm1.weight", previous), _f32(p + "norm1.bias", previous),
                _f32(p + "conv1.weight", width, previous, 3, 3, 3), _f32(p + "conv1.bias", width),
                _f32(p + "norm2.weight", width), _f32(p + "norm2.bias", width),
                _f32(p + "conv2.weight", width, width, 3, 3, 3), _f32(p + "conv2.bias", width),
            ]
            if previous != width:     # a 1x1x1 shortcut where the block changes the width
                specs += [_f32(p + "nin_shortcut.weight", width, previous, 1, 1, 1),
                          _f32(p + "nin_shortcut.bias", width)]
            previous = width
        if level < 4:                 # h3_video_encoder.c: the first four levels downsample
            p = f"encoder.down.{level}.downsample.conv."
            specs += [_f32(p + "weight", width, width, 3, 3, 3), _f32(p + "bias", width)]
    specs += [
        _f32("encoder.norm_out.weight", previous), _f32("encoder.norm_out.bias", previous),
        _f32("encoder.conv_out.weight", 2 * d.vae_latent, previous, 3, 3, 3),
        _f32("encoder.conv_out.bias", 2 * d.vae_latent),
        _f32("quant_conv.weight", 2 * d.vae_latent, 2 * d.vae_latent, 1, 1, 1),
        _f32("quant_conv.bias", 2 * d.vae_latent),
    ]
    return specs


def audio_vae_tensors(d: Dims) -> list[TensorSpec]:
    """h3_audio_vae.c: the latent projection and BigVGAN-style decoder (weight-normalised
    convolutions: weight_v, weight_g, bias; transposed up-convolutions keep PyTorch's IOK order
    with the gain per input channel and the bias per output channel; snake activations), the
    convolutional encoder with its attention pre-block and mean projection. Checked against
    upstream's loader by running upstream's own code on the fixture (tests/test_upstream_*)."""
    specs: list[TensorSpec] = []

    def conv(prefix: str, out_ch: int, in_ch: int, kernel: int, *, bias: bool = True) -> None:
        specs.extend([_f32(prefix + ".weight_g", out_ch, 1, 1), _f32(prefix + ".weight_v", out_ch, in_ch, kernel)])
        if bias:
            specs.append(_f32(prefix + ".bias", out_ch))

    def up_conv(prefix: str, in_ch: int, out_ch: int, kernel: int) -> None:
        specs.extend([_f32(prefix + ".weight_g", in_ch, 1, 1), _f32(prefix + ".weight_v", in_ch, out_ch, kernel),
                      _f32(prefix + ".bias", out_ch)])

    def snake(prefix: str, channels: int) -> None:
        specs.extend([_f32(prefix + ".act.alpha", channels), _f32(prefix + ".act.beta", channels)])

    specs += [_f32("dec_in_proj.weight", d.audio_latent_dim, d.audio_latent, 1),
              _f32("dec_in_proj.bias", d.audio_latent_dim)]
    conv("decoder.conv_pre", d.audio_decoder_dim, d.audio_latent_dim, 7)
    for index, kernel in enumerate(d.audio_upsample_kernels):
        in_ch, out_ch = d.audio_decoder_dim >> index, d.audio_decoder_dim >> (index + 1)
        up_conv(f"decoder.ups.{index}.0", in_ch, out_ch, kernel)
        for block_index, rk in enumerate(d.audio_resblock_kernels):
            block = index * len(d.audio_resblock_kernels) + block_index
            for pair in range(3):
                conv(f"decoder.resblocks.{block}.convs1.{pair}", out_ch, out_ch, rk)
                conv(f"decoder.resblocks.{block}.convs2.{pair}", out_ch, out_ch, rk)
            for activation in range(6):
                snake(f"decoder.resblocks.{block}.activations.{activation}", out_ch)
    last = d.audio_decoder_dim >> len(d.audio_upsample_kernels)
    snake("decoder.activation_post", last)
    specs += [_f32("decoder.activation_post.upsample.filter", 1, 1, 12),
              _f32("decoder.activation_post.downsample.lowpass.filter", 1, 1, 12)]
    conv("decoder.conv_post", 1, last, 7, bias=False)
    width = d.audio_encoder_dim
    conv("encoder.block.0", width, 1, 7)
    strides = (2, 4, 4, 5, 5)
    for stage in range(1, d.audio_encoder_stages + 1):
        for residual in range(3):
            p = f"encoder.block.{stage}.block.{residual}"
            specs.append(_f32(p + ".block.0.alpha", 1, width, 1))
            conv(p + ".block.1", width, width, 7)
            specs.append(_f32(p + ".block.2.alpha", 1, width, 1))
            conv(p + ".block.3", width, width, 1)
        specs.append(_f32(f"encoder.block.{stage}.block.3.alpha", 1, width, 1))
        conv(f"encoder.block.{stage}.block.4", width * 2, width, 2 * strides[stage - 1])
        width *= 2
    specs.append(_f32(f"encoder.block.{d.audio_encoder_stages + 1}.alpha", 1, width, 1))
    conv(f"encoder.block.{d.audio_encoder_stages + 2}", d.audio_latent_dim, width, 3)
    latent, hidden = d.audio_latent, d.audio_latent_dim
    specs += [
        _f32("pre_block.norm3.weight", hidden), _f32("pre_block.norm3.bias", hidden),
        _f32("pre_block.proj.weight", latent, hidden), _f32("pre_block.proj.bias", latent),
        _f32("pre_block.norm1.weight", hidden), _f32("pre_block.norm1.bias", hidden),
        _f32("pre_block.attn.qkv.weight", 3 * hidden, hidden),
        _f32("pre_block.attn.q_bias", hidden), _f32("pre_block.attn.zero_k_bias", hidden),
        _f32("pre_block.attn.v_bias", hidden),
        _f32("pre_block.attn.proj.weight", latent, latent), _f32("pre_block.attn.proj.bias", latent),
        _f32("pre_block.norm2.weight", latent), _f32("pre_block.norm2.bias", latent),
        _f32("pre_block.mlp.norm.weight", latent), _f32("pre_block.mlp.norm.bias", latent),
        _f32("pre_block.mlp.w0.weight", 2 * latent, latent), _f32("pre_block.mlp.w0.bias", 2 * latent),
        _f32("pre_block.mlp.w1.weight", 2 * latent, latent), _f32("pre_block.mlp.w1.bias", 2 * latent),
        _f32("pre_block.mlp.w2.weight", latent, 2 * latent), _f32("pre_block.mlp.w2.bias", latent),
        _f32("mean_proj.weight", latent, latent, 1), _f32("mean_proj.bias", latent),
    ]
    return specs


# ---------------------------------------------------------------------------------------------
# Writing safetensors


def data_order(specs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """Larger elements first, as the `safetensors` library lays data out, so every tensor starts
    at a multiple of its element size."""
    return sorted(specs, key=lambda spec: -DTYPE_SIZES[spec.dtype])


def encode_header(specs: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length plus JSON header, padded with spaces so the data section starts on an
    8-byte boundary (what the `safetensors` library itself writes)."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for spec in data_order(specs):
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw


def tensor_bytes(spec: TensorSpec) -> bytes:
    """Deterministic small-valued numbers for one tensor (seeded by its name)."""
    seed = int.from_bytes(hashlib.sha256(spec.name.encode()).digest()[:8], "little")
    values = np.random.default_rng(seed).standard_normal(math.prod(spec.shape)).astype(np.float32) * 0.02
    if spec.dtype == "F32":
        return values.astype("<f4").tobytes()
    if spec.dtype == "BF16":
        return (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    raise ValueError(f"fixture writes BF16/F32 only, not {spec.dtype}")


def write_safetensors(path: Path, specs: Sequence[TensorSpec], *, sparse: bool = False,
                      metadata: dict[str, str] | None = None) -> int:
    """Write one shard; returns its size. `sparse` leaves the data section as a hole."""
    header = encode_header(specs, metadata)
    data_size = sum(spec.nbytes for spec in specs)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(header)
        if sparse:
            handle.truncate(len(header) + data_size)
        else:
            for spec in data_order(specs):
                handle.write(tensor_bytes(spec))
    return len(header) + data_size


def split_shards(real: Sequence[TensorSpec], limit: int) -> list[list[int]]:
    """Greedy split in checkpoint order by real byte size (as save_pretrained does)."""
    shards: list[list[int]] = [[]]
    used = 0
    for index, spec in enumerate(real):
        if shards[-1] and used + spec.nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append(index)
        used += spec.nbytes
    return shards


def write_component(directory: Path, real: list[TensorSpec], chosen: list[TensorSpec], *,
                    shard_limit: int | None, single_name: str, sparse: bool) -> None:
    """Write a component as one file or as `model-0000i-of-0000N.safetensors` + index JSON."""
    if shard_limit is None:
        write_safetensors(directory / single_name, chosen, sparse=sparse, metadata={"format": "pt"})
        return
    groups = split_shards(real, shard_limit)
    weight_map: dict[str, str] = {}
    total = 0
    for number, group in enumerate(groups, start=1):
        name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        specs = [chosen[i] for i in group]
        write_safetensors(directory / name, specs, sparse=sparse, metadata={"format": "pt"})
        for spec in specs:
            weight_map[spec.name] = name
            total += spec.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


def _byte_level_alphabet() -> list[str]:
    """The 256 symbols of GPT-2's byte-level alphabet, in byte order (printable bytes stand for
    themselves, the others for U+0100 upwards): what a byte-level BPE encodes every byte as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(shifted)) for byte in range(256)]


def _tokenizer_json() -> dict[str, object]:
    """A small but well-formed Hugging Face `tokenizers` file (byte-level BPE, Qwen special ids).
    Its vocabulary is the whole byte-level alphabet (no merges), so every prompt encodes, one
    token per UTF-8 byte, with upstream's tokenizer as with Hugging Face's: a vocabulary without
    "Ġ" (the space's symbol) fails upstream's encode of any prompt with a space in it."""
    vocab = {symbol: index for index, symbol in enumerate(_byte_level_alphabet())}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": 151643, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
            {"id": 151644, "content": "<|im_start|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
            {"id": 151645, "content": "<|im_end|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": []},
    }


def _latent_stats(channels: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    return {"latents_mean": [round(float(v), 6) for v in rng.normal(0.0, 0.5, channels)],
            "latents_std": [round(float(v), 6) for v in rng.uniform(0.5, 2.0, channels)]}


def write_partition(root: Path, partition: str, dims: Dims, *, sparse: bool) -> None:
    base = root / partition
    _write_json(base / "transformer" / "config.json", {
        "_class_name": "H3Transformer3DModel", "num_layers": REAL.dit_blocks,
        "hidden_size": REAL.dit_hidden, "num_attention_heads": REAL.dit_heads,
        "attention_head_dim": REAL.dit_head_dim, "ffn_dim": REAL.dit_ffn,
        "text_dim": REAL.text_dim, "in_channels": REAL.vae_latent, "patch_size": [1, 2, 2],
        "audio_channels": REAL.audio_channels, "num_refiner_layers": 2, "torch_dtype": "bfloat16",
        "task": partition,
    })
    _write_json(base / "tokenizer" / "tokenizer.json", _tokenizer_json())
    _write_json(base / "tokenizer" / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2TokenizerFast", "model_max_length": 262144,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    _write_json(base / "text_encoder" / "config.json", {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": {"hidden_size": REAL.te_hidden, "intermediate_size": REAL.te_intermediate,
                        "num_hidden_layers": REAL.te_layers, "num_attention_heads": REAL.te_q_heads,
                        "num_key_value_heads": REAL.te_kv_heads, "head_dim": REAL.te_head_dim,
                        "vocab_size": REAL.te_vocab, "rope_theta": 5000000, "rms_norm_eps": 1e-6},
        "vision_config": {"depth": REAL.vis_blocks, "hidden_size": REAL.vis_hidden,
                          "intermediate_size": REAL.vis_intermediate, "patch_size": REAL.vis_patch,
                          "out_hidden_size": REAL.te_hidden, "deepstack_visual_indexes": [8, 16, 24]},
        "torch_dtype": "bfloat16"})
    _write_json(base / "video_vae" / "config.json", {
        "_class_name": "H3VideoVAE", "latent_channels": REAL.vae_latent, "spatial_compression_ratio": 16,
        "temporal_compression_ratio": 4, "decoder_layers": REAL.vae_blocks,
        **_latent_stats(REAL.vae_latent, 24)})
    _write_json(base / "audio_vae" / "config.json", {
        "_class_name": "H3AudioVAE", "latent_dim": REAL.audio_latent, "sampling_rate": 32000,
        "audio_channels": 2, **_latent_stats(REAL.audio_latent, 32)})

    components = [
        ("transformer", transformer_tensors, TRANSFORMER_SHARD_BYTES, "model.safetensors"),
        ("text_encoder", text_encoder_tensors, TEXT_ENCODER_SHARD_BYTES, "model.safetensors"),
        ("video_vae/source", video_vae_tensors, None, "diffusion_pytorch_model.safetensors"),
        ("audio_vae", audio_vae_tensors, None, "diffusion_pytorch_model.safetensors"),
    ]
    for relative, make, limit, single in components:
        real = make(REAL)
        chosen = real if dims is REAL else make(dims)
        write_component(base / relative, real, chosen, shard_limit=limit, single_name=single, sparse=sparse)


def write_fixture_model(path: str | Path, *, realistic: bool = False, ref2va: bool = True) -> Path:
    """Write a model directory h3 (and h3-sim) accept; returns its path.

    `realistic` gives released shapes in sparse files (~134 GiB = 144 GB nominal per partition, no disk
    used); otherwise tiny tensors with real bytes. `ref2va=False` leaves the optional Ref2VA
    partition out (upstream then serves prompt-only and first/last-frame jobs only).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    dims = REAL if realistic else TINY
    partitions: Iterable[str] = ("FL2VA", "Ref2VA") if ref2va else ("FL2VA",)
    for partition in partitions:
        write_partition(root, partition, dims, sparse=realistic)
    return root


def cached_fixture_model(folder: str | Path) -> Path:
    """The tiny fixture model at `folder`, written there first if it is not yet (`h3bridge demo`).

    Written complete under a temporary name beside `folder`, then renamed into place, so an
    interrupted write or two demos starting at once never leave a half model at `folder`: the
    loser of the race removes its own copy and uses the winner's. A folder that is there but is
    not a fixture this version would write (an older layout, a damaged copy) is replaced: it is
    h3bridge's own cache, holding nothing of the user's."""
    import errno
    import os
    import shutil
    import tempfile

    from ..model.inventory import inspect_model
    target = Path(folder)
    if target.is_dir() and not inspect_model(target).errors and _matches_this_version(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write_fixture_model(fresh, ref2va=True)
        (fresh / _VERSION_FILE).write_text(_fixture_version() + "\n")
        if target.exists():
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}-stale-", dir=target.parent))
            try:
                os.rename(target, stale / "model")
            except FileNotFoundError:
                pass                                     # another demo moved it first
            shutil.rmtree(stale, ignore_errors=True)
        from ..safeio.outputs import rename_new
        if not rename_new(fresh, target):                # another demo's copy landed first: use it
            if not (target.is_dir() and _matches_this_version(target)):
                raise OSError(errno.EEXIST, "another copy of the fixture model is in the way", str(target))
    finally:
        if fresh.exists():
            shutil.rmtree(fresh, ignore_errors=True)
    return target


_VERSION_FILE = "h3-sim-fixture-version"


def _fixture_version() -> str:
    """A digest of this module's source: a cached fixture from another version is rewritten."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _matches_this_version(folder: Path) -> bool:
    try:
        return (folder / _VERSION_FILE).read_text().strip() == _fixture_version()
    except OSError:
        return False


def fixture_size_note(root: Path) -> str:
    """The model's size as its files report it (nominal: what h3 and `h3bridge info` see) and,
    when that differs, the disk it really takes (sparse shards), in units that fit the size: a
    tiny fixture is KiB, not "0.0 GB"."""
    from ..model.inventory import format_bytes  # the bridge's one byte formatter (the sim never runs without it)
    files = [p.stat() for p in root.rglob("*") if p.is_file()]
    nominal = sum(f.st_size for f in files)
    on_disk = sum(f.st_blocks * 512 for f in files)
    if on_disk * 2 < nominal:
        return f"{format_bytes(nominal)} nominal in sparse files, {format_bytes(on_disk)} on disk"
    return f"{format_bytes(nominal)}, synthetic weights for h3-sim"

