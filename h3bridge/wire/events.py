"""A job's progress as server-sent events, as both ends read it: what `GET /v1/videos/{id}/events`
streams (server/progress_feed.py publishes it) and what RemoteEngine reads back
(engines/remote_events.py). One definition for both sides; no web framework here.

    event: progress   data: ProgressData   (phase, step done/total, fraction, ETA)
    event: preview    data: PreviewData    (the denoised estimate after a step, a PNG in base64)
    event: end        data: EndData        (completed / failed / cancelled, with the job): the last
"""
from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from pydantic import BaseModel

from ..progress import PreviewFrame
from .videos import VIDEOS_PATH, JobStatus, VideoJob

EVENTS_PATH = VIDEOS_PATH + "/{video_id}/events"
PROGRESS_EVENT, PREVIEW_EVENT, END_EVENT = "progress", "preview", "end"
PREVIEW_MAX_SIDE = 512      # previews are cut down (every k-th pixel) to at most this many pixels a side


class ProgressData(BaseModel):
    id: str
    status: JobStatus
    phase: str | None = None
    done: int = 0
    total: int = 0
    fraction: float = 0.0
    progress: int = 0              # the job object's 0-100
    eta: float | None = None       # seconds left, from the server's past runs of this shape
    elapsed: float = 0.0           # seconds since the engine started the job


class PreviewData(BaseModel):
    id: str
    step: int
    total_steps: int
    frame_index: int
    width: int
    height: int
    png: str                       # base64 of a PNG (RGB)

    @classmethod
    def of(cls, job_id: str, preview: PreviewFrame) -> "PreviewData":
        from ..media.png import png_bytes
        image = preview.image
        step = max(1, -(-max(image.shape[:2]) // PREVIEW_MAX_SIDE))
        image = np.ascontiguousarray(image[::step, ::step])
        return cls(id=job_id, step=preview.step, total_steps=preview.total_steps, frame_index=preview.frame_index,
                   width=image.shape[1], height=image.shape[0], png=base64.b64encode(png_bytes(image)).decode("ascii"))

    def frame(self) -> PreviewFrame:
        from ..media.png import image_from_png
        return PreviewFrame(step=self.step, total_steps=self.total_steps, frame_index=self.frame_index,
                            image=image_from_png(base64.b64decode(self.png, validate=True)))


EndStatus = Literal["completed", "failed", "cancelled"]


class EndData(BaseModel):
    id: str
    status: EndStatus
    job: VideoJob | None = None    # the job as GET /v1/videos/{id} shows it (None once deleted)


__all__ = ["END_EVENT", "EVENTS_PATH", "EndData", "EndStatus", "PREVIEW_EVENT", "PREVIEW_MAX_SIDE", "PROGRESS_EVENT",
           "PreviewData", "ProgressData"]
