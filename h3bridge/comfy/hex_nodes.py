"""ComfyUI V3 nodes for the H3 hexagon tiling (Uber's H3 grid, h3bridge.hexgrid).

They only translate: ComfyUI IMAGE [B, H, W, C] / MASK [B, H, W] tensors and AUDIO dicts to the
library's numpy arrays and back. Registered by H3BridgeExtension in nodes.py.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
from comfy_api.latest import io

from ..hexgrid.grid import DEFAULT_OVERLAP_PX, DEFAULT_RESOLUTION, HexGrid, hex_grid
from ..hexgrid.draw import draw_tiling
from ..hexgrid.merge import check_chunk_count, merge_chunks, mix_audio
from ..request import DEFAULT_HEIGHT, DEFAULT_WIDTH
from . import adapter
from .shared import CATEGORY, running_prompt, to_numpy, user_facing_errors

H3Cells = io.Custom("H3_CELLS")
MASKS_OUTPUT_INDEX = 0
MAX_CHUNKS = 64           # image inputs on H3 Hex Merge (Autogrow grows one slot at a time)
_FIXED_SLOTS = 8          # without Autogrow (older ComfyUI): this many optional inputs


def _grown_inputs(kind: Any, name: str, prefix: str, minimum: int, tooltip: str) -> list[io.Input]:
    """image_0, image_1, ...: an Autogrow list where ComfyUI has one, else fixed optional slots."""
    if hasattr(io, "Autogrow"):
        template = io.Autogrow.TemplatePrefix(kind.Input(prefix.rstrip("_"), tooltip=tooltip), prefix=prefix,
                                              min=minimum, max=MAX_CHUNKS)
        return [io.Autogrow.Input(name, template=template, optional=minimum == 0, tooltip=tooltip)]
    return [kind.Input(f"{prefix}{i}", optional=i >= minimum, tooltip=tooltip) for i in range(_FIXED_SLOTS)]


def _connected(values: dict[str, Any], name: str, prefix: str) -> list[Any]:
    """The values of an Autogrow group (a dict) or of fixed slots, in slot-number order."""
    group = values.get(name)
    slots = dict(group) if isinstance(group, dict) else {k: v for k, v in values.items() if k.startswith(prefix)}
    number = {key: int(found.group(1)) for key in slots if (found := re.search(r"(\d+)$", key))}
    return [slots[key] for key in sorted(number, key=number.get) if slots[key] is not None]


class H3HexGridNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3HexGrid",
            display_name="H3 Hex Grid",
            category=CATEGORY,
            description="Tile a frame with Uber's H3 hexagons: the frame is a whole-globe latitude/longitude map "
                        "(360 degrees across, 180 down), each pixel in the H3 cell of its centre. Outputs one mask "
                        "per cell (for regional prompting or any mask consumer), a picture of the tiling and the "
                        "grid for H3 Hex Merge. Cells near the top and bottom are stretched wide (the poles); "
                        "12 cells are pentagons. If the masks output is not connected, masks is a single empty "
                        "mask and nothing is allocated for them.",
            inputs=[
                # H3 Generate's default size: the grid fits its clips as they come
                io.Int.Input("width", default=DEFAULT_WIDTH, min=16, max=8192,
                             tooltip="Frame width in pixels; use the width of the videos you will merge."),
                io.Int.Input("height", default=DEFAULT_HEIGHT, min=16, max=8192,
                             tooltip="Frame height in pixels; use the height of the videos you will merge."),
                io.Int.Input("resolution", default=DEFAULT_RESOLUTION, min=0, max=15,
                             tooltip="H3 resolution: 0 = the 122 largest cells (about 48 px across at 864x480, "
                                     "74 px at 1344x768), each step about 2.6x narrower. Usable: 0..1 at 864x480, "
                                     "0..2 at 1344x768."),
                io.Int.Input("overlap", default=DEFAULT_OVERLAP_PX, min=0, max=512,
                             tooltip="Pixels beyond each hexagon edge over which a cell's weight fades to 0 "
                                     "(0 = hard edges); at most a cell's width."),
            ],
            outputs=[
                io.Mask.Output(display_name="masks", tooltip="One 0/1 mask per cell [cells, H, W], in cell order."),
                io.Image.Output(display_name="preview", tooltip="The tiling: cells coloured, blended across the "
                                                                "overlap, edges dark."),
                H3Cells.Output(display_name="cells", tooltip="The grid, for H3 Hex Merge."),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
        )

    @classmethod
    def fingerprint_inputs(cls, **values: Any) -> Any:
        # The cached outputs depend on whether the masks were built; re-run when that changes.
        return adapter.output_is_connected(running_prompt(), cls.hidden.unique_id if cls.hidden else None,
                                           MASKS_OUTPUT_INDEX)

    # No validate_inputs: ComfyUI repeats its message once per input it takes, and the settings are
    # checked together (a resolution too fine for the frame, an overlap wider than a cell): hex_grid
    # checks them when the node runs, before any work, and one bad setting is one report.

    @classmethod
    @user_facing_errors
    def execute(cls, width: int, height: int, resolution: int, overlap: int) -> io.NodeOutput:
        grid = hex_grid(width, height, resolution, overlap)
        hidden = cls.hidden     # None when called outside ComfyUI's executor: build everything
        if adapter.output_is_connected(hidden.prompt if hidden else None, hidden.unique_id if hidden else None,
                                       MASKS_OUTPUT_INDEX):
            grid.check_masks_fit()
            masks = torch.from_numpy(grid.masks())
        else:
            masks = torch.zeros((1, height, width), dtype=torch.float32)
        preview = torch.from_numpy(draw_tiling(grid)[None])
        return io.NodeOutput(masks, preview, grid)


class H3HexMergeNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3HexMerge",
            display_name="H3 Hex Merge",
            category=CATEGORY,
            description="Blend several videos of the same size and length into one along the hexagon edges of "
                        "an H3 Hex Grid: cell i shows image batch i mod N (N = batches connected; one per cell "
                        "gives each cell its own), fading across the grid's overlap. Audio: one input passes "
                        "through, one per image batch is mixed by each batch's share of the frame, none gives "
                        "no audio.",
            inputs=[
                H3Cells.Input("cells", tooltip="The grid from H3 Hex Grid, built at the videos' width and height."),
                *_grown_inputs(io.Image, "images", "image_", 1,
                               "An image batch (video frames) [frames, H, W, 3]; all the same size and frame count."),
                *_grown_inputs(io.Audio, "audio", "audio_", 0,
                               "Optional: one soundtrack (passed through) or one per image batch, in the same order."),
            ],
            outputs=[
                io.Image.Output(display_name="images", tooltip="The merged frames [frames, H, W, 3]."),
                io.Audio.Output(display_name="audio", tooltip="The passed-through or mixed soundtrack (None without audio)."),
            ],
        )

    @classmethod
    @user_facing_errors
    def execute(cls, cells: HexGrid, **values: Any) -> io.NodeOutput:
        images = _connected(values, "images", "image_")
        sounds = _connected(values, "audio", "audio_")
        check_chunk_count(cells, len(images))
        merged = merge_chunks(cells, [to_numpy(image).astype(np.float32, copy=False) for image in images])
        audio = None
        if sounds:
            waveform, rate = mix_audio(cells, [to_numpy(s["waveform"]) for s in sounds],
                                       [int(s["sample_rate"]) for s in sounds], len(images))
            audio = {"waveform": sounds[0]["waveform"] if len(sounds) == 1 else torch.from_numpy(waveform),
                     "sample_rate": rate}
        return io.NodeOutput(torch.from_numpy(np.clip(merged, 0.0, 1.0)), audio)


HEX_NODES: list[type[io.ComfyNode]] = [H3HexGridNode, H3HexMergeNode]

__all__ = ["H3HexGridNode", "H3HexMergeNode", "HEX_NODES", "H3Cells"]
