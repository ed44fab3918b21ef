"""Builds the libh3 test double (h3bridge/sim/double/) into h3bridge's cache directory.

    path = build_double()        # Path of the shared library; compiles it only when needed
    lib = h3bridge.libh3.load_library(path)

The file name carries a hash of the C sources, the compiler command and the Python headers'
folder, so a changed source (or another Python) builds a new library and an old process keeps
the one it loaded. The build holds a file lock and compiles to a temporary name that is renamed
into place, so parallel test processes never load a half-written library.

Compiler: `$CC` (split into words like make does, never through a shell), else the first of
cc, gcc, clang on PATH. `h3-sim-lib` (console script) builds and prints the path.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from filelock import FileLock

from ..errors import LibraryBuildError
from ..safeio.outputs import staged_output
from ..userdirs import cache_dir

SOURCE_DIR = Path(__file__).resolve().parent / "double"
SOURCES = ("libh3_double.c", "h3_double.h")
COMPILERS = ("cc", "gcc", "clang")
BUILD_TIMEOUT = 300.0   # a safety net only; the double compiles in about a second


def library_suffix() -> str:
    return ".dylib" if sys.platform == "darwin" else ".so"


def build_dir() -> Path:
    return cache_dir() / "libh3-double"


def find_compiler() -> list[str]:
    """The compiler command: $CC's words, else cc/gcc/clang from PATH."""
    configured = os.environ.get("CC", "").strip()
    if configured:
        words = shlex.split(configured)
        if shutil.which(words[0]) is None:
            raise LibraryBuildError(
                f"the C compiler CC={configured!r} was not found",
                hint="set CC to an installed compiler, or unset it to use cc/gcc/clang from PATH")
        return words
    for name in COMPILERS:
        found = shutil.which(name)
        if found:
            return [found]
    raise LibraryBuildError(
        "no C compiler found to build the libh3 double (looked for $CC, cc, gcc, clang on PATH)",
        hint="install one (Debian/Ubuntu: `apt-get install gcc`; macOS: `xcode-select --install`) "
             "or set CC")


def _python_include() -> Path:
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise LibraryBuildError(
            f"Python's C headers are missing (no Python.h in {include}); the libh3 double "
            "calls h3-sim's engine through them",
            hint="install them (Debian/Ubuntu: `apt-get install python3-dev`)")
    return include


def compile_command(compiler: list[str], include: Path, output: Path) -> list[str]:
    command = [*compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-std=c11",
               f"-I{include}", f"-I{SOURCE_DIR}", "-o", str(output), str(SOURCE_DIR / SOURCES[0])]
    if sys.platform == "darwin":
        command[len(compiler):len(compiler)] = ["-undefined", "dynamic_lookup"]   # Python's symbols
    return command


def source_hash(compiler: list[str], include: Path) -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes() + b"\0")
    digest.update("\0".join(compiler).encode() + b"\0" + str(include).encode())
    return digest.hexdigest()[:16]


def build_double(directory: Path | None = None) -> Path:
    """The double's path in `directory` (default: `build_dir()` in the cache), compiled first
    when it is not there yet."""
    compiler = find_compiler()
    include = _python_include()
    folder = Path(directory) if directory is not None else build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"libh3-double-{source_hash(compiler, include)}{library_suffix()}"
    if target.is_file():
        return target
    with FileLock(str(folder / "build.lock"), timeout=BUILD_TIMEOUT):
        if target.is_file():          # another process built it while we waited
            return target
        with staged_output(target, overwrite=True, field="the libh3 double", create=False) as staging:
            command = compile_command(compiler, include, staging.staged)
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
            except OSError as error:
                raise LibraryBuildError(f"cannot run the C compiler {compiler[0]}: {error.strerror}",
                                        hint="install a C compiler or set CC") from None
            if done.returncode != 0:
                output = (done.stderr or done.stdout).strip()
                raise LibraryBuildError(
                    f"the C compiler failed building the libh3 double (exit {done.returncode}): "
                    f"{output.splitlines()[0] if output else 'no output'}",
                    hint="see compiler_output; set CC to another compiler", compiler_output=output)
            staging.publish()
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="h3-sim-lib",
        description="Build h3bridge's libh3 test double (h3.h's API over h3-sim's engine) into "
                    "the cache directory and print its path. Rebuilt only when its C source "
                    "changes.")
    parser.parse_args(argv)
    try:
        path = build_double()
    except LibraryBuildError as error:
        sys.stderr.write(f"h3-sim-lib: {error}\n")
        if error.compiler_output:
            sys.stderr.write(error.compiler_output + "\n")
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
