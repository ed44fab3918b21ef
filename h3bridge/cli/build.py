"""`h3bridge build-engine` (upstream's own h3 and shared libh3 from a clone or its source archive:
engine_build/build.py) and the hidden `build-library` it replaced (engines/library_build.py)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from ..engine_build.build import build_engine
from ..engines.library_build import LIBRARY_NAME, build_library
from ..errors import LibraryBuildError
from ..runnable import h3bridge_command


def add_build_engine_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build-engine", help="build upstream h3.c's h3 and shared libh3 from a clone or source tarball",
        description="Build upstream h3.c's own `h3` program and shared libh3 from a clone or its source tarball. "
                    "On macOS: upstream's `make`, then libh3.dylib linked from libh3.a. On Linux: upstream's "
                    "unmodified C files over h3bridge's portable (host-memory) backend, for testing against "
                    "upstream's own code; cached by source hash under the user cache directory. The last two "
                    "lines are the program's and the library's paths.")
    parser.add_argument("source", metavar="SOURCE", type=Path, help="an h3.c clone, or its .tar.gz source archive")
    parser.add_argument("--json", action="store_true", help="print one JSON object (program, library, ...) instead")
    parser.set_defaults(handler=run_build_engine)


def run_build_engine(args: argparse.Namespace) -> int:
    if shutil.which(os.environ.get("H3_FFMPEG") or "ffmpeg") is None:
        print("h3bridge: note: ffmpeg was not found; the built h3 needs it to write MP4s and read media "
              "(apt-get install ffmpeg, or set H3_FFMPEG)", file=sys.stderr)
    try:
        built = build_engine(args.source, log=lambda text: print(f"h3bridge: {text}", file=sys.stderr))
    except LibraryBuildError as error:
        if error.compiler_output:
            print(error.compiler_output, file=sys.stderr)
        raise
    if args.json:
        print(json.dumps(built.to_json()))
    else:
        if built.cached:
            print(f"h3bridge: cached build of this source ({built.source_hash[:16]})", file=sys.stderr)
        print(built.program)
        print(built.library)
    return 0



def add_build_library_command(subparsers: argparse._SubParsersAction) -> None:
    # no help=: argparse leaves it out of `h3bridge --help` (cli.HIDDEN_COMMANDS)
    parser = subparsers.add_parser(
        "build-library",
        description="The command before `h3bridge build-engine`, which builds h3 and libh3 together: run `make libh3.a` in an h3.c checkout and link a shared libh3.dylib from it (with the "
                    "frameworks upstream's Makefile links), for `generate --engine library` and ComfyUI's "
                    "library mode. Checks it is arm64 and loads. macOS on Apple Silicon only; elsewhere use "
                    "h3-sim-lib (the test double).")
    parser.add_argument("h3c_dir", metavar="H3C_DIR", type=Path, help="the h3.c checkout")
    parser.add_argument("-o", "--output", type=Path, metavar="PATH",
                        help=f"where the library goes (default H3C_DIR/{LIBRARY_NAME}, beside h3_shaders.metal, "
                             "which the library engine's worker runs next to)")
    parser.set_defaults(handler=run_build_library)


def run_build_library(args: argparse.Namespace) -> int:
    print(f"h3bridge: notice: build-library is now build-engine: `{h3bridge_command('build-engine', str(args.h3c_dir))}` "
          "builds h3 and the shared libh3 together (on any platform) and prints both paths; build-library still "
          "builds the library alone for now", file=sys.stderr)
    try:
        path = build_library(args.h3c_dir, args.output, log=lambda text: print(f"h3bridge: {text}", file=sys.stderr))
    except LibraryBuildError as error:
        if error.compiler_output:
            print(error.compiler_output, file=sys.stderr)
        raise
    print(path)
    return 0


__all__ = ["add_build_engine_command", "add_build_library_command", "run_build_engine", "run_build_library"]
