"""Publishing a clip, for every engine: the output is checked before anything starts, written under a
staging name beside it, renamed into place only when complete (never over a file the user made),
and turned into the GenerationResult.
"""
from __future__ import annotations
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
import numpy as np
from ..cancel import CancelToken
from ..errors import EngineError, GenerationCancelled, MediaError, OutputExistsError, RequestError
from ..media.decode import decode_audio, remove_quietly
from ..progress import parse_progress
from .scratch import make_work_folder, remove_leftovers
from ..fixes import Fix, given, literal
from ..safeio.outputs import ALLOW_OVERWRITE, check_output, kind_of, link_new, missing_folders, publish
from ..safeio.outputs import staging_path as outputs_staging_path
from ..request import GenerationRequest
from ..result import GenerationResult
from .disk import DiskNeed, disk_error_from_os_error
from ..runnable import h3bridge_command


def resolve_output(output: str | os.PathLike[str] | None, *, overwrite: bool) -> Path | None:
    """The absolute output path (None: no MP4 kept), checked by safeio.outputs before any engine
    starts: never a folder, device, FIFO or link, an existing file only with `overwrite`, in a
    folder that exists or can be made and takes new files."""
    text = os.fspath(output) if output is not None else ""
    if not text:
        return None
    output_path = check_output(text, overwrite=overwrite, field="output", label="the output",
                               allow_overwrite=ALLOW_OVERWRITE)
    if output_path.suffix.lower() != ".mp4":
        # h3 writes MP4 (H.264 + AAC); another suffix would misname the file.
        raise RequestError(f"the output {output_path.name} does not end in .mp4, and h3 writes an MP4",
                           field="output", hint=f"name it {output_path.with_suffix('.mp4').name}")
    return output_path


def staging_path(output_path: Path) -> Path:
    """The temporary name a clip is written under before its atomic rename to `output_path`
    (safeio.outputs.staging_path: same folder, hidden, unique, ending in .mp4 since FFmpeg picks
    the muxer by suffix). Creates the output's parents, as h3 does for its own output
    (h3_ffmpeg.c `make_parents`)."""
    try:
        output_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MediaError(f"cannot create the output folder {output_path.parent}: {error.strerror}",
                         hint="choose an output in a folder you can write to") from None
    return outputs_staging_path(output_path)


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
                                  hint=Fix("give the h3 program built from h3.c as {}, or the simulator " +
                                           literal(f"h3-sim (`{h3bridge_command('demo')}` runs it)"),
                                           (given("engine_path"),)))
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
    try:
        publish(temp, output, overwrite=overwrite, field="the output",
                allow_overwrite=ALLOW_OVERWRITE)
        return
    except OutputExistsError:
        pass                # taken meanwhile by a file (or, even with overwrite, by a folder, device, link...)
    kind = kind_of(output)
    for number in range(2, 1000):
        keep = output.with_name(f"{output.stem}-{number}{output.suffix}")
        if link_new(temp, keep):
            if overwrite:
                raise MediaError(f"cannot move the finished clip to {output}: it is now {kind}, which h3bridge never "
                                 f"replaces; the new clip was kept as {keep}",
                                 hint="rename the files as you like; h3bridge replaced nothing")
            raise OutputExistsError(f"the output {output} appeared while rendering; the new clip was kept as {keep}",
                                    hint="rename the files as you like; h3bridge replaced nothing",
                                    before_start=False)
    raise OutputExistsError(f"the output {output} appeared while rendering and no free name was found beside it",
                            hint=Fix("choose another name, or " + ALLOW_OVERWRITE.text, ALLOW_OVERWRITE.groups),
                            before_start=False)
