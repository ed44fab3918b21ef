"""Upstream h3.c's own code as an engine under test: `h3bridge build-engine` over the portable
backend (h3bridge/engine_build), from the source named by H3_UPSTREAM_SOURCE (a clone or the
`git archive` tarball; `.ci/run` points it at ../shared/upstream/h3.c-*.tar.gz when that exists).

Without the variable every test that asks for the upstream build is skipped. The build happens
once per source (cached by hash under the user cache directory, like any build-engine build),
so only the first session on a machine pays its ~20 s.

Upstream hard-codes the released model's dimensions, so it runs on the *realistic* fixture
(released shapes, sparse shards: nothing on disk, nothing read that a kernel does not touch).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from h3bridge.engine_build import BuiltEngine, build_engine
from h3bridge.errors import LibraryBuildError
from h3bridge.userdirs import platform_cache_dir

UPSTREAM_SOURCE_ENV = "H3_UPSTREAM_SOURCE"
# The parametrization ids of tests that run against both engines.
SIM, UPSTREAM = "h3-sim", "upstream"
BOTH_ENGINES = (SIM, UPSTREAM)
# The user's cache folder, read once when the suite is collected: the build is made the first time
# a test asks for it, and a test that points HOME at a folder of its own must not move it there.
USER_CACHE = platform_cache_dir()


@functools.cache
def _build(source: str) -> BuiltEngine | str:
    # The user's cache, not H3BRIDGE_CACHE_DIR, which many tests point at a folder of their own:
    # the build is shared by every test, every session and `h3bridge build-engine` itself.
    try:
        return build_engine(Path(source), cache_root=USER_CACHE)
    except LibraryBuildError as error:
        return f"upstream h3.c cannot be built here: {error} ({error.hint})"


def upstream_engine_or_skip() -> BuiltEngine:
    """The built upstream engine, or skip (no H3_UPSTREAM_SOURCE, or no compiler/libraries)."""
    source = os.environ.get(UPSTREAM_SOURCE_ENV)
    if not source:
        pytest.skip(f"{UPSTREAM_SOURCE_ENV} is not set (a clone or source tarball of antirez/h3.c)")
    built = _build(source)
    if isinstance(built, str):
        pytest.skip(built)
    return built


def upstream_source_file(name: str) -> bytes | None:
    """One top-level file of upstream's source (`h3.h`, `Makefile`, `h3_text_encoder.c`, ...) from
    H3_UPSTREAM_SOURCE, a clone or the `git archive` tarball; None without the variable or the file.
    The one way tests read upstream's source: never from a path of one machine."""
    source = os.environ.get(UPSTREAM_SOURCE_ENV)
    if not source:
        return None
    root = Path(source)
    if root.is_dir():
        return (root / name).read_bytes() if (root / name).is_file() else None
    import tarfile
    try:
        with tarfile.open(root) as archive:
            # `git archive` puts every file under one folder (h3.c-8974cc0/NAME)
            member = next((m for m in archive.getmembers() if m.isfile() and m.name.split("/")[-1] == name
                           and m.name.count("/") <= 1), None)
            return archive.extractfile(member).read() if member is not None else None   # type: ignore[union-attr]
    except (OSError, tarfile.TarError):
        return None


def upstream_source_text_or_skip(name: str) -> str:
    data = upstream_source_file(name)
    if data is None:
        pytest.skip(f"upstream's {name} is not at ${UPSTREAM_SOURCE_ENV} (a clone or source tarball of antirez/h3.c)")
    return data.decode("utf-8")


@pytest.fixture(scope="session")
def upstream_engine() -> BuiltEngine:
    return upstream_engine_or_skip()


@pytest.fixture(scope="session")
def realistic_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fixture model with the released shapes (sparse files): the only kind upstream accepts."""
    from h3bridge.sim.fixture import write_fixture_model
    return write_fixture_model(tmp_path_factory.mktemp("realistic-model") / "MiniMax-H3", realistic=True)


__all__ = ["BOTH_ENGINES", "SIM", "UPSTREAM", "UPSTREAM_SOURCE_ENV", "realistic_model", "upstream_engine",
           "upstream_source_file", "upstream_source_text_or_skip",
           "upstream_engine_or_skip"]
