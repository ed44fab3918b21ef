"""The job directory of a story: each shot's MP4, its last frame, and a manifest that is the
record of what is finished.

The manifest (manifest.json) is rewritten after every shot under a temporary name, flushed to
disk and renamed over the old one, so a crash at any moment leaves either the old or the new
manifest, never a torn one. A shot is finished exactly when the manifest lists it; its files
are checked against their SHA-256 before they are trusted again. Only one run uses a job
directory at a time (a file lock, released by the system if the run is killed).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import filelock

from ..errors import H3BridgeError

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
LOCK_NAME = ".lock"


class JobDirError(H3BridgeError):
    """The job directory cannot be used (busy, unwritable, not a story's job directory)."""

    before_start = True


@dataclass
class ShotRecord:
    """One finished shot, as the manifest keeps it."""

    index: int
    key: str                          # plan.PlannedShot.key it was rendered for
    seed: int
    video: str                        # file names inside the job directory
    video_sha256: str
    last_frame: str                   # the engine's exact last frame (PNG), for an `anchor` after it
    last_frame_sha256: str
    frames_sha256: str                # of the engine's frames (uint8 [F, H, W, 3], C order)
    audio_sha256: str                 # of the engine's audio (float32 [2, samples], C order)
    frame_count: int
    width: int
    height: int
    audio_samples: int
    request: dict                     # the request as rendered (paths as text)
    engine: dict                      # which engine made it (kind, binary, model, variables)
    wall_seconds: float
    # For a shot that continues: the SHA-256 of what it continued from (the previous shot's last
    # frame, or its MP4 for a tail); it is kept only while the previous shot still matches.
    continued_from: str = ""
    finished_at: float = field(default_factory=time.time)


@dataclass
class FilmRecord:
    path: str
    sha256: str
    shot_keys: list[str]
    frames: int
    samples: int


@dataclass
class Manifest:
    version: int = MANIFEST_VERSION
    storyboard: str = ""
    shots: dict[int, ShotRecord] = field(default_factory=dict)      # the take each shot uses now
    # Every finished take by (shot, key): an edit undone finds its take again (its files are kept
    # beside the newer take's, named by key) instead of rendering it again.
    takes: dict[tuple[int, str], ShotRecord] = field(default_factory=dict)
    # --redo N [--seed S]: the seed shot N renders with from then on (until redone again)
    seed_overrides: dict[int, int] = field(default_factory=dict)
    film: FilmRecord | None = None

    def take(self, index: int, key: str) -> ShotRecord | None:
        """The finished take of shot `index` made for `key`: the one in use, else an earlier one."""
        current = self.shots.get(index)
        if current is not None and current.key == key:
            return current
        return self.takes.get((index, key))

    def use(self, record: ShotRecord) -> None:
        """Make `record` its shot's take in use (and keep it among the takes)."""
        self.shots[record.index] = record
        self.takes[(record.index, record.key)] = record

    def to_json(self) -> str:
        data = asdict(self)
        data["shots"] = [asdict(record) for _, record in sorted(self.shots.items())]
        data["takes"] = [asdict(record) for _, record in sorted(self.takes.items())]
        data["seed_overrides"] = {str(k): v for k, v in sorted(self.seed_overrides.items())}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise ValueError("not a version-1 story manifest")
        shots = {int(item["index"]): ShotRecord(**item) for item in data.get("shots", [])}
        # a manifest written before takes were kept: its shots are its takes
        takes = {(record.index, record.key): record
                 for record in [*shots.values(), *(ShotRecord(**item) for item in data.get("takes", []))]}
        film = FilmRecord(**data["film"]) if data.get("film") else None
        return cls(version=MANIFEST_VERSION, storyboard=data.get("storyboard", ""), shots=shots, takes=takes,
                   seed_overrides={int(k): int(v) for k, v in data.get("seed_overrides", {}).items()}, film=film)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path` via a temporary file, fsync and rename (and the folder's fsync)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


class JobDir:
    """A story's job directory; use as a context manager (it holds the directory's lock)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock: filelock.BaseFileLock | None = None
        self.damaged_manifest: Path | None = None     # set when an unreadable manifest was set aside

    def __enter__(self) -> "JobDir":
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise JobDirError(f"cannot create the job directory {self.path}: {error.strerror or error}",
                              hint="choose another with --job-dir") from None
        if not os.access(self.path, os.W_OK):
            raise JobDirError(f"the job directory {self.path} is not writable", hint="choose another with --job-dir")
        lock = filelock.FileLock(str(self.path / LOCK_NAME))
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            raise JobDirError(f"another h3bridge story is running in {self.path}",
                              hint="wait for it to finish, or give this one its own --job-dir") from None
        self._lock = lock
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------ manifest

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    def load(self) -> Manifest:
        """The manifest, or an empty one for a new job. An unreadable manifest is set aside (renamed,
        never deleted) and the job starts over: its shots are redone."""
        try:
            text = self.manifest_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Manifest()
        try:
            return Manifest.from_json(text)
        except (ValueError, TypeError, KeyError):
            aside = self.path / f"{MANIFEST_NAME}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(self.manifest_path, aside)
            self.damaged_manifest = aside
            return Manifest()

    def save(self, manifest: Manifest) -> None:
        write_atomically(self.manifest_path, manifest.to_json().encode("utf-8"))

    # ------------------------------------------------------------------ shot files

    def shot_file(self, index: int, key: str, suffix: str) -> Path:
        """A shot's file, named by its position and key: a re-rolled or edited shot is a new take
        beside the old one, never written over it."""
        return self.path / f"shot-{index:03d}-{key[:12]}{suffix}"

    def problem_with(self, record: ShotRecord) -> str | None:
        """Why a recorded shot cannot be trusted (a file missing or changed), or None."""
        for name, expected in ((record.video, record.video_sha256), (record.last_frame, record.last_frame_sha256)):
            path = self.path / name
            try:
                actual = file_sha256(path)
            except OSError:
                return f"{path.name} is missing"
            if actual != expected:
                return f"{path.name} does not match its checksum (damaged or changed)"
        return None


__all__ = ["FilmRecord", "JobDir", "JobDirError", "Manifest", "ShotRecord", "file_sha256", "write_atomically"]
