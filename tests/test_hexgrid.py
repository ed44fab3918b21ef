"""The H3 hex tiling library (h3bridge.hexgrid): pixel -> cell agrees with H3 itself, weights,
merging. No ComfyUI needed."""
from __future__ import annotations

import re
from pathlib import Path

import h3
import numpy as np
import pytest

from h3bridge.errors import RequestError
from h3bridge.hexgrid.grid import DEFAULT_RESOLUTION, hex_grid, pixel_cells, pixel_latlng, usable_resolutions
from h3bridge.hexgrid.merge import chunk_coverage, merge_chunks, mix_audio
from h3bridge.hexgrid.grid import _distance_to

REPO = Path(__file__).resolve().parents[1]


def _h3_cells(xs: np.ndarray, ys: np.ndarray, width: int, height: int, resolution: int) -> list[str]:
    lat, lng = pixel_latlng(xs, ys, width, height)
    return [h3.latlng_to_cell(float(a), float(b), resolution) for a, b in zip(lat, lng)]


def test_the_h3_package_is_ubers_not_anything_in_this_repository() -> None:
    assert not Path(h3.__file__).resolve().is_relative_to(REPO / "h3bridge")
    assert int(h3.__version__.split(".")[0]) >= 4


def test_published_cell_ids() -> None:
    # uber/h3-py readme.md, "Usage": latlng_to_cell(37.769377, -122.388903, 9) == '89283082e73ffff'.
    assert h3.latlng_to_cell(37.769377, -122.388903, 9) == "89283082e73ffff"
    # Snowflake's H3_LATLNG_TO_CELL docs: the Brandenburg Gate at resolution 8 is the 64-bit
    # integer 613036919424548863 (and its string form is what H3_LATLNG_TO_CELL_STRING prints).
    assert h3.str_to_int(h3.latlng_to_cell(52.516262, 13.377704, 8)) == 613036919424548863
    assert h3.latlng_to_cell(52.516262, 13.377704, 8) == "881f1d4887fffff"


def test_a_pixel_maps_to_the_cell_of_its_own_latitude_and_longitude() -> None:
    # On a 3600x1800 frame pixel centres sit on 0.1 degree steps (+0.05): the pixel whose centre
    # is (52.55 N, 13.35 E) is x = (13.35 + 180) / 0.1 - 0.5, y = (90 - 52.55) / 0.1 - 0.5.
    width, height = 3600, 1800
    x, y = 1933, 374
    lat, lng = pixel_latlng(np.array([x]), np.array([y]), width, height)
    assert lat[0] == pytest.approx(52.55) and lng[0] == pytest.approx(13.35)
    # Far east and north: x near the right edge is near +180, y near the top is near +90.
    lat, lng = pixel_latlng(np.array([width - 1]), np.array([0]), width, height)
    assert lng[0] == pytest.approx(179.95) and lat[0] == pytest.approx(89.95)


def test_swapping_latitude_and_longitude_would_be_caught() -> None:
    # A pixel in the far east and north (lng 150, lat 60): its cell is H3's cell of (60, 150).
    width, height, resolution = 720, 360, 1
    grid = hex_grid(width, height, resolution, 0)
    x, y = int((150 + 180) / 0.5), int((90 - 60) / 0.5)      # centre (59.75 N, 150.25 E)
    cell = grid.cells[grid.cell_index[y, x]]
    assert h3.int_to_str(cell) == h3.latlng_to_cell(59.75, 150.25, resolution)
    assert h3.latlng_to_cell(59.75, 150.25, resolution) != h3.latlng_to_cell(150.25 - 180, 59.75, resolution)
    assert h3.int_to_str(cell) != h3.latlng_to_cell(150.25 - 180, 59.75, resolution)


@pytest.mark.parametrize("width, height, resolution", [(1344, 768, 0), (1344, 768, 1), (1344, 768, 2),
                                                       (512, 512, 1), (333, 200, 0)])
def test_pixel_cells_agree_with_h3_on_sampled_pixels(width: int, height: int, resolution: int) -> None:
    ids = pixel_cells(width, height, resolution)
    rng = np.random.default_rng(resolution * 7919 + width)
    xs, ys = rng.integers(0, width, 3000), rng.integers(0, height, 3000)
    # Plus pixels right at cell edges, where a shortcut would go wrong first.
    grid = hex_grid(width, height, resolution, 0)
    edge_y, edge_x = np.nonzero(grid.cell_index[:, :-1] != grid.cell_index[:, 1:])
    pick = rng.choice(len(edge_y), min(3000, len(edge_y)), replace=False)
    xs, ys = np.r_[xs, edge_x[pick], edge_x[pick] + 1], np.r_[ys, edge_y[pick], edge_y[pick]]
    expected = _h3_cells(xs, ys, width, height, resolution)
    assert [h3.int_to_str(int(cell)) for cell in ids[ys, xs]] == expected
    assert [grid.cell_names[i] for i in grid.cell_index[ys, xs]] == expected


@pytest.mark.parametrize("width, height, resolution", [(240, 120, 0), (700, 350, 1), (150, 75, 0)])
def test_pixel_cells_agree_with_h3_on_every_pixel(width: int, height: int, resolution: int) -> None:
    ys, xs = np.mgrid[0:height, 0:width]
    expected = np.array([h3.str_to_int(c) for c in _h3_cells(xs.ravel(), ys.ravel(), width, height, resolution)])
    assert np.array_equal(pixel_cells(width, height, resolution).ravel(), expected)


def test_grid_cells_ids_boxes_neighbours_and_pentagons() -> None:
    grid = hex_grid(1344, 768, DEFAULT_RESOLUTION, 8)
    assert DEFAULT_RESOLUTION == 0 and len(grid) == 122 == h3.get_num_cells(0)   # the whole globe
    assert grid.cell_index.dtype == np.int32 and grid.cell_index.shape == (768, 1344)
    assert all(h3.int_to_str(cell) == name and h3.str_to_int(name) == cell
               for cell, name in zip(grid.cells, grid.cell_names))
    assert all(cell > 2**32 for cell in grid.cells)                # really 64-bit ids
    assert len(grid.pentagons) == 12 and all(h3.is_pentagon(grid.cell_names[i]) for i in grid.pentagons)
    for i, box in enumerate(grid.boxes):
        ys, xs = np.nonzero(grid.cell_index == i)
        assert (box.x0, box.y0, box.x1, box.y1) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        assert set(grid.neighbours[i]) == {grid.cells.index(h3.str_to_int(c)) for c in h3.grid_disk(grid.cell_names[i], 1)
                                           if c != grid.cell_names[i]}
        assert len(grid.neighbours[i]) == (5 if i in grid.pentagons else 6)
    # Cells are ordered by their first pixel in raster order.
    firsts = [np.flatnonzero(grid.cell_index.ravel() == i)[0] for i in range(len(grid))]
    assert firsts == sorted(firsts)


def _weight_sum(grid) -> np.ndarray:
    total = np.zeros((grid.height, grid.width), np.float64)
    for patch in grid.patches:
        total[patch.box.slices] += patch.weight
    return total


def _distance_to_other_cells(grid, labels: np.ndarray | None = None) -> np.ndarray:
    """Per pixel: distance (pixel centres) to the nearest pixel with another label (default: of
    another cell), brute force; inf beyond the overlap."""
    index = grid.cell_index if labels is None else labels
    best = np.full(index.shape, np.inf)
    reach = grid.overlap_px + 2
    padded = np.pad(index, reach, mode="edge")
    for dy in range(-reach, reach + 1):
        for dx in range(-reach, reach + 1):
            shifted = padded[reach + dy:reach + dy + index.shape[0], reach + dx:reach + dx + index.shape[1]]
            other = shifted != index
            best = np.where(other, np.minimum(best, np.hypot(dx, dy)), best)
    # `edge` padding repeats frame-edge pixels: they are the frame's own pixels, so this is exact.
    return best


@pytest.mark.parametrize("resolution, overlap", [(0, 8), (1, 4), (0, 0)])
def test_weights_sum_to_one_and_are_one_deep_inside_cells(resolution: int, overlap: int) -> None:
    grid = hex_grid(960, 480, resolution, overlap)
    assert np.allclose(_weight_sum(grid), 1.0, atol=1e-6)
    distance = _distance_to_other_cells(grid)
    own = np.zeros((grid.height, grid.width), np.float32)
    for patch in grid.patches:
        mine = grid.cell_index[patch.box.slices] == patch.cell
        own[patch.box.slices][mine] = patch.weight[mine]
    deep = distance >= overlap + 0.5
    assert deep.mean() > 0.2 and np.all(own[deep] == 1.0)
    if overlap:
        assert own[~deep].min() < 0.75                              # ... but shares its edge pixels


def test_distance_transform_is_exact_within_its_reach() -> None:
    rng = np.random.default_rng(3)
    mask = rng.random((40, 50)) < 0.01
    mask[20, 25] = True
    ys, xs = np.nonzero(mask)
    grid_y, grid_x = np.mgrid[0:40, 0:50]
    brute = np.min(np.hypot(grid_y[..., None] - ys, grid_x[..., None] - xs), axis=-1)
    fast = _distance_to(mask, 7)
    near = brute <= 7
    assert np.allclose(fast[near], brute[near]) and np.all(fast[~near] > 7)


def test_merging_copies_of_one_video_returns_it() -> None:
    grid = hex_grid(480, 240, 1, 6)
    video = np.random.default_rng(5).random((3, 240, 480, 3), dtype=np.float32)
    for copies in (1, 2, 5, len(grid)):
        merged = merge_chunks(grid, [video] * copies)
        assert merged.shape == video.shape and np.abs(merged - video).max() <= 1 / 255


def test_two_constant_videos_change_only_in_the_overlap_bands_along_hexagon_edges() -> None:
    grid = hex_grid(480, 240, 0, 8)
    black, white = np.zeros((2, 240, 480, 3), np.float32), np.ones((2, 240, 480, 3), np.float32)
    merged = merge_chunks(grid, [black, white])[0, :, :, 0]
    chunk = grid.cell_index % 2                     # cell i shows chunk i mod 2
    distance = _distance_to_other_cells(grid)
    deep = distance >= grid.overlap_px + 0.5
    assert np.array_equal(merged[deep], chunk[deep].astype(np.float32))
    # (Between two cells of one chunk the weights add up to 1 within float32 rounding.)
    mixed = (merged > 1e-5) & (merged < 1 - 1e-5)
    # The transition lies within the overlap of an edge where cells of the two chunks meet.
    to_other_chunk = _distance_to_other_cells(grid, chunk)
    assert mixed.any() and np.all(to_other_chunk[mixed] < grid.overlap_px + 0.5)
    assert np.all(mixed[to_other_chunk <= 1])      # ... and covers both sides of every such edge


def test_audio_passes_through_or_mixes_by_coverage() -> None:
    grid = hex_grid(480, 240, 0, 8)
    coverage = chunk_coverage(grid, 2)
    assert coverage.sum() == pytest.approx(1.0) and 0.3 < coverage[0] < 0.7
    one = np.ones((1, 2, 100), np.float32)
    same, rate = mix_audio(grid, [one], [32000], 2)
    assert same is one and rate == 32000
    mixed, _ = mix_audio(grid, [one, np.zeros((1, 2, 50), np.float32)], [32000, 32000], 2)
    assert mixed.shape == (1, 2, 100) and np.allclose(mixed, coverage[0])
    with pytest.raises(RequestError, match="sample rates"):
        mix_audio(grid, [one, one], [32000, 44100], 2)
    with pytest.raises(RequestError, match="3 audio inputs for 2"):
        mix_audio(grid, [one, one, one], [1, 1, 1], 2)


def test_merge_refuses_mismatched_batches_and_too_many_chunks() -> None:
    grid = hex_grid(480, 240, 0, 8)
    good = np.zeros((2, 240, 480, 3), np.float32)
    with pytest.raises(RequestError, match="512x240 but the grid is 480x240"):
        merge_chunks(grid, [good, np.zeros((2, 240, 512, 3), np.float32)])
    with pytest.raises(RequestError, match="3 frames"):
        merge_chunks(grid, [good, np.zeros((3, 240, 480, 3), np.float32)])
    with pytest.raises(RequestError, match="123 image batches for a grid of 122 cells") as caught:
        merge_chunks(grid, [good] * 123)
    assert "at most 122" in str(caught.value)


def test_unusable_settings_name_the_usable_range() -> None:
    assert usable_resolutions(1344, 768) == range(0, 3)
    with pytest.raises(RequestError, match="resolution 3 gives cells about 4.0 px") as caught:
        hex_grid(1344, 768, 3, 2)
    assert "use resolution 0..2 for 1344x768" in str(caught.value) and caught.value.field == "resolution"
    with pytest.raises(RequestError, match="not an H3 resolution"):
        hex_grid(1344, 768, 16, 2)
    with pytest.raises(RequestError, match="too small") as caught:
        hex_grid(64, 32, 0, 0)
    assert "at least about" in str(caught.value)
    with pytest.raises(RequestError, match="overlap 20 px is outside 0..10") as caught:
        hex_grid(1344, 768, 2, 20)
    assert caught.value.field == "overlap_px"
    with pytest.raises(RequestError, match="whole number"):
        hex_grid(1344, 768, 1.5, 2)   # type: ignore[arg-type]


def _never_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    from h3bridge.hexgrid import grid as grid_module

    def computed(*args):
        raise AssertionError("the grid was computed before the settings were refused")
    monkeypatch.setattr(grid_module, "pixel_cells", computed)


@pytest.mark.parametrize("width, height, resolution", [
    (40000, 20000, 0),       # ~48 GiB: a MemoryError under a 3 GiB cap, the machine down without one
    (8000, 4000, 3),         # a frame that fits at resolution 0 but not with finer cells
    pytest.param(10**30, 768, 0, id="10**30x768"),      # was a ValueError from numpy
    pytest.param(768, 10**400, 0, id="768x10**400"),    # past float's range
])
def test_grids_that_would_not_fit_in_memory_are_refused_up_front(monkeypatch: pytest.MonkeyPatch, width: int,
                                                                 height: int, resolution: int) -> None:
    """Issue 19 item 9."""
    _never_computed(monkeypatch)
    with pytest.raises(RequestError) as caught:
        hex_grid(width, height, resolution)
    assert caught.value.field in ("width", "height") and caught.value.hint
    assert "GiB" in caught.value.message or "longer than any frame" in caught.value.message


def test_the_memory_estimate_is_not_below_what_a_grid_takes() -> None:
    """grid_bytes against the real thing: tracemalloc's peak while grids are computed."""
    import tracemalloc

    from h3bridge.hexgrid.grid import _hex_grid, grid_bytes
    for width, height, resolution, overlap in ((480, 240, 0, 8), (480, 240, 1, 4), (600, 300, 2, 2)):
        tracemalloc.start()
        try:
            _hex_grid.__wrapped__(width, height, resolution, overlap)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak <= grid_bytes(width, height, resolution, overlap), (width, height, resolution, overlap, peak)


def _suggestions(hint: str) -> list[tuple[int, int, int | None]]:
    """The (width, height, resolution) settings a hint suggests."""
    found = [(int(w), int(h), None) for w, h in re.findall(r"frame of (?:at least )?(?:about )?(\d+)x(\d+)", hint)]
    for w, h in re.findall(r"for (\d+)x(\d+)", hint):
        first, last = map(int, re.search(r"resolution (\d+)\.\.(\d+)", hint).groups())
        found += [(int(w), int(h), r) for r in range(first, last + 1)]
    return found


@pytest.mark.parametrize("width, height, resolution", [
    (1000000, 1, 0), (1, 1000000, 0), (64, 32, 0), (3, 2, 0), (40000, 20000, 0),
    pytest.param(10**30, 768, 0, id="10**30x768"),
    (8000, 4000, 3), (8000, 4000, 1), (1344, 768, 3), (2**20 + 1, 2**20 + 1, 0),
])
def test_every_suggested_fix_is_itself_valid(width: int, height: int, resolution: int) -> None:
    """The hint for 1000000x1 was a frame of 72152505x36076252."""
    from h3bridge.hexgrid.grid import DEFAULT_OVERLAP_PX, check_grid_settings, max_overlap_px
    with pytest.raises(RequestError) as caught:
        check_grid_settings(width, height, resolution, DEFAULT_OVERLAP_PX)
    suggested = _suggestions(caught.value.hint or "")
    assert suggested, caught.value.hint
    for columns, rows, suggested_resolution in suggested:
        chosen = resolution if suggested_resolution is None else suggested_resolution
        if "for resolution" not in (caught.value.hint or "") and suggested_resolution is None:
            chosen = DEFAULT_RESOLUTION
        check_grid_settings(columns, rows, chosen, min(DEFAULT_OVERLAP_PX, max_overlap_px(columns, rows, chosen)))


def test_grids_are_cached_read_only_and_deterministic() -> None:
    first = hex_grid(400, 200, 1, 4)
    assert hex_grid(400, 200, 1, 4) is first
    assert not first.cell_index.flags.writeable and not first.patches[0].weight.flags.writeable
    from h3bridge.hexgrid.grid import _hex_grid
    rebuilt = _hex_grid.__wrapped__(400, 200, 1, 4)
    assert rebuilt.cells == first.cells and np.array_equal(rebuilt.cell_index, first.cell_index)
    assert all(np.array_equal(a.weight, b.weight) for a, b in zip(rebuilt.patches, first.patches))


def test_mask_batches_are_refused_before_they_would_exhaust_memory() -> None:
    small = hex_grid(480, 240, 0, 8)
    masks = small.masks()
    assert masks.shape == (122, 240, 480) and np.array_equal(masks.sum(axis=0), np.ones((240, 480)))
    assert np.array_equal(masks[5] == 1, small.cell_index == 5)
    big = hex_grid(1344, 768, 1, 8)
    with pytest.raises(RequestError, match="842 cell masks of 1344x768 would take 3.2 GiB") as caught:
        big.check_masks_fit()
    assert "use resolution 0 or lower" in str(caught.value)
    hex_grid(1344, 768, 0, 8).check_masks_fit()      # 122 masks: 0.5 GiB


def test_the_library_imports_no_comfyui_or_torch() -> None:
    import subprocess
    import sys
    code = ("import sys, h3bridge.hexgrid, h3bridge.cli.hexgrid; "
            "print([m for m in ('torch', 'comfy', 'comfy_api', 'folder_paths') if m in sys.modules])")
    assert subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip() == "[]"
