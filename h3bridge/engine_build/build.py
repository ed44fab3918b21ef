"""`h3bridge build-engine SOURCE [--json]`: upstream's own `h3` program and shared libh3 from an h3.c
clone or source tarball.

On macOS: upstream's own `make` in the clone (a tarball is first unpacked into the cache), then the
dylib link of `engines/library_build.py`. Elsewhere (Linux): upstream's unmodified C files,
compiled with the portable backend (`portable/`, ours) that stands in for the three Objective-C
files (Metal, Foundation) and the one Accelerate call. Compatibility comes only from include
paths and compiler flags:

- `-I portable/compat -include h3_portable_compat.h`: `<limits.h>` for SSIZE_MAX, Darwin's
  `st_mtimespec` spelled `st_mtim`, and `<Accelerate/Accelerate.h>` declaring vImageScale_ARGB8888
  (which the backend implements);
- `-Dh3_generate=h3_portable_upstream_generate` for h3.c alone, so the backend's `h3_generate`
  (fault injection, then upstream's) is the one the CLI and the library export.

The file lists come from upstream's Makefile (LIB_C and CLI_OBJ), so a new upstream file is
followed. Upstream compiles `h3_shaders.metal` from its working directory at run time; the
portable backend needs no shader but keeps that requirement (a Mac's failure, a Mac's message),
so the build puts upstream's `h3_shaders.metal` beside the program and library, which is where
h3bridge's engines run them from.

Built engines live under `<user cache>/engines/<source hash>/`, keyed by the hash of upstream's
files, the backend's files, the compiler and the flags; a second build of the same source is a
cache hit. Builds run under a file lock and appear by an atomic rename of their folder. The last
two lines printed are the program's and the library's paths (`--json`: one JSON object).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from filelock import FileLock, Timeout

from ..errors import EngineNotFoundError, LibraryBuildError
from ..safeio.paths import open_regular, sha256_regular, symlink_note
from ..safeio.archives import ArchiveError, UnpackLimits, refuse_oversized, unpack_tar
from ..userdirs import cache_dir
from .diagnose import diagnose
from .record import MANIFEST_NAME, commit_of_clone, commit_of_tarball, manifest_commit, record_build

PORTABLE_DIR = Path(__file__).resolve().parent / "portable"
PORTABLE_SOURCES = ("h3_portable_gpu.c", "h3_portable_metal.c", "h3_portable_tokenizer.c",
                    "h3_portable_fault.c", "h3_portable_vimage.c")
PORTABLE_FILES = (*PORTABLE_SOURCES, "h3_portable.h", "h3_portable_fills.inc", "compat/h3_portable_compat.h",
                  "compat/Accelerate/Accelerate.h")
# What an h3.c source folder must hold (the platform headers the backend implements included).
REQUIRED_FILES = ("Makefile", "h3.h", "h3_gpu.h", "h3_metal.h", "h3_tokenizer.h", "main.c", "h3_shaders.metal")
SHADER_FILE = "h3_shaders.metal"
PROGRAM_NAME = "h3"
LIBRARY_NAME = "libh3.so"
BUILD_FORMAT = "h3bridge-portable-engine-1"     # change when the build recipe changes
C_FLAGS = ("-std=c11", "-O1", "-fPIC", "-D_GNU_SOURCE", "-w")
GENERATE_RENAME = "-Dh3_generate=h3_portable_upstream_generate"
LINK_LIBRARIES = ("-ljansson", "-licuuc", "-lm", "-lpthread")
# Caps on a source tarball: upstream's source (8974cc0) is 1.6 MB unpacked in 39 members, so 256 MiB
# and 10,000 members are generous for any future h3.c and still stop a tarball that unpacks to GiB.
SOURCE_LIMITS = UnpackLimits(max_total_bytes=256 << 20, max_members=10_000)
SOURCE_FILE_LIMIT = 64 << 20      # one source file (upstream's largest is well under 1 MiB)
TARBALL_HINT = "give an h3.c clone, or a .tar.gz made by `git archive` of antirez/h3.c"
COMPILE_TIMEOUT = 1800.0
LOCK_TIMEOUT = 3600.0
DEV_PACKAGES_HINT = ("install them: `apt-get install build-essential libjansson-dev libicu-dev` (Debian/Ubuntu), "
                     "`dnf install gcc jansson-devel libicu-devel` (Fedora)")

Log = Callable[[str], None]


@dataclass(frozen=True)
class BuiltEngine:
    """An engine build-engine made: upstream's CLI and its shared library."""

    program: Path
    library: Path
    source_hash: str
    backend: str          # "portable" (Linux, h3bridge's backend) or "metal" (macOS, upstream's make)
    cached: bool

    def to_json(self) -> dict[str, object]:
        fields = asdict(self)
        fields["program"] = str(self.program)
        fields["library"] = str(self.library)
        return fields


# ----------------------------------------------------------------------------- the source

@dataclass(frozen=True)
class UpstreamSource:
    folder: Path
    library_files: tuple[str, ...]      # Makefile LIB_C
    cli_files: tuple[str, ...]          # Makefile CLI_OBJ, as .c


def _makefile_list(text: str, name: str) -> list[str]:
    """The words assigned to `name` (`:=`/`=` then `+=`) in a Makefile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    words: list[str] = []
    for match in re.finditer(rf"^{name}\s*(:=|\+=|=)\s*(.*)$", joined, flags=re.MULTILINE):
        if match[1] != "+=":
            words = []
        words += match[2].split()
    return words


def read_source(folder: Path) -> UpstreamSource:
    folder = folder.expanduser().absolute()
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise EngineNotFoundError(
            f"{folder} is not an h3.c source folder (no {', '.join(missing)} in it)",
            hint="give a clone of https://github.com/antirez/h3.c or its source tarball (`git archive` of a commit)")
    makefile = _read_source_file(folder / "Makefile").decode(errors="replace")
    library = tuple(_makefile_list(makefile, "LIB_C"))
    cli = tuple(re.sub(r"\.o$", ".c", word) for word in _makefile_list(makefile, "CLI_OBJ"))
    absent = [name for name in (*library, *cli) if not (folder / name).is_file()]
    if not library or not cli or absent:
        raise LibraryBuildError(
            f"upstream's Makefile in {folder} does not list the C files h3bridge expects "
            f"({'missing: ' + ', '.join(absent) if absent else 'no LIB_C or CLI_OBJ'})",
            hint="build-engine follows the Makefile of antirez/h3.c (pinned 8974cc0); update the clone, "
                 "or report the Makefile change to h3bridge")
    return UpstreamSource(folder=folder, library_files=library, cli_files=cli)


def _unpack(tarball: Path, into: Path) -> Path:
    """The h3.c folder inside a source tarball, unpacked through safeio/archives.py (tarfile's data
    filter, or its rules by hand on a Python without filters; SOURCE_LIMITS' caps)."""
    try:
        unpack_tar(tarball, into, SOURCE_LIMITS, hint=TARBALL_HINT)
    except ArchiveError as error:
        raise EngineNotFoundError(error.message, hint=error.hint) from None
    except OSError as error:
        raise EngineNotFoundError(f"cannot unpack {tarball} into {into}: {error.strerror or error}",
                                  hint="free some disk in the user cache folder, then run build-engine again") from None
    candidates = [into, *sorted(path for path in into.iterdir() if path.is_dir() and not path.is_symlink())]
    for candidate in candidates:
        if (candidate / "h3.h").is_file():
            return candidate
    raise EngineNotFoundError(f"{tarball} holds no h3.c source folder (no h3.h at its top or one level down)",
                              hint="give a clone of https://github.com/antirez/h3.c or its `git archive` tarball")


def _refuse_source_file(path: Path, kind: str) -> EngineNotFoundError:
    return EngineNotFoundError(f"{path} is {kind}{symlink_note(path)}, not a regular source file: a compiler or "
                               "h3bridge reading it would hang (a FIFO) or never finish (a device)",
                               hint=f"remove it from the h3.c source (`rm {path}`), or give a fresh clone "
                                    "(`git clone https://github.com/antirez/h3.c`)")


def _refuse_tarball(path: Path, kind: str) -> EngineNotFoundError:
    return EngineNotFoundError(f"the h3.c source {path} is {kind}{symlink_note(path)}, not a folder or a tar archive",
                               hint=TARBALL_HINT)


def _read_source_file(path: Path, limit: int = SOURCE_FILE_LIMIT) -> bytes:
    """A file of the h3.c source, through the path reader: only a regular file, at most `limit` bytes."""
    try:
        with open_regular(path, _refuse_source_file) as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise EngineNotFoundError(f"cannot read {path}: {error.strerror or error}",
                                  hint="check the h3.c source folder, or give a fresh clone") from None
    if len(data) > limit:
        raise EngineNotFoundError(f"{path} is larger than {limit >> 20} MiB, far more than any file of h3.c",
                                  hint="give a clone or `git archive` tarball of antirez/h3.c")
    return data


def source_hash(source: UpstreamSource, compiler_identity: str) -> str:
    """What the build depends on: upstream's files, the backend's, the compiler and the recipe."""
    digest = hashlib.sha256(BUILD_FORMAT.encode())
    names = sorted({*source.library_files, *source.cli_files, "Makefile", SHADER_FILE,
                    *(path.name for path in source.folder.glob("*.h"))})
    for name in names:
        digest.update(f"\0upstream/{name}\0".encode())
        digest.update(_read_source_file(source.folder / name))      # never a FIFO or /dev/zero
    for name in PORTABLE_FILES:
        digest.update(f"\0portable/{name}\0".encode())
        digest.update((PORTABLE_DIR / name).read_bytes())
    digest.update(f"\0{compiler_identity}\0{' '.join(C_FLAGS)}\0{' '.join(LINK_LIBRARIES)}".encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- tools

def find_compiler(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    for name in filter(None, (env.get("CC"), "cc", "gcc", "clang")):
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    raise LibraryBuildError("no C compiler was found (looked for $CC, cc, gcc and clang on PATH)",
                            hint=DEV_PACKAGES_HINT)


def compiler_identity(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as error:
        raise LibraryBuildError(f"the C compiler {compiler} does not run: {error.strerror}",
                                hint=DEV_PACKAGES_HINT) from None
    first = (done.stdout or done.stderr).strip().splitlines()
    return f"{compiler} {first[0] if first else ''}"


def check_libraries(compiler: str, work: Path) -> None:
    """The backend's two C libraries (Jansson for JSON, ICU for Unicode) must be installed with
    their headers: one tiny program says so before the long compile starts."""
    probe = work / "h3bridge_probe.c"
    probe.write_text("#include <jansson.h>\n#include <unicode/uchar.h>\n#include <unicode/unorm2.h>\n"
                     "int main(void) { json_t *v = json_null(); json_decref(v); "
                     "return u_charType(0x41) == U_UPPERCASE_LETTER ? 0 : 1; }\n")
    done = subprocess.run([compiler, str(probe), "-o", str(work / "h3bridge_probe"), *LINK_LIBRARIES],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()
        missing = [name for name, marker in (("Jansson (libjansson-dev)", "jansson"), ("ICU (libicu-dev)", "unicode/"),
                                             ("Jansson (libjansson-dev)", "ljansson"), ("ICU (libicu-dev)", "licuuc"))
                   if marker in output]
        what = ", ".join(dict.fromkeys(missing)) or "Jansson and ICU"
        raise LibraryBuildError(f"the portable backend needs {what} with their development headers, "
                                "which the C compiler cannot find", hint=DEV_PACKAGES_HINT, compiler_output=output)


def _run_compiler(command: Sequence[str], what: str, cwd: Path) -> None:
    done = subprocess.run(list(command), cwd=str(cwd), capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
    if done.returncode != 0:
        output = (done.stderr or done.stdout or "").strip()
        first = next((line for line in output.splitlines() if "error" in line), output.splitlines()[0]
                     if output else "no output")
        raise LibraryBuildError(f"compiling {what} failed (exit {done.returncode}): {first}",
                                hint="the compiler's output is above; build-engine supports h3.c as pinned by "
                                     "h3bridge (8974cc0)", compiler_output=output)


# ----------------------------------------------------------------------------- Linux: the portable build

def _compile_portable(source: UpstreamSource, compiler: str, into: Path, log: Log) -> None:
    objects = into / "objects"
    objects.mkdir()
    include = ["-I", str(PORTABLE_DIR / "compat"), "-include", "h3_portable_compat.h", "-I", str(source.folder)]
    jobs: list[tuple[list[str], str]] = []
    for name in (*source.library_files, *source.cli_files):
        extra = [GENERATE_RENAME] if name == "h3.c" else []
        jobs.append(([compiler, *C_FLAGS, *include, *extra, "-c", str(source.folder / name), "-o",
                      str(objects / f"upstream_{Path(name).stem}.o")], f"upstream's {name}"))
    for name in PORTABLE_SOURCES:
        jobs.append(([compiler, *C_FLAGS, "-I", str(source.folder), "-I", str(PORTABLE_DIR), "-c",
                      str(PORTABLE_DIR / name), "-o", str(objects / f"portable_{Path(name).stem}.o")],
                     f"h3bridge's {name}"))
    log(f"compiling {len(jobs)} C files with {compiler}")
    workers = max(1, min(2, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(_run_compiler, command, what, into) for command, what in jobs]:
            future.result()
    library_objects = [str(objects / f"upstream_{Path(name).stem}.o") for name in source.library_files]
    library_objects += [str(objects / f"portable_{Path(name).stem}.o") for name in PORTABLE_SOURCES]
    cli_objects = [str(objects / f"upstream_{Path(name).stem}.o") for name in source.cli_files]
    log(f"linking {PROGRAM_NAME} and {LIBRARY_NAME}")
    _run_compiler([compiler, "-o", str(into / PROGRAM_NAME), *cli_objects, *library_objects, *LINK_LIBRARIES],
                  PROGRAM_NAME, into)
    _run_compiler([compiler, "-shared", f"-Wl,-soname,{LIBRARY_NAME}", "-o", str(into / LIBRARY_NAME),
                   *library_objects, *LINK_LIBRARIES], LIBRARY_NAME, into)
    shutil.rmtree(objects)
    shutil.copy2(source.folder / SHADER_FILE, into / SHADER_FILE)


def _check_built(folder: Path) -> None:
    """The program answers -h and the library loads the way the library engine loads it (each in a
    child process: a crash in an initialiser must not take build-engine down)."""
    program = folder / PROGRAM_NAME
    done = subprocess.run([str(program), "-h"], cwd=str(folder), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise LibraryBuildError(f"the built {PROGRAM_NAME} does not run (`h3 -h` exit {done.returncode})",
                                hint="see compiler_output", compiler_output=done.stderr or "")
    from ..engines.library_build import check_command
    loaded = subprocess.run(check_command(folder / LIBRARY_NAME), capture_output=True, text=True, timeout=120)
    if loaded.returncode != 0:
        text = (loaded.stderr or "").strip().splitlines()
        raise LibraryBuildError(f"the built {LIBRARY_NAME} does not load: {text[-1] if text else 'no message'}",
                                hint="see compiler_output", compiler_output=loaded.stderr or "")


def _engines_dir(cache_root: Path | None = None) -> Path:
    return (cache_root if cache_root is not None else cache_dir()) / "engines"


def _build_portable(folder: Path, log: Log, cache_root: Path | None = None, commit: str | None = None,
                    origin: Path | None = None) -> BuiltEngine:
    """`origin`: what the user gave when it is not `folder` (a tarball unpacked into a temporary
    folder): the record names it, so doctor's fix points at something that still exists."""
    source = read_source(folder)
    given = origin if origin is not None else source.folder
    compiler = find_compiler()
    identity = compiler_identity(compiler)
    digest = source_hash(source, identity)
    engines = _engines_dir(cache_root)
    engines.mkdir(parents=True, exist_ok=True)
    final = engines / digest[:16]
    built = BuiltEngine(program=final / PROGRAM_NAME, library=final / LIBRARY_NAME, source_hash=digest,
                        backend="portable", cached=True)
    if (final / MANIFEST_NAME).is_file():
        record_build(built.program, commit or manifest_commit(final), given, cache_root)
        return built
    try:
        with FileLock(str(engines / f"{digest[:16]}.lock"), timeout=LOCK_TIMEOUT):
            if (final / MANIFEST_NAME).is_file():       # another process built it while we waited
                record_build(built.program, commit or manifest_commit(final), given, cache_root)
                return built
            work = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}.", suffix=".tmp", dir=engines))
            try:
                check_libraries(compiler, work)
                log(f"building upstream h3.c from {source.folder} with h3bridge's portable backend into {final}")
                _compile_portable(source, compiler, work, log)
                for leftover in work.glob("h3bridge_probe*"):
                    leftover.unlink()
                _check_built(work)
                manifest = {"format": BUILD_FORMAT, "source": str(source.folder), "source_hash": digest,
                            "compiler": identity, "flags": list(C_FLAGS), "commit": commit}
                (work / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
                if final.exists():          # a half-made folder from an older, interrupted layout
                    shutil.rmtree(final)
                os.replace(work, final)
            finally:
                if work.exists():
                    shutil.rmtree(work, ignore_errors=True)
    except Timeout:
        raise LibraryBuildError(f"another build of this engine has held {engines / (digest[:16] + '.lock')} "
                                f"for {LOCK_TIMEOUT:.0f} s", hint="wait for it, or stop the other build-engine") from None
    record_build(built.program, commit, given, cache_root)
    return BuiltEngine(program=built.program, library=built.library, source_hash=digest, backend="portable",
                       cached=False)


# ----------------------------------------------------------------------------- macOS: upstream's make

def _build_metal(folder: Path, log: Log, cache_root: Path | None = None, commit: str | None = None) -> BuiltEngine:
    from ..engines.library_build import build_library, make_program
    source = read_source(folder)
    make = make_program()
    log(f"make in {source.folder}")
    # the compiler's errors are read (diagnose.py) as well as shown
    done = subprocess.run([make], cwd=str(source.folder), timeout=COMPILE_TIMEOUT, stderr=subprocess.PIPE, text=True,
                          errors="replace")
    if done.returncode != 0:
        known = diagnose(done.stderr or "", source.folder)
        if known is not None:
            raise LibraryBuildError(f"`make` failed in {source.folder}: {known[0]}", hint=known[1],
                                    compiler_output=done.stderr or "")
        raise LibraryBuildError(f"`make` failed in {source.folder} (exit {done.returncode}); its errors are above",
                                hint="upstream builds only on Apple Silicon with Xcode's command line tools",
                                compiler_output=done.stderr or "")
    if done.stderr:
        print(done.stderr, end="", file=sys.stderr)       # make's warnings, as it would have shown them
    library = build_library(source.folder, log=log)
    record_build(source.folder / PROGRAM_NAME, commit, source.folder, cache_root)
    digest = source_hash(source, "make")
    return BuiltEngine(program=source.folder / PROGRAM_NAME, library=library, source_hash=digest,
                       backend="metal", cached=False)


def build_engine(source: Path, *, system: str = sys.platform, log: Log = lambda text: None,
                 cache_root: Path | None = None) -> BuiltEngine:
    """Build (or find cached) upstream's h3 and shared libh3 from a clone or source tarball.
    Builds are cached under `cache_root`/engines (default: the user cache directory)."""
    source = source.expanduser().absolute()
    if not source.exists():
        raise EngineNotFoundError(f"the h3.c source {source} does not exist",
                                  hint="give a clone (`git clone https://github.com/antirez/h3.c`) or its "
                                       "source tarball")
    if source.is_dir():
        commit = commit_of_clone(source)
        return (_build_metal(source, log, cache_root, commit) if system == "darwin"
                else _build_portable(source, log, cache_root, commit))
    # a tarball: only a regular file is opened (a FIFO would hang the open, /dev/zero never ends)
    with open_regular(source, _refuse_tarball) as probe:
        try:
            refuse_oversized(probe, source, SOURCE_LIMITS, TARBALL_HINT)
        except ArchiveError as error:
            raise EngineNotFoundError(error.message, hint=error.hint) from None
        if not tarfile.is_tarfile(probe):
            raise EngineNotFoundError(f"{source} is neither a folder nor a tar archive", hint=TARBALL_HINT)
    commit = commit_of_tarball(source)
    if system == "darwin":
        # upstream's make builds in place: unpack into the cache, keyed by the archive's bytes
        digest = sha256_regular(source, _refuse_tarball)[:16]
        target = _engines_dir(cache_root) / f"source-{digest}"
        if not (target / "h3.h").is_file() and not any(target.glob("*/h3.h")):
            target.mkdir(parents=True, exist_ok=True)
            _unpack(source, target)
        folder = target if (target / "h3.h").is_file() else next(target.glob("*/h3.h")).parent
        return _build_metal(folder, log, cache_root, commit)
    _engines_dir(cache_root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".source.", dir=_engines_dir(cache_root)) as unpacked:
        return _build_portable(_unpack(source, Path(unpacked)), log, cache_root, commit, origin=source)


__all__ = ["BuiltEngine", "UpstreamSource", "build_engine", "find_compiler",
           "read_source", "source_hash"]
