"""The jobs once queued: list them, read one, download its MP4, delete (cancel) it."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, Response

from ...safeio.numbers import IntField
from ...wire.videos import VIDEOS_PATH, ErrorCode, JobStatus, VideoDeleted, VideoList
from .. import dialects
from ..answers import error_response, job_dialect, job_json, not_found
from ..jobs import StoredJob, is_job_id
from ..state import AppState, State

router = APIRouter()
VIDEO_PATH = VIDEOS_PATH + "/{video_id}"


def find_job(state: AppState, video_id: str) -> StoredJob | None:
    """The job `video_id` names; None for an unknown one or a string that is no job id at all."""
    return state.store.get(video_id) if is_job_id(video_id) else None


@router.get(VIDEOS_PATH)
def list_videos(state: State, after: str | None = None,
                limit: Annotated[int, IntField(1, 100, field="limit")] = 20, order: str = "desc") -> JSONResponse:
    if order not in ("asc", "desc"):
        return error_response(400, ErrorCode.INVALID_REQUEST, f"order={order!r} must be asc or desc", param="order")
    jobs, more = state.store.list(after=after, limit=limit, newest_first=order == "desc")
    data = [job.video_job().listed() for job in jobs]
    page = VideoList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                     has_more=more).model_dump(mode="json")
    page["data"] = [dialects.job_body(item, job_dialect(job)) for item, job in zip(data, jobs)]
    return JSONResponse(page)


@router.get(VIDEO_PATH)
def retrieve_video(video_id: str, state: State) -> JSONResponse:
    job = find_job(state, video_id)
    return not_found(video_id) if job is None else job_json(job)


@router.get(VIDEO_PATH + "/content")
def download_video(video_id: str, state: State, variant: str = "video") -> Response:
    job = find_job(state, video_id)
    if job is None:
        return not_found(video_id)
    if variant != "video":
        return error_response(400, ErrorCode.INVALID_REQUEST,
                              f"variant={variant!r}: this server has only the video (an MP4 with its audio)",
                              param="variant", hint="ask for variant=video", dialect=job_dialect(job))
    path = state.store.video_path(video_id)
    if job.status is not JobStatus.COMPLETED or not path.is_file():
        return error_response(409, ErrorCode.NOT_READY, f"video {video_id} is {job.status.value}; its content "
                              "is there once it is completed", param="video_id",
                              hint="poll GET /v1/videos/{id} until status is completed", dialect=job_dialect(job))
    return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")


@router.delete(VIDEO_PATH)
def delete_video(video_id: str, state: State) -> JSONResponse:
    if not is_job_id(video_id) or not state.store.remove(video_id):
        return not_found(video_id)
    state.worker.cancel(video_id)          # stops its engine if it is running, and waits for that
    state.store.remove_files(video_id)
    state.worker.events.end(video_id, "cancelled", None)      # its event streams end
    return JSONResponse(VideoDeleted(id=video_id).model_dump(mode="json"))
