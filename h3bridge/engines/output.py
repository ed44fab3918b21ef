"""Publishing a clip, for every engine: the output is checked before anything starts, written under a
staging name beside it, renamed into place only when complete (never over a file the user made),
and turned into the GenerationResult.
"""
from __future__ import annotations
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
import numpy as np
from ..cancel import CancelToken
from ..errors import EngineError, GenerationCancelled, MediaError, OutputExistsError, RequestError
from ..media.decode import decode_audio, remove_quietly
from ..progress import parse_progress
from .lock import STAGING_PREFIX, STAGING_SUFFIX, make_work_folder, remove_leftovers
from ..request import GenerationRequest
from ..result import GenerationResult
from .disk import DiskNeed, why_not_writable, disk_error_from_os_error


def resolve_output(output: str | os.PathLike[str] | None, *, overwrite: bool) -> Path | None:
    """The absolute output path (None: no MP4 kept); refuses a directory or, unless
    `overwrite`, an existing file, before any engine starts."""
    text = os.fspath(output) if output is not None else ""
    output_path = Path(text).expanduser().absolute() if text else None
    if output_path is not None:
        limit = _name_limit(output_path.parent)
        length = len(output_path.name.encode("utf-8", "surrogateescape"))
        if length > limit:
            raise RequestError(f"the output file name is {length} bytes, over this file system's {limit}",
                               field="output", hint="choose a shorter file name")
        if text.endswith(os.sep) or output_path.is_dir():
            raise RequestError(f"the output {text} names a folder", field="output",
                               hint=f"give a file name ending in .mp4, e.g. {output_path / 'clip.mp4'}")
        if output_path.suffix.lower() != ".mp4":
            # h3 writes MP4 (H.264 + AAC); another suffix would misname the file.
            raise RequestError(f"the output {output_path.name} does not end in .mp4, and h3 writes an MP4",
                               field="output", hint=f"name it {output_path.with_suffix('.mp4').name}")
        # lexists: a symlink (even a dangling one) is something the user made.
        if os.path.lexists(output_path) and not overwrite:
            raise OutputExistsError(f"the output {output_path} already exists",
                                    hint="choose another name, or allow overwriting (CLI: --overwrite)")
        # The clip is staged beside the output and the parents are created (staging_path), so
        # the nearest existing folder must take new entries; find out now, not after the render.
        existing = output_path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise RequestError(f"the output {output_path} cannot be written: {existing} is not a writable folder "
                               f"({why_not_writable(existing)})",
                               field="output", hint="choose an output in a folder you can write to")
    return output_path


def _name_limit(folder: Path) -> int:
    """The longest file name the output's file system takes (NAME_MAX, 255 on APFS and ext4)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def missing_folders(output_path: Path) -> list[Path]:
    """The output's folders that do not exist yet, deepest first: staging_path creates them,
    and a job that fails takes them away again, each only if it is still empty."""
    missing: list[Path] = []
    folder = output_path.parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def staging_path(output_path: Path) -> Path:
    """The temporary name a clip is written under before its atomic rename to `output_path`:
    in the same folder (rename is atomic only within one file system), hidden, unique, and
    ending in .mp4 (FFmpeg picks the muxer by suffix). Creates the output's parents, as h3
    does for its own output (h3_ffmpeg.c `make_parents`)."""
    try:
        output_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MediaError(f"cannot create the output folder {output_path.parent}: {error.strerror}",
                         hint="choose an output in a folder you can write to") from None
    # Short whatever the output's name: a name near the file system's limit must still fit.
    return output_path.parent / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}{STAGING_SUFFIX}"


@dataclass
class JobFiles:
    """Where one job writes: a private temporary folder, and the MP4 under its staging name beside
    the output (or in the folder when only the audio is wanted; None: no MP4). Set `published`
    once the result is out, so the output's new folders stay."""

    workdir: Path
    mp4_temp: Path | None
    published: bool = False


@contextmanager
def job_files(output_path: Path | None, *, want_audio: bool) -> Iterator[JobFiles]:
    """The files of one job (JobFiles), all removed when it ends; the output folders it created
    too, unless the result was published. Shared by every engine that writes an MP4 itself."""
    workdir = make_work_folder()
    made_folders = missing_folders(output_path) if output_path is not None else []
    files = JobFiles(workdir=workdir, mp4_temp=None)
    try:
        if output_path is not None:
            files.mp4_temp = staging_path(output_path)
        elif want_audio:
            files.mp4_temp = workdir / "audio.mp4"
        yield files
    finally:
        if files.mp4_temp is not None and files.mp4_temp.parent != workdir:
            remove_quietly(files.mp4_temp)
        shutil.rmtree(workdir, ignore_errors=True)
        if not files.published:
            remove_leftovers([f"{folder}{os.sep}" for folder in made_folders])


def raise_if_cancelled(cancel: CancelToken | None) -> None:
    """After the engine is gone, reading frames and audio can still take seconds on a long
    clip: a cancel that arrives then is honoured too, before anything is published."""
    if cancel is not None and cancel.cancelled:
        raise GenerationCancelled("generation cancelled; the engine had finished, its clip was discarded")


def finish_result(request: GenerationRequest, mp4: Path | None, output_path: Path | None, *,
                  overwrite: bool, frames: np.ndarray | None, want_audio: bool, timings: dict[str, float],
                  command: list[str], engine_log: str, engine_variables: dict[str, str],
                  seed: int | None = None) -> GenerationResult:
    """Decode the audio (if wanted) from the finished MP4 `mp4`, publish it to `output_path`
    (atomic rename from a temp name in the same directory), and build the GenerationResult."""
    audio = None
    if mp4 is not None:
        if not mp4.is_file():
            if not any(parse_progress(piece) for piece in re.split(r"[\r\n]", engine_log)):
                # It never said a word of h3's: a program given as the engine by mistake
                # (`--engine-path /bin/true`), not an h3 that lost its MP4.
                raise EngineError(f"the engine {command[0]} exited without an error, an MP4 or any of h3's "
                                  "progress output: it does not look like h3", engine_message=None, exit_code=0,
                                  stderr=engine_log, command=command,
                                  hint="give the h3 program built from h3.c as engine_path, or the simulator "
                                       "h3-sim (`h3bridge demo` runs it)")
            raise EngineError("h3 reported success but wrote no MP4", engine_message=None,
                              exit_code=0, stderr=engine_log, command=command)
        if want_audio:
            audio = decode_audio(mp4)
    if output_path is not None:
        assert mp4 is not None
        _publish(mp4, output_path, overwrite=overwrite)
    return GenerationResult(request=request, video_path=output_path, frames=frames, audio=audio,
                            width=request.width, height=request.height, frame_count=request.frame_count,
                            seed=request.seed if seed is None else seed, timings=timings, command=command,
                            engine_log=engine_log, engine_variables=engine_variables)


def _publish(temp: Path, output: Path, *, overwrite: bool) -> None:
    """Move the finished MP4 into place atomically, never clobbering a file that appeared
    meanwhile unless `overwrite`. A clip that cannot take its name is kept beside it (a render
    can cost many minutes), and the error says where."""
    try:
        _publish_or_keep_beside(temp, output, overwrite=overwrite)
    except OutputExistsError:
        raise
    except OSError as error:      # e.g. the folder became read-only or the output is now a folder
        need = DiskNeed(output.parent, "the output folder", temp.stat().st_size if temp.exists() else 0)
        raise disk_error_from_os_error(error, need) or MediaError(
            f"cannot move the finished clip to {output}: {error.strerror}",
            hint="check the output folder's permissions") from None


def _publish_or_keep_beside(temp: Path, output: Path, *, overwrite: bool) -> None:
    if overwrite:
        os.replace(temp, output)
        return
    if _link_new(temp, output):
        return
    for number in range(2, 1000):
        keep = output.with_name(f"{output.stem}-{number}{output.suffix}")
        if _link_new(temp, keep):
            raise OutputExistsError(f"the output {output} appeared while rendering; the new clip was kept as {keep}",
                                    hint="rename the files as you like; h3bridge replaced nothing",
                                    before_start=False)
    raise OutputExistsError(f"the output {output} appeared while rendering and no free name was found beside it",
                            hint="choose another name, or allow overwriting (CLI: --overwrite)", before_start=False)


def _link_new(temp: Path, target: Path) -> bool:
    """Give `temp` the name `target` only if nothing holds that name; True when done."""
    try:
        os.link(temp, target)      # fails if `target` exists: no race with another writer
    except FileExistsError:
        return False
    except OSError:
        # File systems without hard links (exFAT, some network shares): a small window remains.
        if target.exists():
            return False
        os.replace(temp, target)
        return True
    os.unlink(temp)
    return True
