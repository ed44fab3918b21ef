"""Component sizes: bytes each phase loads, from the model inventory or upstream's shapes."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..inventory import Component, ModelInventory
from .constants import DIT_BLOCKS, TEXT_LAYERS_USED


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
