"""GET /v1/videos/{id}/events: a job's progress as server-sent events (event_stream.py), with the
number of open streams bounded per client and in all (progress_feed.StreamSlots)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ...wire.events import EVENTS_PATH
from ...wire.videos import ErrorCode
from ..answers import error_response, job_dialect, not_found
from ..event_stream import event_stream_response
from ..state import State
from .videos import find_job

router = APIRouter()


@router.get(EVENTS_PATH)
async def video_events(video_id: str, request: Request, state: State) -> Response:
    job = await run_in_threadpool(find_job, state, video_id)
    if job is None:
        return not_found(video_id)
    client = request.client.host if request.client is not None else ""
    slots = state.settings.stream_slots
    if not slots.take(client):
        return error_response(429, ErrorCode.INVALID_REQUEST,
                              f"too many open event streams (at most {slots.per_client} per client, "
                              f"{slots.total} in all)", param="video_id", kind="rate_limit_error",
                              hint="close the streams of jobs you no longer follow, or poll GET /v1/videos/{id}",
                              headers={"Retry-After": "5"}, dialect=job_dialect(job))
    return event_stream_response(video_id, state.store, state.worker.events, slots, client,
                                 request.headers.get("last-event-id"), request.is_disconnected)
