"""Hexagonal tiling of video frames on Uber's H3 grid (the PyPI `h3` package), with blend
weights for merging tiles along hexagon edges. No ComfyUI here: the nodes in
h3bridge/comfy/hex_nodes.py only translate ComfyUI's tensors to these numpy functions."""
from __future__ import annotations

from .draw import draw_tiling
from .grid import (
    DEFAULT_OVERLAP_PX,
    DEFAULT_RESOLUTION,
    MIN_CELL_PX,
    HexGrid,
    PixelBox,
    WeightPatch,
    cell_size_px,
    check_grid_settings,
    hex_grid,
    max_overlap_px,
    pixel_cells,
    pixel_latlng,
    usable_resolutions,
)
from .merge import chunk_coverage, chunk_for_cell, merge_chunks, mix_audio

__all__ = ["HexGrid", "PixelBox", "WeightPatch", "hex_grid", "check_grid_settings", "usable_resolutions", "cell_size_px",
           "max_overlap_px", "pixel_latlng", "pixel_cells", "DEFAULT_RESOLUTION", "DEFAULT_OVERLAP_PX",
           "MIN_CELL_PX", "draw_tiling", "chunk_for_cell", "chunk_coverage", "merge_chunks", "mix_audio"]
