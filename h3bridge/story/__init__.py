"""Storyboards: chained shots rendered on any Engine, resumable, assembled into one film.

storyboard.py (the TOML/Python structure) -> plan.py (every shot checked before the first
starts) -> runner.py (render or reuse each shot; the job directory's manifest, jobdir.py)
-> assemble.py (one MP4, streamed; mp4.py writes it).
"""
from __future__ import annotations

from .assemble import FilmChunk, FilmPiece, iter_film
from .jobdir import JobDir, JobDirError, Manifest, ShotRecord
from .plan import PlannedShot, StoryPlan, plan_story, tail_frames
from .runner import MAX_PARALLEL, ShotInFlight, ShotOutcome, StoryProgress, StoryResult, default_job_dir, run_story
from .storyboard import Continuation, Shot, Storyboard

__all__ = ["MAX_PARALLEL", "ShotInFlight", "Continuation", "FilmChunk", "FilmPiece", "JobDir", "JobDirError", "Manifest", "PlannedShot", "Shot",
           "ShotOutcome", "ShotRecord", "StoryPlan", "StoryProgress", "StoryResult", "Storyboard",
           "default_job_dir", "iter_film", "plan_story", "run_story", "tail_frames"]
