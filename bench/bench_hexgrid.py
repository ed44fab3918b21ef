"""Benchmark: building the H3 hex grid of a frame, cold and from the cache, in one run.

    python bench/bench_hexgrid.py [--width 1344] [--height 768] [--resolution 0] [--overlap 8] [--repeat 3]

Cold: the cache is cleared before each build (pixel -> cell map, neighbours, blend weights).
Cached: the same call again (functools.lru_cache). Also shows how many H3 scalar calls the
cold build makes against one per pixel, and the time of one merge of two 24-frame clips.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from h3bridge.hexgrid.grid import DEFAULT_OVERLAP_PX, DEFAULT_RESOLUTION, hex_grid  # noqa: E402
from h3bridge.hexgrid.merge import merge_chunks
from h3bridge.hexgrid import grid as grid_module  # noqa: E402


def timed(function, repeat: int, before=lambda: None) -> list[float]:
    seconds = []
    for _ in range(repeat):
        before()
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--resolution", type=int, default=DEFAULT_RESOLUTION)
    parser.add_argument("--overlap", type=int, default=DEFAULT_OVERLAP_PX)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    build = lambda: hex_grid(args.width, args.height, args.resolution, args.overlap)  # noqa: E731

    calls = [0]
    scalar = grid_module._cells_of

    def counting(lat, lng, resolution):
        calls[0] += lat.size
        return scalar(lat, lng, resolution)

    grid_module._cells_of = counting
    cold = timed(build, args.repeat, before=grid_module._hex_grid.cache_clear)
    grid_module._cells_of = scalar
    per_build_calls = calls[0] // args.repeat
    cached = timed(build, max(args.repeat, 1000))
    grid = build()
    clip = np.random.default_rng(0).random((24, args.height, args.width, 3), dtype=np.float32)
    merge = timed(lambda: merge_chunks(grid, [clip, 1 - clip]), args.repeat)

    cold_s, cached_s = statistics.median(cold), statistics.median(cached)
    print(f"grid {args.width}x{args.height} resolution {args.resolution} overlap {args.overlap}: "
          f"{len(grid)} cells, {len(grid.patches)} weight patches")
    print(f"  cold build   {cold_s * 1000:9.1f} ms (median of {len(cold)}), {per_build_calls} H3 calls "
          f"for {args.width * args.height} pixels ({per_build_calls / (args.width * args.height):.0%})")
    print(f"  cached       {cached_s * 1e6:9.2f} us (median of {len(cached)})")
    print(f"  cold/cached  {cold_s / cached_s:9.0f}x")
    print(f"  merge 2 x 24 frames {statistics.median(merge) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
