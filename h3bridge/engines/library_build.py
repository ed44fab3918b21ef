"""The shared libh3 from an h3.c checkout: the library part of `h3bridge build-engine`
(h3bridge/engine_build runs upstream's make and then this link on macOS, and builds upstream's
code over the portable backend elsewhere). `h3bridge build-library H3C_DIR [-o PATH]`, the command
before build-engine, still runs this part alone: hidden from --help, with a notice naming
build-engine.

Upstream's Makefile builds `h3` and the static `libh3.a` only. On an Apple Silicon Mac this runs
`make libh3.a` in the checkout, links a `.dylib` from the archive with `-Wl,-all_load` (every
object, not only those something references: nothing does yet) and the frameworks and
libraries upstream links `h3` with (the Makefile's CC and LDLIBS, read from make's own database,
so a changed Makefile is followed and nothing of it is written twice here), then checks that
the result is arm64 and that `h3bridge.libh3.load_library` accepts it (in a child process: a
library whose initialisers crash must not take this command down with it).

Anywhere else it says why it cannot (libh3 needs Metal) and points at `h3-sim-lib`, which builds
the C double of libh3 for tests.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import EngineNotFoundError, LibraryBuildError
from ..safeio.outputs import check_output, staged_output
from ..libh3 import _fix_hint

LIBRARY_NAME = "libh3.dylib"
MAKE_TIMEOUT = 3600.0      # a cold build of h3.c takes minutes; this is a safety net
NOT_A_MAC = ("libh3 runs only on Apple Silicon Macs (it is Metal code, and upstream builds it only there), "
             "so it cannot be built on {system}")

Runner = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class MakeVariables:
    """What upstream's Makefile says about linking: its compiler and its LDLIBS."""

    cc: str
    ldlibs: tuple[str, ...]


def check_checkout(h3c_dir: Path) -> Path:
    folder = h3c_dir.expanduser().absolute()
    if not folder.is_dir():
        raise EngineNotFoundError(f"the h3.c checkout {folder} does not exist or is not a folder",
                                  hint="clone it: `git clone https://github.com/antirez/h3.c`")
    missing = [name for name in ("Makefile", "h3.h", "h3_shaders.metal") if not (folder / name).is_file()]
    if missing:
        raise EngineNotFoundError(f"{folder} is not an h3.c checkout (no {', '.join(missing)} in it)",
                                  hint="give the folder `git clone https://github.com/antirez/h3.c` made")
    return folder


def make_program() -> str:
    found = shutil.which("make")
    if found is None:
        raise LibraryBuildError("`make` was not found", hint="install Apple's command line tools: "
                                                            "`xcode-select --install`")
    return found


def make_command(make: str) -> list[str]:
    return [make, "libh3.a"]


def makefile_variables(h3c_dir: Path, make: str, *, run: Runner = subprocess.run) -> MakeVariables:
    """CC and LDLIBS as make expands them (`make -pnq`: print the database, run nothing)."""
    done = run([make, "-pnq", "libh3.a"], cwd=str(h3c_dir), capture_output=True, text=True, timeout=120)
    values: dict[str, str] = {}
    for line in done.stdout.splitlines():
        match = re.match(r"^(CC|LDLIBS) :?= (.*)$", line)
        if match and match[1] not in values:
            values[match[1]] = match[2].strip()
    if "LDLIBS" not in values:
        raise LibraryBuildError(f"upstream's Makefile in {h3c_dir} defines no LDLIBS (h3bridge expects the "
                                "Makefile of antirez/h3.c, pinned 8974cc0)",
                                hint="update the checkout, or report the Makefile change to h3bridge")
    cc = values.get("CC") or "cc"
    return MakeVariables(cc=cc, ldlibs=tuple(values["LDLIBS"].split()))


def link_command(variables: MakeVariables, archive: Path, output: Path) -> list[str]:
    """The .dylib from every object of libh3.a, linked as upstream links `h3`."""
    return [variables.cc, "-dynamiclib", "-arch", "arm64", "-o", str(output),
            f"-Wl,-install_name,@rpath/{LIBRARY_NAME}", "-Wl,-all_load", str(archive), *variables.ldlibs]


def check_command(library: Path) -> list[str]:
    """Load the result the way the library engine's worker will (in a child process)."""
    return [sys.executable, "-c", "import sys; from h3bridge import libh3; libh3.load_library(sys.argv[1])",
            str(library)]


def build_library(h3c_dir: Path, output: Path | None = None, *, run: Runner = subprocess.run,
                  system: str = sys.platform, log: Callable[[str], None] = lambda text: None) -> Path:
    """Build and check `output` (default H3C_DIR/libh3.dylib); returns its path."""
    if system != "darwin":
        raise EngineNotFoundError(NOT_A_MAC.format(system="Linux" if system.startswith("linux") else system),
                                  hint=_fix_hint())     # libh3's one fix: the pinned build-engine steps, h3-sim-lib
    folder = check_checkout(h3c_dir)
    target = (output.expanduser().absolute() if output is not None else folder / LIBRARY_NAME)
    if target.is_dir():
        target = target / LIBRARY_NAME
    # the library replaces the one built before, never a device, FIFO, folder or link: checked before make
    check_output(target, overwrite=True, field="--output", make_parents=False)
    make = make_program()
    log(f"make libh3.a in {folder}")
    done = run(make_command(make), cwd=str(folder), timeout=MAKE_TIMEOUT)
    if done.returncode != 0:
        raise LibraryBuildError(f"`make libh3.a` failed in {folder} (exit {done.returncode}); its errors are above",
                                hint="a plain `make` in the checkout shows the same; upstream builds only on "
                                     "Apple Silicon with Xcode's command line tools")
    variables = makefile_variables(folder, make, run=run)
    with staged_output(target, overwrite=True, field="--output", create=False) as staging:
        temporary = staging.staged
        command = link_command(variables, folder / "libh3.a", temporary)
        log(" ".join(command))
        linked = run(command, cwd=str(folder), capture_output=True, text=True, timeout=600)
        if linked.returncode != 0:
            output_text = (linked.stderr or linked.stdout or "").strip()
            raise LibraryBuildError(f"linking {target.name} failed (exit {linked.returncode}): "
                                    f"{output_text.splitlines()[0] if output_text else 'no output'}",
                                    hint="see compiler_output", compiler_output=output_text)
        from ..libh3 import check_library_file
        check_library_file(temporary)       # an arm64 Mach-O shared library, or the one-sentence error
        loaded = run(check_command(temporary), capture_output=True, text=True, timeout=120)
        if loaded.returncode != 0:
            text = (loaded.stderr or "").strip().splitlines()
            raise LibraryBuildError(f"the linked library does not load: {text[-1] if text else 'no message'}",
                                    hint="see compiler_output", compiler_output=loaded.stderr or "")
        staging.publish()
    return target


__all__ = ["MakeVariables", "build_library", "check_command", "link_command",
           "make_command", "makefile_variables"]

