"""`h3bridge verify`: header checks on every shard, and optionally SHA-256 of every shard.

Expected hashes come from, in order:
  1. a Hugging Face cache snapshot (hub/models--org--name/snapshots/<rev>/...): each LFS file is a
     symlink to blobs/<sha256>, so the blob's name is the published hash;
  2. a Hugging Face `--local-dir` download: .cache/huggingface/download/<path>.metadata holds the
     file's ETag, which for LFS files is its SHA-256;
  3. otherwise a manifest h3bridge writes the first time (in the cache dir, under manifests/) and
     checks on later runs.
Hashes are cached by (path, size, mtime_ns) in <cache dir>/verify-cache.json, so verifying an
unchanged model again reads no data; a changed file is hashed again.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from filelock import FileLock
from tqdm import tqdm

from ..errors import IntegrityError, ModelError, RequestError
from ..fixes import Words, changes, python_words, said
from ..runnable import h3bridge_command
from .inventory import ModelInventory, Problem, format_bytes, inspect_model, small_fixture_note
from ..safeio.outputs import write_output
from ..safeio.paths import non_regular_kind
from .safetensors import open_regular_file
from ..userdirs import CACHE_ENV, cache_dir

CACHE_VERSION = 1
HASH_CHUNK = 8 * 1024 * 1024    # large updates: hashlib releases the GIL while hashing them
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _atomic_write_json(path: Path, value: object) -> None:
    """A JSON file of h3bridge's own (a cache, a manifest, a record), replaced in place through
    safeio.outputs (staged, fsynced, never over anything but a regular file)."""
    try:
        write_output(path, json.dumps(value, indent=1, sort_keys=True), overwrite=True, field=path.name)
    except RequestError as error:
        # a folder that cannot hold it: callers word it (or shrug it off) as the OSError it is
        raise OSError(errno.ENOTDIR, error.message, str(path)) from None


@dataclass(frozen=True)
class FileIdentity:
    """What the cache is keyed by: a file is 'unchanged' while all three stay the same."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> "FileIdentity":
        status = path.stat()     # follows symlinks: a HF snapshot link identifies by its blob
        return cls(str(path.resolve()), status.st_size, status.st_mtime_ns)


class HashCache:
    """SHA-256 per file identity, shared by every process (file lock, atomic rewrite)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or cache_dir()
        self.path = self.directory / "verify-cache.json"
        self._lock = FileLock(str(self.path) + ".lock")
        self._entries: dict[str, dict[str, object]] = {}
        self._dirty: dict[str, dict[str, object]] = {}

    def load(self) -> "HashCache":
        try:
            document = json.loads(self.path.read_text())
            if document.get("version") == CACHE_VERSION:
                # Entries of the wrong shape (a damaged or hand-edited cache) are dropped one by one.
                self._entries = {key: entry for key, entry in document.get("files", {}).items()
                                 if isinstance(entry, dict)}
        except (OSError, ValueError, AttributeError, TypeError):
            self._entries = {}      # a missing or damaged cache only costs a re-hash
        return self

    def get(self, identity: FileIdentity) -> str | None:
        entry = self._entries.get(identity.path)
        if entry and entry.get("size") == identity.size and entry.get("mtime_ns") == identity.mtime_ns:
            value = entry.get("sha256")
            return value if isinstance(value, str) else None
        return None

    def put(self, identity: FileIdentity, sha256: str) -> None:
        entry = {"size": identity.size, "mtime_ns": identity.mtime_ns, "sha256": sha256}
        self._entries[identity.path] = entry
        self._dirty[identity.path] = entry

    def save(self) -> None:
        if not self._dirty:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with self._lock:      # merge with what other processes wrote meanwhile
                current = HashCache(self.directory).load()._entries
                current.update(self._dirty)
                _atomic_write_json(self.path, {"version": CACHE_VERSION, "files": current})
        except OSError:
            pass      # a read-only or full cache folder only means the next verify hashes again
        self._dirty = {}


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK)
    view = memoryview(buffer)
    try:
        with open_regular_file(path, buffering=0) as handle:     # never a FIFO or a device
            while True:
                count = handle.readinto(buffer)
                if not count:
                    break
                digest.update(view[:count])
                if on_bytes:
                    on_bytes(count)
    except OSError as error:     # vanished, unreadable, or an I/O error on a failing disk
        raise IntegrityError(f"{path}: cannot read: {error.strerror or error}", path=path,
                             hint="check the file and its disk; download it again if it stays unreadable") from None
    return digest.hexdigest()


def hash_files(paths: Iterable[Path], *, workers: int | None = None, progress: bool | None = None,
               description: str = "sha256") -> dict[Path, str]:
    """SHA-256 of each file, files in parallel on a thread pool (one file per worker at a time)."""
    paths = list(paths)
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            pass        # sha256_file reports it, as an IntegrityError naming the file
    workers = max(1, min(workers or os.cpu_count() or 1, len(paths) or 1))
    bar_lock = threading.Lock()
    # progress=None: tqdm shows the bar only on a terminal; without one (a log, CI) a line every
    # PROGRESS_LINE_SECONDS says how far hashing is, so minutes of hashing are not minutes of silence
    lines = ProgressLines(description, total) if progress is None and not _stderr_is_terminal() else None
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=description,
              disable=(None if progress is None else not progress), leave=False) as bar:
        def advance(count: int) -> None:
            with bar_lock:
                bar.update(count)
                if lines is not None:
                    lines.advance(count)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            digests = list(pool.map(lambda p: sha256_file(p, advance), paths))
    if lines is not None:
        lines.finish()
    return dict(zip(paths, digests))


PROGRESS_LINE_SECONDS = 5.0


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressLines:
    """Hashing progress for a log: a line when it starts, one every PROGRESS_LINE_SECONDS, one
    when it ends. Progress is a courtesy: a broken stderr turns it off."""

    def __init__(self, description: str, total: int) -> None:
        self.description, self.total, self.done = description, total, 0
        self.started = self.last = time.monotonic()
        self._say(f"{description}: hashing {format_bytes(total)}")

    def advance(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.last >= PROGRESS_LINE_SECONDS:
            self.last = now
            share = self.done / self.total if self.total else 1.0
            self._say(f"{self.description}: {format_bytes(self.done)} of {format_bytes(self.total)} "
                      f"({share:.0%}), {now - self.started:.0f} s")

    def finish(self) -> None:
        self._say(f"{self.description}: hashed {format_bytes(self.done)} in {time.monotonic() - self.started:.1f} s")

    def _say(self, text: str) -> None:
        try:
            print(f"h3bridge: {text}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


# ---------------------------------------------------------------------------------------------
# Where expected hashes come from


def _hf_cache_sha256(path: Path) -> str | None:
    """HF hub cache: snapshots/<rev>/<file> -> ../../blobs/<sha256> for LFS files."""
    if not path.is_symlink():
        return None
    target = path.resolve()
    return target.name if target.parent.name == "blobs" and _SHA256.match(target.name) else None


def _hf_local_dir_sha256(root: Path, relative: Path) -> str | None:
    """`huggingface-cli download --local-dir`: .cache/huggingface/download/<file>.metadata =
    commit hash, ETag (the SHA-256 for LFS files), timestamp, one per line."""
    metadata = root / ".cache" / "huggingface" / "download" / (str(relative) + ".metadata")
    if non_regular_kind(metadata) is not None:
        return None      # a FIFO there would block read_text forever
    try:
        lines = metadata.read_text().splitlines()
    except OSError:
        return None
    etag = lines[1].strip().strip('"') if len(lines) > 1 else ""
    return etag if _SHA256.match(etag) else None


def manifest_path(model_dir: Path, directory: Path | None = None) -> Path:
    key = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:16]
    return (directory or cache_dir()) / "manifests" / f"{model_dir.resolve().name}-{key}.json"


@dataclass
class ShardResult:
    path: Path
    relative: Path
    size: int
    header_error: IntegrityError | None = None
    sha256: str | None = None
    expected_sha256: str | None = None
    expected_source: str | None = None     # "huggingface-cache", "huggingface-download", "manifest"
    hash_from_cache: bool = False
    recorded: bool = False                 # first run: hash written to the manifest

    @property
    def checksum_error(self) -> IntegrityError | None:
        if self.sha256 is None or self.expected_sha256 is None or self.sha256 == self.expected_sha256:
            return None
        fix = ("download this file again" if self.expected_source != "manifest" else
               "the file changed since h3bridge recorded it: download it again, or if you replaced it on "
               f"purpose run `{h3bridge_command('verify', '-d', self.path.parents[len(self.relative.parts) - 1], '--checksums', '--rewrite-manifest')}`")
        return IntegrityError(f"{self.path}: checksum mismatch: sha256 {self.sha256}, expected "
                              f"{self.expected_sha256} ({self.expected_source})", path=self.path, hint=fix)

    @property
    def status(self) -> str:
        if self.header_error:
            return "BAD HEADER"
        if self.checksum_error:
            return "CHECKSUM MISMATCH"
        if self.sha256 is None:
            return "header ok"
        if self.recorded:
            return "hashed, recorded"
        return "ok" + (" (cached)" if self.hash_from_cache else "")


@dataclass
class VerifyReport:
    inventory: ModelInventory
    results: list[ShardResult] = field(default_factory=list)
    checksums: bool = False
    manifest: Path | None = None
    manifest_written: bool = False

    @property
    def problems(self) -> list[Problem]:
        """Layout problems other than the per-shard header errors listed in `results`."""
        return [p for p in self.inventory.problems if p.kind != "integrity"]

    @property
    def errors(self) -> list[ModelError]:
        found: list[ModelError] = [p.exception() for p in self.problems if p.severity == "error"]
        for result in self.results:
            if result.header_error:
                found.append(result.header_error)
            elif result.checksum_error:
                found.append(result.checksum_error)
        return found

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self) -> None:
        if self.errors:
            raise self.errors[0]

    def to_dict(self, words: Words = python_words) -> dict[str, object]:
        """The report as JSON; the fixes said with `words` (the interface's renderer)."""
        return {
            "root": str(self.inventory.root), "ok": self.ok, "checksums": self.checksums,
            "manifest": None if self.manifest is None else str(self.manifest), "manifest_written": self.manifest_written,
            "shards": [{"path": str(r.relative), "size": r.size, "status": r.status, "sha256": r.sha256,
                        "expected_sha256": r.expected_sha256, "expected_source": r.expected_source,
                        "error": None if not (r.header_error or r.checksum_error)
                        else (r.header_error or r.checksum_error).message}      # type: ignore[union-attr]
                       for r in self.results],
            "problems": [{"severity": p.severity, "kind": p.kind, "message": p.message, "fix": said(p.fix, words)}
                         for p in self.problems],
            "small_fixture": self.inventory.small_fixture,
        }

    def table(self, verbose: bool = False, words: Words = python_words) -> str:
        """The report for a terminal. `verbose`: every shard with its size and status; otherwise
        only the problems (each with its fix) and a one-line summary. The settings it names are
        said with `words` (the interface's renderer, h3bridge.fixes)."""
        problem_results = [r for r in self.results if r.header_error or r.checksum_error]
        shown = self.results if verbose else problem_results
        lines = [f"model: {self.inventory.root}"] if verbose else []
        width = max([len(str(r.relative)) for r in shown] + [5])
        if verbose:
            lines.append(f"{'shard':<{width}} {'size':>10}  status")
        for result in shown:
            lines.append(f"{str(result.relative):<{width}} {format_bytes(result.size):>10}  {result.status}")
            error = result.header_error or result.checksum_error
            if error:
                lines.append(f"  {error.message}")
                if error.hint:
                    lines.append(f"  fix: {error.hint_in(words)}")
        for problem in self.problems:
            lines.append(f"{problem.label}: {problem.message}")
            lines.append(f"  fix: {said(problem.fix, words)}")
        sources = sorted({r.expected_source for r in self.results if r.expected_source})
        written = self.manifest_written and self.manifest is not None
        if verbose and self.checksums:
            lines.append(f"checksums against: {', '.join(sources) or 'nothing (no hashes)'}")
            if written:
                lines.append(f"manifest written: {self.manifest} (later runs check against it)")
        summary = f"{len(self.results)} shard(s): " + ("OK" if self.ok else f"{len(self.errors)} problem(s)")
        if self.inventory.small_fixture:      # headers are fine, yet no real h3 loads it: say so (the
            lines.append(f"note: {small_fixture_note().say(words)}")     # summary stays the last line)
        if verbose:
            lines.append(summary)
            return "\n".join(lines)
        if not self.checksums:
            checked = "headers checked"
        elif sources:
            checked = f"sha256 checked against {', '.join(sources)}"
        else:
            checked = "sha256 recorded, nothing to check it against yet"
        details = [f"in {self.inventory.root}", checked]
        if written:
            details.append(f"manifest written: {self.manifest} (later runs check against it)")
        lines.append(f"{summary} ({'; '.join(details)}; {words(changes(verbose=True))} lists every shard)")
        return "\n".join(lines)


def verify_model(model_dir: str | Path, *, checksums: bool = False, workers: int | None = None,
                 progress: bool | None = None, cache_directory: Path | None = None,
                 rewrite_manifest: bool = False) -> VerifyReport:
    """Check every shard's header; with `checksums`, hash every shard and compare (see module doc)."""
    inventory = inspect_model(model_dir)
    root = inventory.root
    integrity = {p.path: p.error for p in inventory.problems if p.kind == "integrity"}
    report = VerifyReport(inventory=inventory, checksums=checksums)
    for path in inventory.shard_paths:
        if path.name.startswith("._"):
            continue       # reported as a layout problem, with its own fix
        error = integrity.get(path)
        report.results.append(ShardResult(
            path=path, relative=path.relative_to(root), size=path.stat().st_size,
            header_error=error if isinstance(error, IntegrityError) else None))
    if not checksums:
        return report

    cache = HashCache(cache_directory).load()
    report.manifest = manifest_path(root, cache.directory)
    manifest_files: dict[str, dict[str, object]] = {}
    if not rewrite_manifest:
        try:
            manifest_files = {name: entry for name, entry in
                              json.loads(report.manifest.read_text()).get("files", {}).items()
                              if isinstance(entry, dict)}
        except (OSError, ValueError, AttributeError, TypeError):
            manifest_files = {}     # damaged: rewritten from this run's hashes

    to_hash: list[ShardResult] = []
    folded = inventory.provenance       # a folded model's record: its shards' hashes
    for result in report.results:
        if result.header_error:
            continue
        published = _hf_cache_sha256(result.path)
        if published:
            result.expected_sha256, result.expected_source = published, "huggingface-cache"
        else:
            published = _hf_local_dir_sha256(root, result.relative)
            if published:
                result.expected_sha256, result.expected_source = published, "huggingface-download"
            elif folded is not None and folded.expected_sha256(str(result.relative)):
                result.expected_sha256 = folded.expected_sha256(str(result.relative))
                result.expected_source = "fold record"     # h3bridge lora fold (fold_record.py)
            else:
                recorded = manifest_files.get(str(result.relative), {}).get("sha256")
                if isinstance(recorded, str):
                    result.expected_sha256, result.expected_source = recorded, "manifest"
        cached = cache.get(FileIdentity.of(result.path))
        if cached:
            result.sha256, result.hash_from_cache = cached, True
        else:
            to_hash.append(result)

    identities = {r.path: FileIdentity.of(r.path) for r in to_hash}
    digests = hash_files([r.path for r in to_hash], workers=workers, progress=progress)
    for result in to_hash:
        result.sha256 = digests[result.path]
        # record only if the file did not change while we read it
        if FileIdentity.of(result.path) == identities[result.path]:
            cache.put(identities[result.path], result.sha256)
    cache.save()

    unrecorded = [r for r in report.results if r.sha256 and r.expected_sha256 is None]
    if unrecorded:
        for result in unrecorded:
            manifest_files[str(result.relative)] = {"size": result.size, "sha256": result.sha256}
            result.recorded = True
        try:
            _atomic_write_json(report.manifest, {
                "model_dir": str(root.resolve()),
                "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "files": manifest_files})
        except OSError as error:
            raise ModelError(f"cannot write the checksum manifest {report.manifest}: {error.strerror or error}",
                             hint=f"set {CACHE_ENV} to a writable folder") from None
        report.manifest_written = True
    return report


def check_headers(model_dir: str | Path) -> ModelInventory:
    """The fast pre-flight: layout and every shard header (no tensor data read). Raises
    ModelError / IntegrityError for the first error; returns the inventory otherwise."""
    inventory = inspect_model(model_dir)
    inventory.raise_for_problems()
    return inventory
