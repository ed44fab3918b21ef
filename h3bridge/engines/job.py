"""The one job skeleton every engine's `generate` runs (one-shot, session, library, remote).

A job goes: validate the request -> resolve the output (refused before anything starts) -> the
engine's own refusals, media tools and disk (before anything starts) -> the job's files (a private
temporary folder and the MP4's staging name beside the output, output.job_files) -> run it -> read
the frames -> decode the audio, publish the MP4 atomically, build the GenerationResult
(output.finish_result) -> remove whatever the job made unless it was published. All of that is
here once; an engine supplies only how it runs a job (`run`, returning `Rendered`) and what it
refuses or needs beforehand. A cancel that arrives after the engine finished is still honoured
before anything is published, and a failed job leaves no file and no folder of its own.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..cancel import CancelToken
from ..request import GenerationRequest
from ..result import GenerationResult
from .disk import DiskNeed, check_disk_space
from .output import JobFiles, finish_result, job_files, raise_if_cancelled, resolve_output


@dataclass(frozen=True)
class JobSpec:
    """What the caller asked of one job, checked: the request is valid and the output (None: no
    MP4 kept) may be written."""

    request: GenerationRequest
    output_path: Path | None
    overwrite: bool
    want_frames: bool
    want_audio: bool
    cancel: CancelToken | None

    @property
    def writes_mp4(self) -> bool:
        """An MP4 is published or its soundtrack decoded."""
        return self.output_path is not None or self.want_audio


@dataclass
class Rendered:
    """What an engine's run hands back: how to read the frames (None: not wanted; called after the
    engine is done, so a cancel meanwhile is honoured first) and what goes into the result."""

    timings: dict[str, float]
    command: list[str]
    engine_log: str = ""
    engine_variables: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    read_frames: Callable[[], np.ndarray] | None = None


def open_job(request: GenerationRequest, output: str | os.PathLike[str] | None, *, overwrite: bool,
             want_frames: bool, want_audio: bool, cancel: CancelToken | None,
             refuse: Callable[[], None] | None = None) -> JobSpec:
    """The first steps, before anything starts: validate the request, `refuse` (the engine's own
    refusals of a valid request, e.g. the session's line protocol), resolve the output."""
    request.validate()
    if refuse is not None:
        refuse()
    output_path = resolve_output(output, overwrite=overwrite)
    return JobSpec(request=request, output_path=output_path, overwrite=overwrite, want_frames=want_frames,
                   want_audio=want_audio, cancel=cancel)


def check_disks(needs: Sequence[DiskNeed], *, one_at_a_time: bool = False) -> None:
    """Refuse a job the disks cannot take, before it starts. `one_at_a_time`: the clip is on one
    of them at a time (the session's moves it from h3's folder to the output's)."""
    if one_at_a_time:
        for need in needs:
            check_disk_space([need])
    else:
        check_disk_space(list(needs))


def run_job(job: JobSpec, run: Callable[[JobFiles], Rendered], *, mp4_for_frames: bool = False) -> GenerationResult:
    """The job's files, the engine's `run`, the frames, the published result; the files (and the
    output folders the job made) go again unless the result was published.

    `run` writes the MP4 to `files.mp4_temp` (None: no MP4 is wanted). `mp4_for_frames`: the
    engine reads the frames from the MP4, so one is made even when neither an output nor the
    audio is wanted."""
    with job_files(job.output_path, want_audio=job.want_audio or (mp4_for_frames and job.want_frames)) as files:
        rendered = run(files)
        frames = None
        if job.want_frames and rendered.read_frames is not None:
            raise_if_cancelled(job.cancel)
            frames = rendered.read_frames()
        raise_if_cancelled(job.cancel)
        result = finish_result(job.request, files.mp4_temp if job.writes_mp4 else None, job.output_path,
                               overwrite=job.overwrite, frames=frames, want_audio=job.want_audio,
                               timings=rendered.timings, command=rendered.command, engine_log=rendered.engine_log,
                               engine_variables=rendered.engine_variables, seed=rendered.seed)
        files.published = True
        return result


__all__ = ["JobSpec", "Rendered", "check_disks", "open_job", "run_job"]
