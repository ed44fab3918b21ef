"""The selftest's facts: what this machine is and where h3bridge found each part it needs.

The same finders `generate` and `doctor` use (engines/locate.py, engines/library.py,
model/verify.py), so a fact here is what a render would use.
"""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import H3BridgeError
from ..model.memory import MachineFacts
from .report import Check, Status

LIBRARY_NAMES = ("libh3.dylib", "libh3.so")     # build-engine puts the library beside its h3


@dataclass
class Found:
    """Where each part is (None: not found, `why` says what was missing and how to get it)."""

    engine: Path | None = None
    library: Path | None = None
    model: Path | None = None
    ffmpeg: Path | None = None
    ffprobe: Path | None = None
    simulator: bool = False


def os_version() -> str:
    if sys.platform == "darwin":
        release = platform.mac_ver()[0]
        return f"macOS {release}" if release else f"macOS (Darwin {platform.release()})"
    return f"{platform.system()} {platform.release()}"


def is_simulator(engine_path: Path) -> bool:
    """h3-sim, also under another name (a link `h3` -> h3-sim)."""
    try:
        return engine_path.resolve().name.startswith("h3-sim") or engine_path.name.startswith("h3-sim")
    except OSError:
        return engine_path.name.startswith("h3-sim")


def build_commit(engine_path: Path) -> tuple[str | None, bool | None, str]:
    """(commit, pinned?, words) for the engine: build-engine's record of it (h3 does not report
    its commit); pinned None when unknown."""
    from ..engine_build.record import PINNED_COMMIT, build_record
    if is_simulator(engine_path):
        return None, None, f"h3-sim, h3bridge's simulator of h3.c {PINNED_COMMIT[:7]}"
    found = build_record(engine_path)
    if found is None or found.commit is None:
        return None, None, ("commit unknown: build-engine has no record of building it (h3 does not report "
                            f"its commit); h3bridge is tested with h3.c {PINNED_COMMIT[:7]}")
    commit = found.commit.split("+")[0]
    changes = " with local changes" if found.commit.endswith("+changes") else ""
    pinned = commit == PINNED_COMMIT and not changes
    return found.commit, pinned, (f"h3.c {commit[:7]}{changes}, " + ("the pinned commit" if pinned else
                                  f"not the pinned {PINNED_COMMIT[:7]}"))


def locate_all(engine_path: str | os.PathLike[str] | None, model_dir: str | os.PathLike[str] | None,
               library_path: str | os.PathLike[str] | None) -> tuple[Found, list[Check]]:
    """Every part, found as generate finds it; a check line for each. A path the caller gave
    (engine_path, model_dir, library_path) that is not what it should be is refused with the
    finder's error before anything runs, as `generate` refuses it; one looked for and not found
    is a failed check in the report."""
    from ..engines.library import locate_library
    from ..engines.locate import FFMPEG_HINT, locate_engine, locate_media_tools, locate_model_dir
    found, checks = Found(), []
    try:
        found.engine = locate_engine(engine_path)
        found.simulator = is_simulator(found.engine)
        checks.append(Check("engine found", Status.PASS, str(found.engine)))
    except H3BridgeError as error:
        if engine_path is not None:
            raise
        checks.append(Check("engine found", Status.FAIL, f"{error.message} (fix: {error.hint})"))
    given = library_path or os.environ.get("H3_LIBRARY")
    beside = [found.engine.parent / name for name in LIBRARY_NAMES] if found.engine is not None else []
    candidate = given or next((path for path in beside if path.is_file()), None)
    if candidate is not None:
        try:
            found.library = locate_library(candidate)
            checks.append(Check("libh3 found", Status.PASS, str(found.library)))
        except H3BridgeError as error:
            if library_path is not None:
                raise
            checks.append(Check("libh3 found", Status.FAIL if given else Status.SKIPPED,
                                f"{error.message} (fix: {error.hint})"))
    else:
        checks.append(Check("libh3 found", Status.SKIPPED, "no libh3: no --library-path, $H3_LIBRARY unset, none "
                            "beside the engine (`h3bridge build-engine` builds one); the library engine is not run"))
    tools = locate_media_tools()
    found.ffmpeg, found.ffprobe = tools.ffmpeg, tools.ffprobe
    for name, path in (("ffmpeg", tools.ffmpeg), ("ffprobe", tools.ffprobe)):
        checks.append(Check(f"{name} found", Status.PASS if path else Status.FAIL,
                            str(path) if path else f"{name} not found (fix: {FFMPEG_HINT})"))
    try:
        found.model = locate_model_dir(model_dir)
        checks.append(Check("model found", Status.PASS, str(found.model)))
    except H3BridgeError as error:
        if model_dir is not None:
            raise
        checks.append(Check("model found", Status.FAIL, f"{error.message} (fix: {error.hint})"))
    return found, checks


def verify_check(model_dir: Path, *, checksums: bool) -> Check:
    """`h3bridge verify` of the model (headers; with checksums every shard's SHA-256)."""
    from ..model.verify import verify_model
    try:
        report = verify_model(model_dir, checksums=checksums, progress=False)
    except H3BridgeError as error:
        return Check("model verify", Status.FAIL, f"{error.message} (fix: {error.hint})")
    what = "headers and checksums" if checksums else "headers (checksums: run with --checksums)"
    problems = [getattr(error, "message", str(error)) for error in report.errors][:5]
    return Check("model verify", Status.PASS if report.ok else Status.FAIL,
                 f"{what}: {len(report.results)} shard(s) " + ("OK" if report.ok else "with problems: "
                                                                + "; ".join(problems)),
                 figures={"shards": len(report.results), "checksums": checksums})


def machine_facts(found: Found) -> dict[str, object]:
    """The report's facts table (paths are made shareable when the report is written)."""
    from .. import __version__
    machine = MachineFacts.detect()
    facts: dict[str, object] = {
        "chip": machine.chip or f"{platform.machine()} ({platform.processor() or 'no chip name'})",
        "memory": f"{machine.total_memory / 2**30:.1f} GiB",
        "os": os_version(),
        "python": platform.python_version(),
        "h3bridge": __version__,
    }
    if found.engine is not None:
        commit, pinned, words = build_commit(found.engine)
        facts.update({"engine": str(found.engine), "h3 build": words, "h3 commit": commit,
                      "h3 commit is the pinned one": pinned})
    facts.update({"libh3": str(found.library) if found.library else None,
                  "ffmpeg": str(found.ffmpeg) if found.ffmpeg else None,
                  "model": str(found.model) if found.model else None})
    return facts


__all__ = ["Found", "build_commit", "is_simulator", "locate_all", "machine_facts", "os_version", "verify_check"]
