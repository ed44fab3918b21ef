"""A storyboard's contact sheet: every take of the shots with takes, a row each (shot, take, seed,
four frames), the take the film uses marked "picked"; written as takes.png in the job folder by
every run that has takes, so the user sees what to --pick (the CLI), or the node shows it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .runner import ShotOutcome

SHEET_NAME = "takes.png"


def sheet_rows(shots: "Sequence[ShotOutcome]") -> int:
    """How many rows (takes) the sheet of `shots` has: 0 when no shot has takes."""
    return sum(len(shot.takes) for shot in shots if len(shot.takes) > 1)


def write_story_sheet(shots: "Sequence[ShotOutcome]", job_dir: Path) -> Path | None:
    """Draw the sheet of `shots` and publish it as job_dir/takes.png (h3bridge's own file in its own
    folder: replaced each run, since another pick moves the mark); None when no shot has takes."""
    if not sheet_rows(shots):
        return None
    from ..media.decode import decode_frames_at
    from ..media.sheet import SheetRow, frame_indices
    from ..takes import write_sheet
    rows = [SheetRow(take.take, take.seed, tuple(decode_frames_at(take.video_path, frame_indices(shot.frame_count))),
                     shot=shot.index, picked=take.take == shot.pick)
            for shot in shots if len(shot.takes) > 1 for take in shot.takes]
    write_sheet(job_dir / SHEET_NAME, rows, overwrite=True, field="job_dir")
    return job_dir / SHEET_NAME


__all__ = ["SHEET_NAME", "sheet_rows", "write_story_sheet"]
