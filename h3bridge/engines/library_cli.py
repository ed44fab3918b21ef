"""The command line's side of the library engine: `h3bridge generate --engine library
--library-path PATH [--h3-dir DIR] [--preview-dir DIR]` (cli.py registers the flags and calls
`open_library_engine`), and the preview writer that saves one PNG per Euler step.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import RequestError
from ..progress import PreviewFrame
from ..request import GenerationRequest
from .library import LibraryEngine

ENGINE_CHOICES = ("cli", "library")
PREVIEW_PATTERN = "step-{step:04d}.png"


def add_library_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("library engine (libh3 in a worker process)")
    group.add_argument("--engine", choices=ENGINE_CHOICES, default="cli",
                       help="cli: the h3 program (one-shot, or --session); library: libh3 through ctypes in a "
                            "worker (exact frames, denoise previews; needs --library-path or H3_LIBRARY)")
    group.add_argument("--library-path", metavar="PATH",
                       help="libh3.dylib from `h3bridge build-library` (or the test double from h3-sim-lib)")
    group.add_argument("--h3-dir", metavar="DIR",
                       help="the h3.c checkout the worker runs in (h3_shaders.metal); default the library's folder")
    group.add_argument("--preview-dir", metavar="DIR",
                       help="save the denoise preview after every step as DIR/step-0001.png, ... (library engine; "
                            "costs upstream's preview VAE, about 10 GiB more)")


class PreviewWriter:
    """`on_preview` for the CLI: one PNG per step, written under a temporary name and renamed, so
    a viewer never sees half a picture. `note()` is the progress bar's "previews N/M"."""

    def __init__(self, folder: Path, *, overwrite: bool) -> None:
        self.folder = folder.expanduser().absolute()
        self.written = 0
        self.total: int | None = None
        self.last: Path | None = None
        if self.folder.exists() and not self.folder.is_dir():
            raise RequestError(f"the preview folder {self.folder} is a file", field="preview_dir",
                               hint="give a folder for the step previews (--preview-dir)")
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
        temporary = self.folder / f".{target.stem}.{os.getpid()}.tmp.png"
        try:
            write_png(preview.image, temporary)
            os.replace(temporary, target)
        finally:
            if temporary.exists():
                temporary.unlink()
        self.written += 1
        self.total = preview.total_steps
        self.last = target

    def note(self) -> str | None:
        return None if self.total is None else f"previews {self.written}/{self.total}"


def open_library_engine(args: argparse.Namespace, request: GenerationRequest, *,
                        stall_timeout: float | None) -> tuple[LibraryEngine, PreviewWriter | None]:
    """The engine and the preview writer for `generate --engine library`, after the model check and
    the memory plan (with the library's own h3_device facts and, with --preview-dir, the preview VAE)."""
    from ..cli import preflight_generate
    if getattr(args, "session", False):
        raise RequestError("--session is the h3 program's warm mode; the library engine keeps its own worker",
                           field="session", hint="drop --session, or drop --engine library")
    engine = LibraryEngine(args.library_path, args.model_dir, h3_dir=args.h3_dir, stall_timeout=stall_timeout)
    previews = PreviewWriter(Path(args.preview_dir), overwrite=args.overwrite) if args.preview_dir else None
    preflight_generate(request, engine.model_dir, force=getattr(args, "force", False), session=True,
                       machine=engine.machine_facts(), preview=previews is not None)
    return engine, previews


def refuse_preview_without_library(args: argparse.Namespace) -> None:
    if getattr(args, "preview_dir", None) and getattr(args, "engine", "cli") != "library":
        raise RequestError("--preview-dir needs --engine library: the h3 program shows previews only on a terminal",
                           field="preview_dir", hint="add --engine library --library-path PATH, or drop --preview-dir")


__all__ = ["ENGINE_CHOICES", "PreviewWriter", "add_library_options", "open_library_engine",
           "refuse_preview_without_library"]
