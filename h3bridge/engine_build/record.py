"""Which h3.c commit an engine was built from: recorded by build-engine, read by doctor.

Upstream's `h3` does not report its commit: main.c prints only `h3-metal H3_VERSION` ("0.1.0-dev"
at 8974cc0, h3.h) and only with `--info`, which needs a model; there is no `--version`. So
build-engine records the commit when it builds, from the clone (`git rev-parse HEAD`) or the
source tarball (`git archive` writes the commit into the tar's pax header as `comment`), in
<user cache>/engines/builds.json, keyed by the built program's path.
"""
from __future__ import annotations

import json
import lzma
import subprocess
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ..safeio.paths import not_regular, open_regular
from ..userdirs import cache_dir

PINNED_COMMIT = "8974cc055ea9c02fcd14cc27dfda3e1027c05153"     # the h3.c h3bridge is tested against
RECORD_NAME = "builds.json"
MANIFEST_NAME = "engine.json"      # beside a portable build's program: what it was built from (build.py)


def manifest_commit(folder: Path) -> str | None:
    """The commit a portable build's manifest records. Builds are keyed by the hash of upstream's
    files, so any source with these files (the tarball, or the folder it was extracted to, which
    is not a git clone and tells no commit) is that commit: a rebuild from the extracted folder
    keeps what the tarball said instead of forgetting it."""
    try:
        value = json.loads((folder / MANIFEST_NAME).read_text()).get("commit")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and len(value.split("+")[0]) == 40 else None


def commit_of_clone(folder: Path) -> str | None:
    """HEAD of a git clone (None for a folder that is not one, or without git)."""
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=60)
    except OSError:
        return None
    commit = done.stdout.strip()
    if done.returncode != 0 or len(commit) != 40:
        return None
    # a clone with local changes (a patch applied, e.g. pull request 59) is that commit plus changes
    dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=60)
    return commit + ("+changes" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def commit_of_tarball(tarball: Path) -> str | None:
    """The commit `git archive` wrote in the tar's pax header (None: not there, or not readable;
    only a regular file is opened, and a damaged archive is unpack's to report)."""
    try:
        with open_regular(tarball, not_regular) as handle, tarfile.open(fileobj=handle, mode="r:*") as archive:
            comment = archive.pax_headers.get("comment", "")
    except (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError):
        return None
    return comment if len(comment) == 40 else None


def _record_path(cache_root: Path | None = None) -> Path:
    return (cache_root if cache_root is not None else cache_dir()) / "engines" / RECORD_NAME


@dataclass(frozen=True)
class BuildRecord:
    program: str
    commit: str | None
    source: str

    @property
    def matches_pin(self) -> bool:
        """Built from the pinned commit (with local changes, e.g. pull request 59 applied, too)."""
        return self.commit is not None and self.commit.split("+")[0] == PINNED_COMMIT


def record_build(program: Path, commit: str | None, source: Path, cache_root: Path | None = None) -> None:
    path = _record_path(cache_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    from ..model.verify import _atomic_write_json      # the one atomic JSON writer
    with FileLock(str(path) + ".lock", timeout=60):
        builds = _read(path)
        builds[str(program.resolve())] = {"commit": commit, "source": str(source), "built": int(time.time())}
        _atomic_write_json(path, builds)


def _read(path: Path) -> dict[str, dict[str, object]]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def build_record(program: Path, cache_root: Path | None = None) -> BuildRecord | None:
    entry = _read(_record_path(cache_root)).get(str(program.resolve()))
    if not isinstance(entry, dict):
        return None
    commit = entry.get("commit")
    if not isinstance(commit, str):
        # recorded before the manifest fallback (build.py) existed: the build's own manifest may know
        commit = manifest_commit(program.resolve().parent)
    return BuildRecord(program=str(program), commit=commit, source=str(entry.get("source", "")))
