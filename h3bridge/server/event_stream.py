"""`GET /v1/videos/{id}/events`: one job's progress_feed as server-sent events (sse-starlette).

The stream starts with the job's state now (its newest progress, or its status for a queued
job), then every progress event and preview as the worker publishes them, and ends with one
`end` event when the job is completed, failed or deleted (a cancel). A client that reconnects
with `Last-Event-ID` gets what it missed (or, when the feed no longer holds that far back, the
state now). Between events the stream sleeps on an asyncio.Event the hub sets; it also looks at
the job's row now and then, which catches what was not published (a job deleted while queued,
or finished before this server's run).
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

from fastapi.concurrency import run_in_threadpool
from sse_starlette import EventSourceResponse, ServerSentEvent

from .jobs import JobStore, StoredJob
from ..wire.events import END_EVENT, PROGRESS_EVENT, EndData, ProgressData
from .progress_feed import KEEPALIVE_SECONDS, ProgressHub, StreamSlots
from ..wire.videos import JobStatus

ROW_CHECK_SECONDS = 2.0      # how often a quiet stream re-reads the job's row
SEND_TIMEOUT_SECONDS = 30.0  # a client that takes no data for this long is dropped


def end_of(job: StoredJob | None, job_id: str) -> EndData | None:
    """The end event a finished job's row says (None while it is queued or running)."""
    if job is None:
        return EndData(id=job_id, status="cancelled")
    if job.status is JobStatus.COMPLETED:
        return EndData(id=job_id, status="completed", job=job.video_job())
    if job.status is JobStatus.FAILED:
        return EndData(id=job_id, status="failed", job=job.video_job())
    return None


def state_of(job: StoredJob) -> ProgressData:
    return ProgressData(id=job.id, status=job.status, phase=job.phase, progress=job.progress,
                        fraction=job.progress / 100.0)


async def job_events(job_id: str, store: JobStore, hub: ProgressHub, cursor: int,
                     disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[ServerSentEvent]:
    wake = asyncio.Event()
    hub.subscribe(job_id, wake)
    try:
        first = True
        while True:
            wake.clear()
            events = hub.since(job_id, cursor)
            if first and not events and cursor == 0:    # nothing published (queued, or before this run): the row's state
                job = await run_in_threadpool(store.get, job_id)
                end = end_of(job, job_id)
                if end is not None:
                    yield ServerSentEvent(end.model_dump_json(), event=END_EVENT, id=hub.event_id(hub.last_seq(job_id)))
                    return
                assert job is not None
                # (the row is no feed event: its id keeps the cursor, so a reconnect from it misses nothing)
                yield ServerSentEvent(state_of(job).model_dump_json(), event=PROGRESS_EVENT, id=hub.event_id(cursor))
            first = False
            for event in events:
                cursor = event.seq
                yield ServerSentEvent(event.data, event=event.kind, id=hub.event_id(event.seq))
                if event.kind == END_EVENT:
                    return
            if await disconnected():
                return
            try:
                await asyncio.wait_for(wake.wait(), ROW_CHECK_SECONDS)
            except asyncio.TimeoutError:
                job = await run_in_threadpool(store.get, job_id)
                end = end_of(job, job_id)
                if end is not None and not hub.since(job_id, cursor):    # finished without a word to the hub
                    yield ServerSentEvent(end.model_dump_json(), event=END_EVENT,
                                          id=hub.event_id(hub.last_seq(job_id)))
                    return
    finally:
        hub.unsubscribe(job_id, wake)


class _HeldStream(EventSourceResponse):
    """An event stream that gives its slot back however it ends (the client gone before the
    first byte included: then the stream's generator never runs)."""

    def __init__(self, *args, release: Callable[[], None], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def event_stream_response(job_id: str, store: JobStore, hub: ProgressHub, slots: StreamSlots, client: str,
                          last_event_id: str | None, disconnected: Callable[[], Awaitable[bool]]) -> EventSourceResponse:
    """The stream of a job that exists, holding one of `slots` (taken by the caller) until it ends."""
    released = []

    def release() -> None:
        if not released:
            released.append(True)
            slots.give_back(client)

    return _HeldStream(job_events(job_id, store, hub, hub.cursor_of(last_event_id), disconnected),
                       ping=KEEPALIVE_SECONDS, send_timeout=SEND_TIMEOUT_SECONDS, release=release,
                       headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


__all__ = ["event_stream_response", "job_events"]
