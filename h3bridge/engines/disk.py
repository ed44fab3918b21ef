"""Disk space and writable folders, for every engine: checked against a clip's expected size before
the render, and named when the disk still fills (or turns read-only) during it.
"""
from __future__ import annotations
import errno
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from ..errors import DiskError
from ..safeio.outputs import why_not_writable as outputs_why_not_writable
from .scratch import PROBE_PREFIX, remove_dead_scratch
from ..media.decode import remove_quietly
from ..request import GenerationRequest
from ..geometry import FPS


def why_not_writable(existing: Path) -> str:
    """safeio.outputs' words for a folder that takes no new files (one wording everywhere)."""
    return outputs_why_not_writable(existing)


# What an H.264 clip at CRF 18 can cost: 1 bit per pixel and frame is several times what CRF 18
# ("fast" preset) gives on rendered footage (~0.1-0.3); AAC at 192 kbit/s; plus room for the MP4
# index and the `+faststart` rewrite. Generous on purpose: the check only has to catch a disk
# that cannot take the clip, never refuse one that can.
CLIP_BITS_PER_PIXEL = 1.0


AUDIO_BITS_PER_SECOND = 192_000


CLIP_SLACK_BYTES = 1 << 20


# main.c `cli_frame`: "P6\n%d %d\n255\n" then the raw RGB rows.
_PPM_HEADER_BYTES = 32


def expected_clip_bytes(request: GenerationRequest) -> int:
    """A generous upper estimate of the MP4 h3 writes for `request` (see CLIP_BITS_PER_PIXEL)."""
    video = request.width * request.height * request.frame_count * CLIP_BITS_PER_PIXEL / 8
    audio = request.frame_count / FPS * AUDIO_BITS_PER_SECOND / 8
    return int(video + audio) + CLIP_SLACK_BYTES


def expected_frames_bytes(request: GenerationRequest) -> int:
    """What `--frames-dir` takes: one binary PPM per final frame (main.c `cli_frame`)."""
    return request.frame_count * (request.width * request.height * 3 + _PPM_HEADER_BYTES)


@dataclass(frozen=True)
class DiskNeed:
    """Bytes a job will write into `folder` (an existing folder, or the nearest existing parent
    of one it will create). `what` names the folder for the user ("the output folder")."""

    folder: Path
    what: str
    needed: int


def existing_folder(path: Path) -> Path:
    """`path` or its nearest existing parent: where a folder about to be created would live."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# strerror() of the errors that mean the disk, not the program, stopped a write (Linux and macOS;
# macOS spells EDQUOT "Disc quota exceeded"), as FFmpeg prints them after the file name.
_DISK_STATES = {
    "No space left on device": "is full",
    "Disk quota exceeded": "is over your disk quota",
    "Disc quota exceeded": "is over your disk quota",
    "Read-only file system": "is on a read-only file system",
}


_DISK_ERRNOS = {errno.ENOSPC: "is full", errno.EDQUOT: "is over your disk quota",
                errno.EROFS: "is on a read-only file system"}


# main.c `cli_frame`: h3 could not write a --frames-dir file (it prints no errno).
_FRAME_WRITE_FAILURE = re.compile(r"^h3: (?:cannot write frame \d+ to|incomplete frame \d+ in) (?P<dir>.+)$")


def disk_error(need: DiskNeed, state: str, *, before_start: bool, free: int | None = None,
               detail: str = "", engine_message: str | None = None, stderr: str = "",
               parts: Sequence[DiskNeed] = ()) -> DiskError:
    """The one way both engines say that a disk stopped (or would stop) a job: which folder,
    what is wrong with it (`state`, e.g. "is full"), and what to do. `parts`: the needs on one
    disk that `need` adds up (the MP4 and the frames)."""
    from ..model.inventory import format_bytes
    where = f"{need.what} {need.folder}"
    if free is not None and len(parts) > 1:
        message = (f"the disk of {where} has {format_bytes(free)} free, and this job needs about "
                   f"{format_bytes(need.needed)} on it: " + ", ".join(
                       f"{format_bytes(part.needed)} in {part.what} {part.folder}" for part in parts))
    elif free is not None:
        message = (f"{where} has {format_bytes(free)} free, and this job needs about "
                   f"{format_bytes(need.needed)} there{detail}")
    else:
        message = f"{where} {state}{detail}"
    if state == "is on a read-only file system":
        hint = "write the clip to a folder on a writable disk"
    elif state in ("is full", "is over your disk quota") or free is not None:
        hint = f"free at least {format_bytes(need.needed)} on that disk, or write the clip to another disk"
    else:
        hint = "write the clip to a folder on a local, writable disk"
    if any(part.what.startswith("h3bridge's temporary folder") for part in (need, *parts)):
        hint += " (TMPDIR moves h3bridge's temporary folder)"
    return DiskError(message, folder=need.folder, free=free, needed=need.needed, before_start=before_start,
                     hint=hint, engine_message=engine_message, stderr=stderr)


def check_disk_space(needs: Sequence[DiskNeed]) -> None:
    """Before the render: every folder in `needs` must take a file (a tiny probe, created and
    removed at once: permissions, read-only mounts, file systems that refuse writes) and its disk
    must have room for what the job writes there (needs on one disk add up).
    Raises DiskError(before_start=True)."""
    by_disk: dict[int, list[DiskNeed]] = {}
    for need in needs:
        _probe_writable(need)
        by_disk.setdefault(os.stat(need.folder).st_dev, []).append(need)
    for group in by_disk.values():
        total = sum(need.needed for need in group)
        free = shutil.disk_usage(group[0].folder).free
        if free < total:
            raise disk_error(DiskNeed(group[0].folder, group[0].what, total), "is full", before_start=True,
                             free=free, parts=group)


def _probe_writable(need: DiskNeed) -> None:
    """Create one small file in `need.folder` with O_EXCL, remove its name, write to it. The name
    carries this process's pid: one a killed process left behind is removed by the next probe of
    that folder (lock.remove_dead_scratch), as by a restarted server in its job folders."""
    state = None
    if not os.access(need.folder, os.W_OK | os.X_OK):
        state = why_not_writable(need.folder)
        state = "is on a read-only file system" if "read-only" in state else f"cannot be written ({state})"
    else:
        remove_dead_scratch(need.folder)
        try:
            descriptor, name = tempfile.mkstemp(prefix=f"{PROBE_PREFIX}{os.getpid()}-", dir=need.folder)
            try:
                remove_quietly(Path(name))       # at once: the write below needs no name
                os.write(descriptor, b"h3bridge")
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        except OSError as error:
            state = _DISK_ERRNOS.get(error.errno or 0) or (
                f"does not take new files (creating a test file there failed: {error.strerror or error}), "
                "so it is not on a writable file system")
    if state is not None:
        raise disk_error(need, state, before_start=True)


def disk_problem(stderr: str, needs: Sequence[DiskNeed]) -> tuple[DiskNeed, str] | None:
    """The disk problem h3's or FFmpeg's stderr reports (FFmpeg: "Error writing trailer of PATH:
    No space left on device"), as (the need whose folder it concerns, its state), else None."""
    for line in stderr.replace("\r", "\n").split("\n"):
        state = next((state for words, state in _DISK_STATES.items() if words in line), None)
        frames = _FRAME_WRITE_FAILURE.match(line)
        if state is None and frames is None:
            continue
        if frames is not None:
            state = "could not take the frames (is its disk full?)"
        concerned = [need for need in needs if str(need.folder) in line] or list(needs)
        if concerned:
            return max(concerned, key=lambda need: len(str(need.folder))), state
    return None


def raise_for_disk_problem(stderr: str, needs: Sequence[DiskNeed], *, engine_message: str | None) -> None:
    """After a job: the DiskError for a disk problem its stderr reports (see disk_problem)."""
    found = disk_problem(stderr, needs)
    if found is not None:
        need, state = found
        raise disk_error(need, state, before_start=False, engine_message=engine_message, stderr=stderr,
                         detail=": the clip could not be written")


def disk_error_from_os_error(error: OSError, need: DiskNeed) -> DiskError | None:
    """The DiskError for an OSError that a full or read-only disk caused, else None."""
    state = _DISK_ERRNOS.get(error.errno or 0)
    if state is None:
        return None
    return disk_error(need, state, before_start=False, detail=": the finished clip could not be moved there")
