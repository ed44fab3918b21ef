"""A storyboard for a host with a text box and array outputs (the ComfyUI H3 Storyboard node).

The job directory is named by the host's job name, so queueing the same storyboard again resumes
it: finished shots are kept, edited ones (and what continues from them) are rendered again.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..cancel import CancelToken, PauseControl
from ..engines.protocol import Engine
from ..errors import RequestError
from .assemble import film_arrays
from .runner import StoryProgressCallback, StoryResult, run_story
from .text import storyboard_from_text


@dataclass
class HostStoryOutputs:
    video_path: Path
    frames: np.ndarray | None        # uint8 [F, H, W, 3], None unless asked for
    audio: np.ndarray                # float32 [2, samples] at 32 kHz
    result: StoryResult
    summary: str


def job_folder(root: Path, job_name: str) -> Path:
    """root/NAME for a job name made of letters, digits, '-', '_' and '.' (never a path)."""
    name = job_name.strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise RequestError(f"job name {job_name!r} must be 1-100 letters, digits, '-', '_' or '.'",
                           field="job_name", hint="e.g. lighthouse-film")
    return root / name


def render_story_text(shots_text: str, defaults: Mapping[str, Any], *, engine: Engine, fallback: Engine | None = None,
                      jobs_root: Path, job_name: str, want_frames: bool,
                      on_progress: StoryProgressCallback | None = None,
                      on_notice: Callable[[str], None] | None = None,
                      cancel: CancelToken | None = None, force: bool = False,
                      film_root: Path | None = None, pause: PauseControl | None = None) -> HostStoryOutputs:
    """`film_root`: where the film is assembled (default: beside the job folder). A host that saves
    the film itself (ComfyUI's Save Video) gives its temporary folder, so the film is kept once."""
    storyboard = storyboard_from_text(shots_text, defaults)
    folder = job_folder(jobs_root, job_name)
    film = (film_root if film_root is not None else folder.parent) / (folder.name + ".mp4")
    folder.parent.mkdir(parents=True, exist_ok=True)
    film.parent.mkdir(parents=True, exist_ok=True)
    result = run_story(storyboard, film, engine=engine, fallback=fallback, job_dir=folder,
                       on_progress=on_progress, on_notice=on_notice, cancel=cancel, force=force, pause=pause)
    first = storyboard.base_request(1)
    frames, audio = film_arrays(result.pieces, first.width, first.height, want_frames=want_frames, cancel=cancel)
    summary = (f"{len(result.shots)} shots, {result.film_frames} frames ({result.film_frames / 24:.1f} s) "
               f"{first.width}x{first.height}; rendered {result.rendered}, kept {len(result.shots) - result.rendered}; "
               f"film {film}; job directory {folder}")
    return HostStoryOutputs(film, frames, audio, result, summary)


__all__ = ["HostStoryOutputs", "job_folder", "render_story_text"]
