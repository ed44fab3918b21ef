"""`h3bridge hexgrid`: draw an H3 tiling to a PNG, for a quick look at a frame size and resolution."""
from __future__ import annotations

import argparse
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import MediaError, RequestError
from .flags import int_flag
from ..safeio.outputs import check_output, staged_output
from ..hexgrid.draw import draw_tiling
from ..hexgrid.grid import DEFAULT_OVERLAP_PX, DEFAULT_RESOLUTION, check_grid_settings, hex_grid, usable_resolutions


def add_hexgrid_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hexgrid", help="draw the H3 hexagon tiling of a frame size to a PNG",
        description="Draw the H3 tiling the ComfyUI hex nodes use: the frame is a whole-globe lat/lng map "
                    "(longitude across, latitude down), each cell in its own colour, blended across the "
                    "overlap bands, edges dark. Prints the cell count and the usable resolutions.")
    parser.add_argument("--width", type=int_flag(), required=True, help="frame width in pixels")
    parser.add_argument("--height", type=int_flag(), required=True, help="frame height in pixels")
    parser.add_argument("--resolution", type=int_flag(), default=DEFAULT_RESOLUTION,
                        help=f"H3 resolution (default {DEFAULT_RESOLUTION}, the largest cells; the usable range "
                             "depends on the frame size and is named if you leave it)")
    parser.add_argument("--overlap", type=int_flag(), default=DEFAULT_OVERLAP_PX, metavar="PIXELS",
                        help=f"blend band beyond each hexagon edge (default {DEFAULT_OVERLAP_PX}; 0 = hard edges)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    parser.set_defaults(handler=run_hexgrid)


def run_hexgrid(args: argparse.Namespace) -> int:
    output: Path = args.output
    if output.suffix.lower() != ".png":
        raise RequestError(f"--output {output} is not a .png file name", hint="end the name in .png")
    # never a folder, device, FIFO or link; an existing file only with --overwrite
    target = check_output(output, overwrite=args.overwrite, field="--output")
    check_grid_settings(args.width, args.height, args.resolution, args.overlap)
    # the staged file is claimed now: an unwritable output is found before the grid is computed
    with staged_output(target, overwrite=args.overwrite, field="--output") as staging:
        with progress_lines(f"laying out the resolution {args.resolution} cells over {args.width}x{args.height}"):
            grid = hex_grid(args.width, args.height, args.resolution, args.overlap)
        with progress_lines(f"drawing {len(grid)} cells"):
            _write_png(draw_tiling(grid), staging.staged, output)
            staging.publish()
    usable = usable_resolutions(args.width, args.height)
    print(f"wrote {output}: {args.width}x{args.height}, resolution {grid.resolution}, {len(grid)} cells "
          f"({len(grid.pentagons)} pentagons), overlap {grid.overlap_px} px; usable resolutions "
          f"{usable.start}..{usable.stop - 1}", file=sys.stderr)
    return 0


PROGRESS_LINE_SECONDS = 5.0


@contextmanager
def progress_lines(what: str) -> Iterator[None]:
    """A step that can take many seconds (a fine grid takes half a minute): a line when it starts
    and, while it runs, one every PROGRESS_LINE_SECONDS, so a log or a terminal is never silent
    for long. Progress is a courtesy: a broken stderr turns it off."""
    def say(text: str) -> None:
        try:
            print(f"h3bridge: hexgrid: {text}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    started = time.monotonic()
    finished = threading.Event()

    def tick() -> None:
        while not finished.wait(PROGRESS_LINE_SECONDS):
            say(f"{what} ({time.monotonic() - started:.0f} s)")

    say(what)
    ticker = threading.Thread(target=tick, name="hexgrid-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        finished.set()
        ticker.join()


def _write_png(picture, staged: Path, output: Path) -> None:
    """The PNG under its staging name (safeio.outputs publishes it: nobody sees half a PNG)."""
    from ..media.references import write_png
    try:
        write_png(picture, staged)
    except MediaError:      # the disk filled up while drawing
        raise MediaError(f"--output {output}: the picture could not be written to its folder (is the disk full?)",
                         hint="free space on its disk, or choose another --output") from None


__all__ = ["add_hexgrid_command", "run_hexgrid"]
