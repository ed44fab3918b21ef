"""POST /v1/videos/{id}/pause and /resume: stop a running job's engine where it is (its memory stays
resident, so a resume goes on at once; the jobs queued behind it wait) and continue it. Both answer
with the job (status `paused`, then `in_progress`); pausing a paused job, or resuming a running one,
changes nothing. A job that is queued or finished cannot be paused: 409 in the job's dialect."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ...wire.peers import Dialect
from ...wire.videos import VIDEOS_PATH, ErrorCode, JobStatus
from ..answers import error_response, job_dialect, job_json, not_found
from ..state import AppState, State
from .videos import VIDEO_PATH, find_job

router = APIRouter()
PAUSE_PATH, RESUME_PATH = VIDEO_PATH + "/pause", VIDEO_PATH + "/resume"


@router.post(PAUSE_PATH)
async def pause_video(video_id: str, state: State) -> JSONResponse:
    return await run_in_threadpool(set_paused, state, video_id, True)


@router.post(RESUME_PATH)
async def resume_video(video_id: str, state: State) -> JSONResponse:
    return await run_in_threadpool(set_paused, state, video_id, False)


def set_paused(state: AppState, video_id: str, paused: bool) -> JSONResponse:
    job = find_job(state, video_id)
    if job is None:
        return not_found(video_id)
    if not state.worker.set_paused(video_id, paused):
        job = find_job(state, video_id) or job      # it may have ended meanwhile: say how
        return not_running(job.id, job.status, paused, job_dialect(job))
    job = find_job(state, video_id)
    return not_found(video_id) if job is None else job_json(job)


def not_running(video_id: str, status: JobStatus, paused: bool, dialect: Dialect) -> JSONResponse:
    verb = "paused" if paused else "resumed"
    job_url = f"{VIDEOS_PATH}/{video_id}"
    if status is JobStatus.QUEUED:
        hint = (f"pause it once GET {job_url} says in_progress, or delete it with DELETE {job_url}" if paused
                else f"it starts when its turn comes; follow it with GET {job_url}")
    else:
        hint = f"a {status.value} job has nothing to pause or resume; read it with GET {job_url}"
    return error_response(409, ErrorCode.NOT_RUNNING, f"video {video_id} is {status.value}; only a running job "
                          f"can be {verb}", param="video_id", hint=hint, dialect=dialect)
