"""The command line's side of the library engine: `h3bridge generate --engine library
--library-path PATH [--h3-dir DIR] [--preview-dir DIR]` (main.py registers the flags with the
other engine options; engine.engine_from_args opens the engine), and the preview writer that saves one PNG per Euler step.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import RequestError
from ..progress import PreviewFrame
from ..safeio.outputs import kind_of, staged_output

PREVIEW_PATTERN = "step-{step:04d}.png"


def add_library_options(parser: argparse.ArgumentParser) -> None:
    """The library engine's own flags (`--engine library`, which engine.add_engine_choice adds)."""
    group = parser.add_argument_group("library engine (--engine library: libh3 in a worker process)")
    add_library_location_options(group)
    group.add_argument("--preview-dir", metavar="DIR",
                       help="save the denoise preview after every step as DIR/step-0001.png, ... (library engine; "
                            "costs upstream's preview VAE, about 10 GiB more)")


def add_library_location_options(group: argparse._ActionsContainer) -> None:
    """--library-path / --h3-dir: where libh3 and its h3.c checkout are (generate, story, and serve,
    which chooses the library with its own --engine)."""
    group.add_argument("--library-path", metavar="PATH",
                       help="libh3 from `h3bridge build-engine` (or the test double from h3-sim-lib; "
                            "default $H3_LIBRARY)")
    group.add_argument("--h3-dir", metavar="DIR",
                       help="the h3.c checkout the worker runs in (h3_shaders.metal); default the library's folder")


class PreviewWriter:
    """`on_preview` for the CLI: one PNG per step, written under a temporary name and renamed, so
    a viewer never sees half a picture. `note()` is the progress bar's "previews N/M"."""

    def __init__(self, folder: Path, *, overwrite: bool) -> None:
        self.folder = folder.expanduser().absolute()
        self.written = 0
        self.total: int | None = None
        self.last: Path | None = None
        if os.path.lexists(self.folder) and not self.folder.is_dir():
            # a file, a FIFO, a device, a dangling link: said as what it is (safeio.outputs' words)
            raise RequestError(f"the preview folder {self.folder} is {kind_of(self.folder) or 'a file'}",
                               field="preview_dir", hint="give a folder for the step previews (--preview-dir)")
        existing = sorted(self.folder.glob("step-*.png")) if self.folder.is_dir() else []
        if existing and not overwrite:
            raise RequestError(f"the preview folder {self.folder} already holds step previews ({existing[0].name}, ...)",
                               field="preview_dir", hint="choose an empty folder, or allow overwriting (--overwrite)")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RequestError(f"cannot create the preview folder {self.folder}: {error.strerror}",
                               field="preview_dir", hint="choose a folder you can write to") from None
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise RequestError(f"the preview folder {self.folder} is not writable", field="preview_dir",
                               hint="choose a folder you can write to")

    def __call__(self, preview: PreviewFrame) -> None:
        from ..media.references import write_png
        target = self.folder / PREVIEW_PATTERN.format(step=preview.step + 1)
        # existing previews were refused up front unless --overwrite; a step's own PNG replaces
        # only a regular file (safeio.outputs), never a FIFO or link planted under its name
        with staged_output(target, overwrite=True, field="--preview-dir", create=False) as staging:
            write_png(preview.image, staging.staged)
            staging.publish()
        self.written += 1
        self.total = preview.total_steps
        self.last = target

    def note(self) -> str | None:
        return None if self.total is None else f"previews {self.written}/{self.total}"


__all__ = ["PreviewWriter", "add_library_location_options", "add_library_options"]
