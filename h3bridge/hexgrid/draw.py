"""A picture of a tiling: each cell in a colour none of its neighbours has, blended across the
overlap bands exactly as `merge_chunks` blends videos, with the hexagon edges drawn dark."""
from __future__ import annotations

import numpy as np

from .grid import HexGrid

# Light, distinct colours; H3 cells have at most 6 neighbours, so 7 always suffice.
_PALETTE = np.array([[0.98, 0.75, 0.45], [0.55, 0.80, 0.95], [0.70, 0.90, 0.55], [0.95, 0.60, 0.70],
                     [0.80, 0.70, 0.95], [0.95, 0.90, 0.50], [0.55, 0.90, 0.85], [0.85, 0.85, 0.85]],
                    np.float32)
_EDGE = np.array([0.12, 0.12, 0.14], np.float32)


def cell_colours(grid: HexGrid) -> np.ndarray:
    """int [cells]: a palette slot per cell, different from every neighbour's (greedy, in cell order)."""
    slots = np.full(len(grid), -1, np.int64)
    for cell, neighbours in enumerate(grid.neighbours):
        taken = {int(slots[other]) for other in neighbours}
        slots[cell] = next(slot for slot in range(len(_PALETTE)) if slot not in taken)
    return slots


def edge_pixels(grid: HexGrid) -> np.ndarray:
    """bool [H, W]: pixels whose right or lower neighbour is in another cell."""
    index = grid.cell_index
    edges = np.zeros(index.shape, bool)
    edges[:, :-1] |= index[:, :-1] != index[:, 1:]
    edges[:-1, :] |= index[:-1, :] != index[1:, :]
    return edges


def draw_tiling(grid: HexGrid) -> np.ndarray:
    """float32 [H, W, 3] in 0..1."""
    colours = _PALETTE[cell_colours(grid)]
    picture = np.zeros((grid.height, grid.width, 3), np.float32)
    for patch in grid.patches:
        picture[patch.box.slices] += patch.weight[:, :, None] * colours[patch.cell]
    picture[edge_pixels(grid)] = _EDGE
    return np.clip(picture, 0.0, 1.0)


__all__ = ["cell_colours", "edge_pixels", "draw_tiling"]
