"""H3 hexagonal tiling of a video frame (Uber's H3 grid through the `h3` package, h3-py v4).

The frame is read as an equirectangular map of the whole globe: 360 degrees of longitude across
the width (pixel centre x=0 is just east of -180), 180 degrees of latitude down the height
(pixel centre y=0 is just south of +90). Every pixel gets the H3 cell holding its centre at the
chosen resolution; each cell gets a blend weight that is 1 inside it and falls smoothly to 0
across `overlap_px` pixels beyond its edge, normalised so the weights at every pixel sum to 1.

What the mapping implies (documented, not fixed):
- Polar stretch: equirectangular pixels shrink to nothing at the poles, so cells near the top
  and bottom rows are drawn much wider than those at the equator, and the two cells holding the
  poles become bands along the top and bottom edges. Cells are sized by their equatorial width.
- Pentagons: H3 has 12 pentagons per resolution (`HexGrid.pentagons`); at resolution 0 all 12
  are in the frame, at finer resolutions the ones whose centres fall in the frame (all of them:
  the frame is the whole globe). They have 5 neighbours instead of 6 and are slightly smaller.
- The antimeridian is the frame's left/right edge. The frame is not wrapped: a cell cut by it
  appears at both edges as one cell (its box spans the width), and blending stops at the edges.

How the per-pixel map is computed without a million scalar calls (h3-py v4 has no vectorised
latlng_to_cell): H3 is asked for the cell of every pixel on a coarse lattice; each cell
edge (a great-circle arc between consecutive `cell_to_boundary` vertices) is traced in pixel
space; a lattice block whose four corners agree and that no edge passes through lies inside one
cell (it is connected and no boundary crosses it), and only the pixels of the other blocks are
asked of H3 one by one. Every pixel's cell is therefore H3's own answer for that pixel centre.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import h3.api.basic_int as h3int   # the PyPI `h3` package (absolute import), 64-bit int cell ids
import h3
import numpy as np

from ..errors import RequestError
from ..fixes import Fix, given

H3_MAX_RESOLUTION = 15
#: Cells narrower than this (in pixels, at the equator) give no useful tiling.
MIN_CELL_PX = 8.0
#: Resolution 0 on 1344x768: the 122 base cells, about 74 px across at the equator (resolution 1
#: gives 842 cells of about 28 px, 2 gives 5882 of about 11 px, 3 is under MIN_CELL_PX).
DEFAULT_RESOLUTION = 0
#: Valid for every usable resolution (cells are at least MIN_CELL_PX across).
DEFAULT_OVERLAP_PX = 8
# h3's authalic Earth radius (average_hexagon_edge_length uses the same one).
_EARTH_RADIUS_KM = 6371.007180918475
_CACHE_SIZE = 8
#: The most memory a batch of cell masks may take (HexGrid.check_masks_fit).
MAX_MASK_BATCH_BYTES = 2 * 2**30
#: The most memory computing one grid may take (grid_bytes), and at most this share of the
#: machine's memory: 40000x20000 would take about 50 GiB.
MAX_GRID_BYTES = 2 * 2**30
GRID_MEMORY_SHARE = 0.25
#: No frame side is longer (a 2**20-pixel side at the smallest usable height is already over
#: MAX_GRID_BYTES); it also keeps every size computation in floats' range.
MAX_SIDE = 2**20
# What hex_grid holds at its peak, with a margin: per pixel the id, index, edge and weight maps;
# per cell its blend patch (float64 while computed, float32 kept, over its box grown by the
# overlap), the samples tracing its edges (more for the stretched cells near the poles) and its
# Python objects. Measured peaks (ru_maxrss): 1344x768 at resolutions 0 and 2 and 2688x1536 at 0
# and 3 with overlap 8 take 60, 214, 52 and 244 bytes per pixel; grid_bytes says 98, 277, 92 and
# 397. tests/test_hexgrid.py checks it against tracemalloc's peak.
_BYTES_PER_PIXEL = 72
_BYTES_PER_PATCH_PIXEL = 24
_BYTES_PER_CELL = 16384


@dataclass(frozen=True)
class PixelBox:
    """A rectangle of pixels: columns x0..x1-1, rows y0..y1-1 (end-exclusive, like slices)."""

    x0: int
    y0: int
    x1: int
    y1: int

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0

    @property
    def slices(self) -> tuple[slice, slice]:
        """(rows, columns), to index an [H, W, ...] array."""
        return slice(self.y0, self.y1), slice(self.x0, self.x1)


@dataclass(frozen=True, eq=False)
class WeightPatch:
    """Cell `cell`'s blend weight (float32, read-only) over `box`."""

    cell: int
    box: PixelBox
    weight: np.ndarray


@dataclass(frozen=True, eq=False)
class HexGrid:
    """The H3 tiling of one frame size. Arrays are read-only (grids are cached and shared).

    cell_index: int32 [height, width], each pixel's position in `cells`.
    cells: the H3 cells present, 64-bit ids as Python ints, in the order of their first pixel
      in raster order (top row first, left to right); `cell_names` holds the same as H3 strings.
    boxes: each cell's pixel bounding box. neighbours: for each cell, the positions in `cells`
      of its grid-disk k=1 neighbours that are in the frame. pentagons: positions of pentagons.
    patches: the blend weights, 0 outside them: a cell has one patch over its box grown by the
      overlap, or one per side for a cell cut by the frame's left/right edge (the antimeridian),
      so no patch spans the frame for nothing. All the weights at a pixel sum to 1.
    """

    width: int
    height: int
    resolution: int
    overlap_px: int
    cell_index: np.ndarray
    cells: tuple[int, ...]
    cell_names: tuple[str, ...]
    boxes: tuple[PixelBox, ...]
    neighbours: tuple[tuple[int, ...], ...]
    pentagons: tuple[int, ...]
    patches: tuple[WeightPatch, ...]

    def __len__(self) -> int:
        return len(self.cells)

    def weight_map(self, cell: int) -> np.ndarray:
        """Cell `cell`'s blend weight over the whole frame, float32 [height, width]."""
        full = np.zeros((self.height, self.width), np.float32)
        for patch in self.patches:
            if patch.cell == cell:
                full[patch.box.slices] = patch.weight
        return full

    def masks(self) -> np.ndarray:
        """One hard 0/1 mask per cell, float32 [cells, height, width], in cell order."""
        return (self.cell_index[None, :, :] == np.arange(len(self.cells), dtype=np.int32)[:, None, None]) \
            .astype(np.float32)

    def masks_nbytes(self) -> int:
        return len(self.cells) * self.width * self.height * 4

    def check_masks_fit(self, limit: int | None = None) -> None:
        """RequestError before `masks()` would allocate more than `limit` bytes (one float32
        frame per cell adds up fast: 842 cells at 1344x768 are 3.2 GiB)."""
        limit = MAX_MASK_BATCH_BYTES if limit is None else limit
        if self.masks_nbytes() <= limit:
            return
        fitting = [r for r in usable_resolutions(self.width, self.height)
                   if h3.get_num_cells(r) * self.width * self.height * 4 <= limit]
        raise RequestError(
            f"{len(self.cells)} cell masks of {self.width}x{self.height} would take "
            f"{self.masks_nbytes() / 2**30:.1f} GiB (the limit is {limit / 2**30:.1f} GiB)", field="resolution",
            hint=(f"use resolution {fitting[-1]} or lower, " if fitting else "") + "a smaller frame, or leave the "
                 "masks unused (the blend weights for merging need no masks)")


# ----------------------------------------------------------------------------- sizes and checks

def pixel_km(width: int, height: int) -> float:
    """The larger side of an equatorial pixel, in km."""
    return max(2 * math.pi * _EARTH_RADIUS_KM / width, math.pi * _EARTH_RADIUS_KM / height)


def cell_size_px(width: int, height: int, resolution: int) -> float:
    """An average hexagon's width (flat side to flat side: sqrt(3) x edge) in pixels at the equator."""
    return math.sqrt(3) * h3.average_hexagon_edge_length(resolution, unit="km") / pixel_km(width, height)


def usable_resolutions(width: int, height: int) -> range:
    """The resolutions whose cells are at least MIN_CELL_PX across on this frame (may be empty)."""
    finest = -1
    for resolution in range(H3_MAX_RESOLUTION + 1):
        if cell_size_px(width, height, resolution) < MIN_CELL_PX:
            break
        finest = resolution
    return range(0, finest + 1)


def max_overlap_px(width: int, height: int, resolution: int) -> int:
    """Overlaps wider than a cell would blend whole cells into their neighbours."""
    return int(cell_size_px(width, height, resolution))


def grid_memory_limit() -> int:
    """The most memory one grid may take on this machine (MAX_GRID_BYTES, less on a small one)."""
    import psutil
    return int(min(MAX_GRID_BYTES, psutil.virtual_memory().total * GRID_MEMORY_SHARE))


def grid_bytes(width: int, height: int, resolution: int, overlap_px: int = DEFAULT_OVERLAP_PX) -> int:
    """About the most memory `hex_grid` takes for these settings (see _BYTES_PER_PIXEL): every
    pixel's maps, and every cell's blend patch (the whole globe is in the frame: all of
    `h3.get_num_cells(resolution)` cells). Sides must be at most MAX_SIDE."""
    side = cell_size_px(width, height, resolution) + 2 * (overlap_px + 1)
    per_cell = _BYTES_PER_CELL + _BYTES_PER_PATCH_PIXEL * side * side
    return int(width * height * _BYTES_PER_PIXEL + h3.get_num_cells(resolution) * per_cell)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise RequestError(f"{name} must be a whole number, got {_shown(value)}", field=name)
    return int(value)


def _shown(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"(a {int(value.bit_length() * 0.30103) + 1}-digit number)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class _GridProblem:
    message: "str | Fix"     # a Fix when it names a setting (h3bridge.fixes)
    field: str
    kind: str          # "side", "memory", "small", "resolution", "overlap"


def _grid_problem(width: int, height: int, resolution: int, overlap_px: int,
                  limit: int) -> _GridProblem | None:
    """What is wrong with these settings (all whole numbers), or None: cheap, nothing computed."""
    if width < 1 or height < 1:
        return _GridProblem(f"the frame must be at least 1x1 pixels, got {_shown(width)}x{_shown(height)}",
                            "width" if width < 1 else "height", "side")
    if width > MAX_SIDE or height > MAX_SIDE:
        name = "width" if width > MAX_SIDE else "height"
        return _GridProblem(Fix(f"{{}} is longer than any frame a grid can be drawn for (at most {MAX_SIDE} pixels)",
                                (given(name, _shown(max(width, height))),)), name, "side")
    if width * height * _BYTES_PER_PIXEL > limit:
        return _GridProblem(f"a {width}x{height} frame ({width * height / 1e6:.0f} megapixels) would take at "
                            f"least {width * height * _BYTES_PER_PIXEL / 2**30:.1f} GiB to tile (the limit is "
                            f"{limit / 2**30:.1f} GiB)", "width", "memory")
    usable = usable_resolutions(width, height)
    if not usable:
        # Resolution 0 has the largest cells: the frame must be big enough for them.
        return _GridProblem(
            f"a {width}x{height} frame is too small for an H3 grid: even resolution 0's cells would be "
            f"{cell_size_px(width, height, 0):.1f} px across (at least {MIN_CELL_PX:g} needed)", "width", "small")
    if not 0 <= resolution <= H3_MAX_RESOLUTION or resolution not in usable:
        if 0 <= resolution <= H3_MAX_RESOLUTION:
            problem = (f"resolution {resolution} gives cells about {cell_size_px(width, height, resolution):.1f} px "
                       f"across on a {width}x{height} frame (at least {MIN_CELL_PX:g} needed)")
        else:
            problem = f"resolution {_shown(resolution)} is not an H3 resolution (0..{H3_MAX_RESOLUTION})"
        return _GridProblem(problem, "resolution", "resolution")
    widest = max_overlap_px(width, height, resolution)
    if not 0 <= overlap_px <= widest:
        return _GridProblem(
            f"overlap {_shown(overlap_px)} px is outside 0..{widest} px for resolution {resolution} on "
            f"{width}x{height} (cells are about {cell_size_px(width, height, resolution):.0f} px across)",
            "overlap_px", "overlap")
    need = grid_bytes(width, height, resolution, overlap_px)
    if need > limit:
        return _GridProblem(
            f"resolution {resolution} on {width}x{height} ({h3.get_num_cells(resolution)} cells) would take about "
            f"{need / 2**30:.1f} GiB to tile (the limit is {limit / 2**30:.1f} GiB)", "resolution", "memory")
    return None


def _suggested_frame(width: int, height: int, resolution: int, overlap_px: int, limit: int, *,
                     prefer_smallest: bool = False) -> tuple[int, int]:
    """A frame of width x height's shape (kept between 1:1 and 4:1; the globe's map is 2:1) on
    which `resolution` and `overlap_px` give a grid within `limit`: as tall as the given one where
    that fits, else the nearest that does (`prefer_smallest`: the smallest that is big enough)."""
    aspect = min(max(min(width, MAX_SIDE) / min(max(height, 1), MAX_SIDE), 1.0), 4.0)

    def frame(rows: int) -> tuple[int, int]:
        return max(1, round(aspect * rows)), rows

    def fits(rows: int) -> bool:
        return _grid_problem(*frame(rows), resolution, overlap_px, limit) is None

    def big_enough(rows: int) -> bool:       # cells at least MIN_CELL_PX across (grows with the frame)
        columns, rows = frame(rows)
        return resolution in usable_resolutions(columns, rows)

    low, high = 1, MAX_SIDE // 4
    while low < high:                        # the smallest frame of this shape big enough
        middle = (low + high) // 2
        low, high = (low, middle) if big_enough(middle) else (middle + 1, high)
    smallest = low
    top = smallest
    while top * 2 <= MAX_SIDE // 4 and fits(top * 2):
        top *= 2
    low, high = top, min(top * 2, MAX_SIDE // 4)
    while low < high:                        # the largest frame of this shape within the limit
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    rows = smallest if prefer_smallest else min(max(min(height, MAX_SIDE), smallest), low)
    return frame(rows if fits(rows) else smallest)


def check_grid_settings(width: int, height: int, resolution: int, overlap_px: int) -> None:
    """RequestError naming the problem and a fix that is itself valid (a usable range, a frame
    that fits), before any work starts; frames and resolutions whose grid would not fit in
    memory (grid_bytes over grid_memory_limit) are refused too."""
    width, height = _check_int("width", width), _check_int("height", height)
    resolution, overlap_px = _check_int("resolution", resolution), _check_int("overlap_px", overlap_px)
    limit = grid_memory_limit()
    problem = _grid_problem(width, height, resolution, overlap_px, limit)
    if problem is None:
        return
    if problem.kind in ("side", "small") or (problem.kind == "memory" and problem.field == "width"):
        small = problem.kind == "small"
        # from sides held to 1..MAX_SIDE: a side of hundreds of digits overflowed the float
        # arithmetic of the suggestion and the refusal became a traceback
        columns, rows = _suggested_frame(min(max(width, 1), MAX_SIDE), min(max(height, 1), MAX_SIDE),
                                         DEFAULT_RESOLUTION, DEFAULT_OVERLAP_PX, limit, prefer_smallest=small)
        hint = f"use a frame of {'at least about ' if small else 'about '}{columns}x{rows} pixels"
    elif problem.kind == "resolution":
        usable = usable_resolutions(width, height)
        fitting = [r for r in usable if _grid_problem(width, height, r, min(overlap_px, max_overlap_px(
            width, height, r)), limit) is None]
        hint = (f"use resolution {fitting[0]}..{fitting[-1]} for {width}x{height} (0 = largest cells)" if fitting
                else f"use resolution {usable.start}..{usable.stop - 1} for {width}x{height} (0 = largest cells)")
    elif problem.kind == "overlap":
        hint = f"use an overlap of 0..{max_overlap_px(width, height, resolution)} px (0 = hard hexagon edges)"
    else:       # this resolution's cells on this frame need too much memory
        coarser = [r for r in range(resolution) if _grid_problem(width, height, r, min(
            overlap_px, max_overlap_px(width, height, r)), limit) is None]
        columns, rows = _suggested_frame(width, height, resolution, overlap_px, limit)
        hint = (f"use resolution {coarser[-1]} or lower on {width}x{height}, or " if coarser else "use ") + \
            f"a frame of about {columns}x{rows} pixels for resolution {resolution}"
        if not coarser:
            problem = replace(problem, field="width")      # even the largest cells: the frame is the problem
    raise RequestError(problem.message, field=problem.field, hint=hint)


# ----------------------------------------------------------------------------- pixel <-> lat/lng

def pixel_latlng(x: np.ndarray, y: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lng) in degrees of pixel centres (x, y); latitude first, as H3 takes them."""
    lng = -180.0 + (np.asarray(x, np.float64) + 0.5) * (360.0 / width)
    lat = 90.0 - (np.asarray(y, np.float64) + 0.5) * (180.0 / height)
    return lat, lng


def _cells_of(lat: np.ndarray, lng: np.ndarray, resolution: int) -> np.ndarray:
    """H3's scalar latlng_to_cell over arrays (int64 ids; H3 ids never set bit 63)."""
    to_cell = h3int.latlng_to_cell
    return np.fromiter((to_cell(a, b, resolution) for a, b in zip(lat.tolist(), lng.tolist())),
                       dtype=np.int64, count=lat.size)


def _unit_vectors(latlng: np.ndarray) -> np.ndarray:
    lat, lng = np.radians(latlng[:, 0]), np.radians(latlng[:, 1])
    return np.stack([np.cos(lat) * np.cos(lng), np.cos(lat) * np.sin(lng), np.sin(lat)], axis=1)


def _pixel_coords(points: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Continuous pixel coordinates (u, v) of unit vectors; pixel (x, y) spans [x, x+1) x [y, y+1)."""
    lng = np.degrees(np.arctan2(points[:, 1], points[:, 0]))
    lat = np.degrees(np.arcsin(np.clip(points[:, 2], -1.0, 1.0)))
    return (lng + 180.0) * (width / 360.0), (90.0 - lat) * (height / 180.0)


def _edge_pixels(cells: list[int], width: int, height: int) -> np.ndarray:
    """bool [H, W]: the pixels every cell edge passes through, grown by one pixel on each side."""
    rings = [_unit_vectors(np.asarray(h3int.cell_to_boundary(cell), np.float64)) for cell in cells]
    starts = np.concatenate(rings)
    ends = np.concatenate([np.roll(ring, -1, axis=0) for ring in rings])
    # Samples along every edge; segments longer than MAX_GAP pixels are split until none is.
    points = np.concatenate([starts, ends])
    edge = np.concatenate([np.arange(len(starts)), np.arange(len(starts))])
    order = np.argsort(edge, kind="stable")
    points, edge = points[order], edge[order]
    max_gap = 0.5
    for _round in range(40):
        u, v = _pixel_coords(points, width, height)
        du = np.abs(np.diff(u))
        du = np.minimum(du, width - du)            # a step across the antimeridian is short
        gap = np.where(edge[1:] == edge[:-1], np.hypot(du, np.diff(v)), 0.0)
        if gap.max() <= max_gap:
            break
        # Split each long segment into `pieces`: normalised chord interpolation stays on the arc.
        pieces = np.maximum(1, np.ceil(gap / (0.8 * max_gap)).astype(np.int64))
        segment = np.repeat(np.arange(len(gap)), pieces)
        first = np.cumsum(pieces) - pieces
        t = (np.arange(segment.size) - first[segment]) / pieces[segment]
        inner = points[segment] * (1 - t)[:, None] + points[segment + 1] * t[:, None]
        inner /= np.linalg.norm(inner, axis=1, keepdims=True)
        # Each segment contributes its start and inner points; each edge's last point is kept.
        last = np.r_[edge[1:] != edge[:-1], True]
        points = np.concatenate([inner, points[last]])
        edge = np.concatenate([edge[segment], edge[last]])
        order = np.argsort(edge, kind="stable")    # segments of one edge stay in order; its end goes last
        points, edge = points[order], edge[order]
    else:   # pragma: no cover - each round at least halves every long segment
        raise RuntimeError("could not trace the H3 cell edges finely enough")
    marked = np.zeros((height, width), bool)
    x = np.clip(np.floor(u).astype(np.int64), 0, width - 1)
    y = np.clip(np.floor(v).astype(np.int64), 0, height - 1)
    marked[y, x] = True
    grown = marked.copy()
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            grown[max(dy, 0):height + min(dy, 0), max(dx, 0):width + min(dx, 0)] |= \
                marked[max(-dy, 0):height - max(dy, 0), max(-dx, 0):width - max(dx, 0)]
    return grown


def _lattice(size: int, step: int) -> np.ndarray:
    return np.unique(np.r_[np.arange(0, size, step), size - 1])


def _lattice_step(width: int, height: int, resolution: int) -> int:
    """Balance lattice calls (W*H/s^2) against per-pixel calls near edges (~1.3 x edge length x s)."""
    cell = cell_size_px(width, height, resolution)
    edge_length = 2.6 * h3.get_num_cells(resolution) * cell     # ~ shared perimeter, polar stretch included
    return int(min(16, max(1, round((width * height / (1.3 * edge_length)) ** (1 / 3)))))


def pixel_cells(width: int, height: int, resolution: int) -> np.ndarray:
    """int64 [H, W]: the H3 cell (64-bit id) of every pixel centre, H3's own answer for each."""
    step = _lattice_step(width, height, resolution)
    xs, ys = _lattice(width, step), _lattice(height, step)
    grid_x, grid_y = np.meshgrid(xs, ys)
    lattice = _cells_of(*pixel_latlng(grid_x.ravel(), grid_y.ravel(), width, height), resolution) \
        .reshape(grid_y.shape)
    # Every cell that can appear: those sampled and their neighbours (their edges bound the samples').
    seen = set(np.unique(lattice).tolist())
    nearby = sorted(seen.union(*(h3int.grid_disk(cell, 1) for cell in seen)))
    edges = _edge_pixels(nearby, width, height)
    # Blocks are the pixels between neighbouring lattice lines, both lines included.
    corners_agree = (lattice[:-1, :-1] == lattice[:-1, 1:]) & (lattice[:-1, :-1] == lattice[1:, :-1]) \
        & (lattice[:-1, :-1] == lattice[1:, 1:])
    table = np.zeros((height + 1, width + 1), np.int64)
    table[1:, 1:] = np.cumsum(np.cumsum(edges, axis=0), axis=1)
    y0, y1 = ys[:-1, None], ys[1:, None] + 1
    x0, x1 = xs[None, :-1], xs[None, 1:] + 1
    crossed = (table[y1, x1] - table[y0, x1] - table[y1, x0] + table[y0, x0]) > 0
    # (check_grid_settings keeps frames many lattice steps wide and tall: there are blocks.)
    inside_one_cell = corners_agree & ~crossed
    block_y = np.clip(np.searchsorted(ys, np.arange(height), side="right") - 1, 0, inside_one_cell.shape[0] - 1)
    block_x = np.clip(np.searchsorted(xs, np.arange(width), side="right") - 1, 0, inside_one_cell.shape[1] - 1)
    result = lattice[:-1, :-1][block_y[:, None], block_x[None, :]]
    unknown = ~inside_one_cell[block_y[:, None], block_x[None, :]]
    unknown[np.ix_(ys, xs)] = False
    result[np.ix_(ys, xs)] = lattice
    ask_y, ask_x = np.nonzero(unknown)
    result[ask_y, ask_x] = _cells_of(*pixel_latlng(ask_x, ask_y, width, height), resolution)
    return result


# ----------------------------------------------------------------------------- weights

def _smoothstep(t: np.ndarray) -> np.ndarray:
    return t * t * (3.0 - 2.0 * t)


def _distance_to(mask: np.ndarray, reach: int) -> np.ndarray:
    """Exact Euclidean distance (pixel centres) from each pixel to the nearest True pixel, for
    distances up to `reach`; farther ones come out larger than `reach` (separable transform:
    column distances first, then the minimum over horizontal offsets within `reach`)."""
    height, width = mask.shape
    far = float(reach + 1)
    rows = np.arange(height, dtype=np.float64)[:, None]
    above = np.maximum.accumulate(np.where(mask, rows, -np.inf), axis=0)
    below = np.minimum.accumulate(np.where(mask, rows, np.inf)[::-1], axis=0)[::-1]
    vertical = np.minimum(np.minimum(rows - above, below - rows), far)
    column = vertical * vertical
    squared = column.copy()
    for dx in range(1, min(reach, width - 1) + 1):
        shift = dx * dx
        np.minimum(squared[:, dx:], column[:, :-dx] + shift, out=squared[:, dx:])
        np.minimum(squared[:, :-dx], column[:, dx:] + shift, out=squared[:, :-dx])
    return np.sqrt(squared)


def _cell_boxes(cell_index: np.ndarray, count: int) -> list[PixelBox]:
    height, width = cell_index.shape
    rows = np.broadcast_to(np.arange(height, dtype=np.int32)[:, None], cell_index.shape).ravel()
    cols = np.broadcast_to(np.arange(width, dtype=np.int32)[None, :], cell_index.shape).ravel()
    flat = cell_index.ravel()
    low_x, low_y = np.full(count, width, np.int32), np.full(count, height, np.int32)
    high_x, high_y = np.full(count, -1, np.int32), np.full(count, -1, np.int32)
    np.minimum.at(low_x, flat, cols)
    np.minimum.at(low_y, flat, rows)
    np.maximum.at(high_x, flat, cols)
    np.maximum.at(high_y, flat, rows)
    return [PixelBox(int(a), int(b), int(c) + 1, int(d) + 1) for a, b, c, d in zip(low_x, low_y, high_x, high_y)]


def _column_runs(cell_index: np.ndarray, cell: int, box: PixelBox) -> list[PixelBox]:
    """The cell's box, split where whole columns of it hold none of its pixels (a cell cut by the
    antimeridian sits at both frame edges); each part shrunk to the rows it uses."""
    inside = cell_index[box.slices] == cell
    used = np.flatnonzero(inside.any(axis=0))
    breaks = np.flatnonzero(np.diff(used) > 1)
    parts = []
    for first, last in zip(np.r_[used[0], used[breaks + 1]], np.r_[used[breaks], used[-1]]):
        rows = np.flatnonzero(inside[:, first:last + 1].any(axis=1))
        parts.append(PixelBox(box.x0 + int(first), box.y0 + int(rows[0]), box.x0 + int(last) + 1,
                              box.y0 + int(rows[-1]) + 1))
    return parts


def _blend_weights(cell_index: np.ndarray, boxes: list[PixelBox], overlap_px: int) -> list[WeightPatch]:
    """Per cell: 1 on its pixels, smoothstep(1 - e / overlap) at e = distance beyond its edge
    (half a pixel past its outermost pixel centres), 0 from `overlap_px` on; then normalised."""
    height, width = cell_index.shape
    reach = math.ceil(overlap_px + 0.5) if overlap_px > 0 else 0
    raw: list[tuple[int, PixelBox, np.ndarray]] = []
    total = np.zeros((height, width), np.float64)
    for cell, box in enumerate(boxes):
        for part in _column_runs(cell_index, cell, box):
            grown = PixelBox(max(part.x0 - reach, 0), max(part.y0 - reach, 0),
                             min(part.x1 + reach, width), min(part.y1 + reach, height))
            inside = cell_index[grown.slices] == cell
            if overlap_px > 0:
                beyond = _distance_to(inside, reach) - 0.5
                weight = np.where(inside, 1.0, _smoothstep(np.clip(1.0 - beyond / overlap_px, 0.0, 1.0)))
            else:
                weight = inside.astype(np.float64)
            total[grown.slices] += weight
            raw.append((cell, grown, weight))
    patches = []
    for cell, grown, weight in raw:
        normalised = (weight / total[grown.slices]).astype(np.float32)
        normalised.flags.writeable = False
        patches.append(WeightPatch(cell, grown, normalised))
    return patches


# ----------------------------------------------------------------------------- the grid

def hex_grid(width: int, height: int, resolution: int = DEFAULT_RESOLUTION,
             overlap_px: int = DEFAULT_OVERLAP_PX) -> HexGrid:
    """The H3 tiling of a width x height frame (see the module docstring); cached, read-only.

    RequestError (before any work) when the frame, the resolution or the overlap gives no useful
    grid; the message names the usable range for that frame size."""
    check_grid_settings(width, height, resolution, overlap_px)
    return _hex_grid(int(width), int(height), int(resolution), int(overlap_px))


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _hex_grid(width: int, height: int, resolution: int, overlap_px: int) -> HexGrid:
    ids = pixel_cells(width, height, resolution)
    unique, first, inverse = np.unique(ids.ravel(), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")              # raster order of each cell's first pixel
    position = np.empty(len(order), np.int32)
    position[order] = np.arange(len(order), dtype=np.int32)
    cell_index = position[inverse.ravel()].reshape(height, width)
    cell_index.flags.writeable = False
    cells = tuple(int(cell) for cell in unique[order])
    where = {cell: i for i, cell in enumerate(cells)}
    neighbours = tuple(tuple(sorted(where[other] for other in h3int.grid_disk(cell, 1)
                                    if other != cell and other in where)) for cell in cells)
    boxes = _cell_boxes(cell_index, len(cells))
    patches = _blend_weights(cell_index, boxes, overlap_px)
    return HexGrid(
        width=width, height=height, resolution=resolution, overlap_px=overlap_px, cell_index=cell_index,
        cells=cells, cell_names=tuple(h3.int_to_str(cell) for cell in cells), boxes=tuple(boxes),
        neighbours=neighbours, pentagons=tuple(i for i, cell in enumerate(cells) if h3int.is_pentagon(cell)),
        patches=tuple(patches))


__all__ = ["HexGrid", "PixelBox", "WeightPatch", "hex_grid", "check_grid_settings", "usable_resolutions", "cell_size_px",
           "grid_bytes", "grid_memory_limit", "MAX_GRID_BYTES",
           "max_overlap_px", "pixel_latlng", "pixel_cells", "DEFAULT_RESOLUTION", "DEFAULT_OVERLAP_PX",
           "MIN_CELL_PX"]
