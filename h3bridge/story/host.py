"""A storyboard for a host with a text box and array outputs (the ComfyUI H3 Storyboard node).

The job directory is named by the host's job name, so queueing the same storyboard again resumes
it: finished shots are kept, edited ones (and what continues from them) are rendered again.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..cancel import CancelToken, PauseControl
from ..engines.protocol import Engine
from ..errors import H3BridgeError, RequestError
from ..fixes import Fix
from .assemble import film_arrays
from .runner import StoryProgressCallback, StoryResult, run_story
from .sheet import SHEET_NAME, sheet_rows
from .text import storyboard_from_text


@dataclass
class HostStoryOutputs:
    video_path: Path
    frames: np.ndarray | None        # uint8 [F, H, W, 3], None unless asked for
    audio: np.ndarray                # float32 [2, samples] at 32 kHz
    result: StoryResult
    summary: str
    # With takes: the contact sheet of every shot's takes (uint8 [H, W, 3], also saved as takes.png in
    # the job folder) and how many rows (takes) it has
    sheet: np.ndarray | None = None
    sheet_rows: int = 0


class StoryStoppedError(H3BridgeError):
    """A host's storyboard stopped after a shot, as its user asked (stop_after_shot): the shots
    rendered so far are kept in the job folder and the next run with the same shots goes on."""

    def __init__(self, shot: int | None, job_dir: Path) -> None:
        done = f"after shot {shot}" if shot is not None else "before rendering a shot"
        super().__init__(f"the storyboard stopped {done}, as asked: the finished shots are kept in {job_dir} and "
                         "the engine's memory is free",
                         hint="run it again with the same shots and job_name to go on from the next shot")
        self.shot, self.job_dir = shot, job_dir


def read_picks(text: str, field: str = "pick") -> dict[int, int]:
    """`2=3, 4=1` (shot=take, separated by commas or spaces) as {2: 3, 4: 1}, each number read by
    safeio.numbers; RequestError naming `field` otherwise."""
    from ..safeio.numbers import read_int
    example = f'e.g. {field} = "2=3, 4=1" (the film uses take 3 of shot 2 and take 1 of shot 4)'
    picks: dict[int, int] = {}
    for item in re.split(r"[\s,]+", text.strip()):
        if not item:
            continue
        shot, equals, take = item.partition("=")
        if not equals:
            raise RequestError(f"{field} {item!r} is not SHOT=TAKE", field=field, hint=example)
        picks[read_int(shot, field=field, minimum=1, hint=example)] = read_int(take, field=field, minimum=1,
                                                                            hint=example)
    return picks


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
                      on_notice: "Callable[[str | Fix], None] | None" = None,
                      cancel: CancelToken | None = None, force: bool = False,
                      film_root: Path | None = None, takes: int = 1, picks: str = "",
                      pause: PauseControl | None = None,
                      stop_after_shot: threading.Event | None = None) -> HostStoryOutputs:
    """`film_root`: where the film is assembled (default: beside the job folder). A host that saves
    the film itself (ComfyUI's Save Video) gives its temporary folder, so the film is kept once.
    `takes`: every shot's takes (a shot's [takes=N] wins); `picks`: "2=3, 4=1", the take the film
    uses of those shots (another pick renders nothing but what continues from the shot).
    `stop_after_shot`: once set, the story ends after the shot it is rendering, with
    StoryStoppedError (no film yet; the next run goes on)."""
    chosen = read_picks(picks)
    storyboard = storyboard_from_text(shots_text, {**defaults, **({"takes": takes} if takes != 1 else {})})
    folder = job_folder(jobs_root, job_name)
    film = (film_root if film_root is not None else folder.parent) / (folder.name + ".mp4")
    folder.parent.mkdir(parents=True, exist_ok=True)
    film.parent.mkdir(parents=True, exist_ok=True)
    # the host's picks are whole: a shot with takes that is not named uses its first take
    chosen = {index: chosen.get(index, 1) for index in range(1, len(storyboard.shots) + 1)
              if storyboard.takes_for(index) > 1 or index in chosen}
    result = run_story(storyboard, film, engine=engine, fallback=fallback, job_dir=folder,
                       on_progress=on_progress, on_notice=on_notice, cancel=cancel, force=force, picks=chosen,
                       pause=pause, stop_after_shot=stop_after_shot)
    if stop_after_shot is not None and stop_after_shot.is_set() and not result.assembled and result.output is None:
        raise StoryStoppedError(result.stopped_after_shot, folder)
    first = storyboard.base_request(1)
    frames, audio = film_arrays(result.pieces, first.width, first.height, want_frames=want_frames, cancel=cancel)
    summary = (f"{len(result.shots)} shots, {result.film_frames} frames ({result.film_frames / 24:.1f} s) "
               f"{first.width}x{first.height}; rendered {result.rendered}, kept {len(result.shots) - result.rendered}; "
               f"film {film}; job directory {folder}")
    sheet = None
    if result.contact_sheet is not None:     # the runner drew it (story/sheet.py); the node shows it
        from ..media.png import image_from_png
        sheet = image_from_png(result.contact_sheet.read_bytes())
        summary += ("; takes: " + ", ".join(f"shot {shot.index} take {shot.pick} of {len(shot.takes)}"
                                            for shot in result.shots if len(shot.takes) > 1)
                    + f" (rendered {result.rendered_takes}); contact sheet {folder / SHEET_NAME}")
    return HostStoryOutputs(film, frames, audio, result, summary, sheet, sheet_rows(result.shots))


__all__ = ["HostStoryOutputs", "StoryStoppedError", "job_folder", "read_picks", "render_story_text"]
