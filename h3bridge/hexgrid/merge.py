"""Blend separately made videos (one per cell or per chunk) into one along hexagon edges.

Cells map onto chunks as `chunk_for_cell`: with as many chunks as cells, cell i takes chunk i;
with fewer, cell i takes chunk i mod N (chunk 0 the cells 0, N, 2N, ... in cell order). More
chunks than cells are refused: some would never be seen.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import RequestError
from .grid import HexGrid


def chunk_for_cell(cell: int, chunk_count: int) -> int:
    """The chunk whose pixels cell `cell` shows (see the module docstring)."""
    return cell % chunk_count


def check_chunk_count(grid: HexGrid, chunk_count: int, what: str = "image batches") -> None:
    if chunk_count < 1:
        raise RequestError(f"no {what} to merge", hint="connect at least one")
    if chunk_count > len(grid):
        raise RequestError(f"{chunk_count} {what} for a grid of {len(grid)} cells: the extra ones would never be "
                           "shown", hint=f"connect at most {len(grid)} (one per cell), or use a finer resolution")


def chunk_coverage(grid: HexGrid, chunk_count: int) -> np.ndarray:
    """float64 [chunk_count]: each chunk's mean blend weight over the frame (they sum to 1)."""
    check_chunk_count(grid, chunk_count)
    totals = np.zeros(chunk_count, np.float64)
    for patch in grid.patches:
        totals[chunk_for_cell(patch.cell, chunk_count)] += float(patch.weight.sum(dtype=np.float64))
    return totals / (grid.width * grid.height)


def merge_chunks(grid: HexGrid, chunks: Sequence[np.ndarray]) -> np.ndarray:
    """One video float32 [F, H, W, C] from N chunk videos of the same shape: each pixel is the
    weighted sum of the chunks of the cells whose weight reaches it."""
    check_chunk_count(grid, len(chunks))
    arrays = [np.asarray(chunk) for chunk in chunks]
    first = arrays[0]
    for number, array in enumerate(arrays, 1):
        if array.ndim != 4:
            raise RequestError(f"image batch {number} is shaped {list(array.shape)}; expected [frames, height, "
                               "width, channels]")
        if array.shape[1:3] != (grid.height, grid.width):
            raise RequestError(f"image batch {number} is {array.shape[2]}x{array.shape[1]} but the grid is "
                               f"{grid.width}x{grid.height}",
                               hint="build the grid at the size of the images (width x height)")
        if array.shape[0] != first.shape[0] or array.shape[3] != first.shape[3]:
            raise RequestError(f"image batch {number} has {array.shape[0]} frames of {array.shape[3]} channels, "
                               f"image batch 1 has {first.shape[0]} of {first.shape[3]}",
                               hint="merge clips of the same length and channel count")
    merged = np.zeros(first.shape, np.float32)
    for patch in grid.patches:
        rows, cols = patch.box.slices
        chunk = arrays[chunk_for_cell(patch.cell, len(arrays))]
        merged[:, rows, cols] += chunk[:, rows, cols] * patch.weight[None, :, :, None]
    return merged


def mix_audio(grid: HexGrid, waveforms: Sequence[np.ndarray], sample_rates: Sequence[int],
              chunk_count: int) -> tuple[np.ndarray, int]:
    """One soundtrack from one (passed through unchanged) or one per chunk (mixed by each
    chunk's mean blend weight, `chunk_coverage`; shorter ones padded with silence).
    Waveforms are [..., channels, samples] with one sample rate and channel count."""
    if len(waveforms) != len(sample_rates) or not waveforms:
        raise RequestError("no audio to mix")
    if len(waveforms) == 1:
        return np.asarray(waveforms[0]), int(sample_rates[0])
    if len(waveforms) != chunk_count:
        raise RequestError(f"{len(waveforms)} audio inputs for {chunk_count} image batches",
                           hint="connect one audio (passed through) or one per image batch, in the same order")
    if len(set(int(rate) for rate in sample_rates)) != 1:
        raise RequestError(f"the audio inputs have different sample rates ({', '.join(map(str, sample_rates))} Hz)",
                           hint="resample them to one rate first")
    arrays = [np.asarray(wave, np.float32) for wave in waveforms]
    if len({array.shape[:-1] for array in arrays}) != 1:
        raise RequestError("the audio inputs have different channel counts or batch sizes "
                           f"({', '.join(str(list(array.shape[:-1])) for array in arrays)})",
                           hint="convert them to the same channel layout first")
    coverage = chunk_coverage(grid, chunk_count)
    length = max(array.shape[-1] for array in arrays)
    mixed = np.zeros(arrays[0].shape[:-1] + (length,), np.float32)
    for share, array in zip(coverage, arrays):
        mixed[..., :array.shape[-1]] += np.float32(share) * array
    return mixed, int(sample_rates[0])


__all__ = ["chunk_for_cell", "check_chunk_count", "chunk_coverage", "merge_chunks", "mix_audio"]
