"""Shared helpers for tests against the libh3 double (h3bridge/sim/double): the built library,
a fixture model, and a C compiler for the ABI checks."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from h3bridge.errors import LibraryBuildError
from h3bridge.sim.library import build_double, find_compiler

UPSTREAM_MIRROR = Path("/work/.mirror/antirez+h3.c/repo")   # bare git mirror, when present
UPSTREAM_COMMIT = "8974cc0"


def double_library_path() -> Path:
    """Build (once per source version) and return the double; skip when nothing can compile it."""
    try:
        return build_double()
    except LibraryBuildError as error:
        pytest.skip(f"the libh3 double cannot be built here: {error}")


def compiler_or_skip() -> list[str]:
    try:
        return find_compiler()
    except LibraryBuildError as error:
        pytest.skip(str(error))


def upstream_header(destination: Path) -> Path | None:
    """upstream's h3.h at the pinned commit, from the local mirror, or None without one."""
    git = shutil.which("git")
    if git is None or not UPSTREAM_MIRROR.is_dir():
        return None
    done = subprocess.run([git, "-C", str(UPSTREAM_MIRROR), "show", f"{UPSTREAM_COMMIT}:h3.h"],
                          capture_output=True)
    if done.returncode != 0:
        return None
    destination.write_bytes(done.stdout)
    return destination
