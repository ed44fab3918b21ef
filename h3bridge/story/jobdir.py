"""The job directory of a story: each shot's MP4, its last frame, and a manifest that is the
record of what is finished.

The manifest (manifest.json) is rewritten after every shot under a temporary name, flushed to
disk and renamed over the old one, so a crash at any moment leaves either the old or the new
manifest, never a torn one. A shot is finished exactly when the manifest lists it; its files
are checked against their SHA-256 before they are trusted again. Only one run uses a job
directory at a time (a file lock, released by the system if the run is killed). A run that ends
removes the lock file (no hidden `.lock` stays in a finished job's folder) while it still holds
the lock: a run that opened the old file and gets its lock after the release finds it unlinked,
which filelock does not count as acquired (its st_nlink check), so it reports the folder busy
instead of running beside the next run that creates a new lock file.
"""
from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import filelock

from ..errors import DiskError, H3BridgeError, RequestError
from ..fixes import Blank, Fix, changes
from ..safeio.outputs import STAGING_PREFIX, rename_new, write_output
from ..safeio.paths import NotRegularFileError, not_regular, open_regular, sha256_regular

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
LOCK_NAME = ".lock"
MAX_MANIFEST_BYTES = 64 << 20      # far beyond any story's; a bigger "manifest" is not ours

# Another job directory, as data (h3bridge.fixes): `--job-dir DIR` on the command line, `job_dir=DIR` in Python.
_JOB_DIR = changes(job_dir=Blank("DIR"))
_ANOTHER = Fix("choose another with {}", (_JOB_DIR,))


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
class RemoteJobRecord:
    """A shot submitted to a server and not finished yet: written down the moment the server
    accepts it, so a run killed meanwhile resumes by following that job instead of paying for the
    shot twice (engines/remote.py JobAdoption)."""

    key: str          # the shot's plan key the job renders (another key: the job is not the shot's any more)
    job_id: str
    url: str          # the server (or proxy) it was submitted to


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
    # --pick SHOT=TAKE: the take the film uses of a shot with takes (until picked again); default the first
    picks: dict[int, int] = field(default_factory=dict)
    film: FilmRecord | None = None
    # Server jobs submitted for shots not finished yet, by shot (see RemoteJobRecord).
    remote_jobs: dict[int, RemoteJobRecord] = field(default_factory=dict)
    # This job directory's name for its submissions (the Idempotency-Key of a shot's job is made
    # from it): random, made once with the manifest.
    story_id: str = field(default_factory=lambda: secrets.token_hex(16))

    def take(self, index: int, key: str) -> ShotRecord | None:
        """The finished take of shot `index` made for `key`: the one in use, else an earlier one."""
        current = self.shots.get(index)
        if current is not None and current.key == key:
            return current
        return self.takes.get((index, key))

    def use(self, record: ShotRecord, *, in_film: bool = True) -> None:
        """Keep `record` among its shot's takes and, `in_film`, make it the take the film uses."""
        if in_film:
            self.shots[record.index] = record
        self.takes[(record.index, record.key)] = record

    def to_json(self) -> str:
        data = asdict(self)
        data["shots"] = [asdict(record) for _, record in sorted(self.shots.items())]
        data["takes"] = [asdict(record) for _, record in sorted(self.takes.items())]
        data["seed_overrides"] = {str(k): v for k, v in sorted(self.seed_overrides.items())}
        data["picks"] = {str(k): v for k, v in sorted(self.picks.items())}
        data["remote_jobs"] = {str(k): asdict(v) for k, v in sorted(self.remote_jobs.items())}
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
        # (a manifest written before shots' server jobs were kept has none, and gets a story id now)
        remote_jobs = {int(k): RemoteJobRecord(**v) for k, v in data.get("remote_jobs", {}).items()}
        story_id = data.get("story_id")
        return cls(version=MANIFEST_VERSION, storyboard=data.get("storyboard", ""), shots=shots, takes=takes,
                   seed_overrides={int(k): int(v) for k, v in data.get("seed_overrides", {}).items()}, film=film,
                   picks={int(k): int(v) for k, v in data.get("picks", {}).items()},
                   remote_jobs=remote_jobs, **({"story_id": story_id} if isinstance(story_id, str) else {}))


def file_sha256(path: Path, *, follow_symlinks: bool = True) -> str:
    """A regular file's SHA-256; a FIFO or a device is never waited on nor read: NotRegularFileError
    (an OSError, as for any file that cannot be read)."""
    return sha256_regular(path, not_regular, follow_symlinks=follow_symlinks)


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path` (a file of h3bridge's own, replaced in place) through safeio.outputs: staged
    beside it, fsynced, renamed over the previous version only if that is a regular file, the
    folder fsynced; nothing half-written is left when the disk is full."""
    try:
        write_output(path, data, overwrite=True, field="manifest", make_parents=False)
    except RequestError as error:       # its folder cannot take it: the OSError callers word as a disk error
        raise OSError(errno.ENOTDIR, error.message, str(path)) from None


class JobDir:
    """A story's job directory; use as a context manager (it holds the directory's lock)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock: filelock.BaseFileLock | None = None
        self.damaged_manifest: Path | None = None     # set when an unreadable manifest was set aside
        self.created = False                          # this run made the folder (remove_if_created)

    def __enter__(self) -> "JobDir":
        self.created = not os.path.lexists(self.path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise JobDirError(f"cannot create the job directory {self.path}: {error.strerror or error}",
                              hint=_ANOTHER) from None
        try:
            if not os.access(self.path, os.W_OK):
                raise JobDirError(f"the job directory {self.path} is not writable", hint=_ANOTHER)
            lock = filelock.FileLock(str(self.path / LOCK_NAME))
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                raise JobDirError(f"another h3bridge story is running in {self.path}",
                                  hint=Fix("wait for it to finish, or give this one its own {}", (_JOB_DIR,))) from None
            except OSError as error:       # a full or read-only disk
                raise JobDirError(f"cannot use the job directory {self.path}: {error.strerror or error}",
                                  hint=Fix("free space on its disk, or choose another with {}", (_JOB_DIR,))) from None
        except BaseException:
            self.remove_if_created()
            raise
        self._lock = lock
        return self

    def remove_if_created(self) -> None:
        """After a run that finished nothing: remove the job folder if this run created it and no
        shot was recorded in it (its lock and this run's unfinished files are all it holds)."""
        if not self.created or self.manifest_path.exists():
            return
        for entry in self.path.iterdir():
            if entry.name != LOCK_NAME and not entry.name.startswith(("shot-", f".{MANIFEST_NAME}.", STAGING_PREFIX)):
                return          # something this run did not make: leave the folder alone
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        shutil.rmtree(self.path, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            # Unlinked before the release, never after (see the module docstring); the folder
            # may have been removed meanwhile (remove_if_created) or may refuse the unlink.
            try:
                (self.path / LOCK_NAME).unlink()
            except OSError:
                pass
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
            # The folder's own file only: never a symlink out of it, a FIFO or a device.
            with open_regular(self.manifest_path, not_regular, follow_symlinks=False) as handle:
                raw = handle.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            return Manifest()
        except OSError as error:
            if not (isinstance(error, NotRegularFileError) or error.errno == errno.ELOOP):
                raise JobDirError(f"cannot read {self.manifest_path}: {error.strerror or error}",
                                  hint=Fix("check the job directory's permissions, or choose another with {}",
                                           (_JOB_DIR,))) from None
            raw = b""           # a symlink, FIFO or device: not a manifest this job wrote
        try:
            if len(raw) > MAX_MANIFEST_BYTES:
                raise ValueError("too large")
            return Manifest.from_json(raw.decode("utf-8"))
        except (ValueError, TypeError, KeyError, AttributeError):
            stamp = time.strftime('%Y%m%d-%H%M%S')
            # never over one set aside before (two in the same second): the next free name
            for number in range(1, 1000):
                aside = self.path / (f"{MANIFEST_NAME}.damaged-{stamp}" + ("" if number == 1 else f"-{number}"))
                if rename_new(self.manifest_path, aside):
                    break
            else:
                raise JobDirError(f"the job directory {self.path} holds too many damaged manifests",
                                  hint="remove the manifest.json.damaged-* files in it")
            self.damaged_manifest = aside
            return Manifest()

    def save(self, manifest: Manifest) -> None:
        try:
            write_atomically(self.manifest_path, manifest.to_json().encode("utf-8"))
        except OSError as error:       # a full or read-only disk: the shot is not recorded
            raise DiskError(f"cannot record the finished shot in {self.manifest_path}: {error.strerror or error}",
                            folder=self.path, hint="free space on its disk and run the story again: recorded shots "
                                                   "are kept, the others rendered again") from None

    # ------------------------------------------------------------------ shot files

    def shot_file(self, index: int, key: str, suffix: str) -> Path:
        """A shot's file, named by its position and key: a re-rolled or edited shot is a new take
        beside the old one, never written over it."""
        return self.path / f"shot-{index:03d}-{key[:12]}{suffix}"

    def own_file(self, name: object) -> Path | None:
        """The job folder's file `name` (a manifest's file name), or None when `name` is not a plain
        name inside this folder: an absolute path, `..`, a sub-folder. Only files inside the job
        folder count (a planted manifest must not bring in a clip from elsewhere)."""
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
                or "\0" in name:
            return None
        return self.path / name

    def problem_with(self, record: ShotRecord) -> str | None:
        """Why a recorded shot cannot be trusted (a file outside the job folder, missing, not a
        regular file, or changed), or None. The files are opened without following a symlink and
        without blocking, so a manifest naming a FIFO or a link to /dev/zero is redone, not hung on."""
        for name, expected in ((record.video, record.video_sha256), (record.last_frame, record.last_frame_sha256)):
            path = self.own_file(name)
            if path is None:
                return f"its file {shown_name(name)} is not a file of the job folder (only files inside {self.path} count)"
            try:
                actual = file_sha256(path, follow_symlinks=False)
            except NotRegularFileError as error:
                return f"{path.name} is {error.kind}, not the shot's file"
            except OSError as error:
                if error.errno == errno.ELOOP:
                    return f"{path.name} is a symbolic link, not the shot's file"
                return f"{path.name} is missing" if isinstance(error, FileNotFoundError) else \
                    f"{path.name} cannot be read ({error.strerror or error})"
            if actual != expected:
                return f"{path.name} does not match its checksum (damaged or changed)"
        return None


def shown_name(name: object) -> str:
    text = repr(name) if isinstance(name, str) else f"({type(name).__name__})"
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["FilmRecord", "JobDir", "JobDirError", "Manifest", "RemoteJobRecord", "ShotRecord", "file_sha256", "write_atomically"]
