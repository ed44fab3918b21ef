"""RemoteEngine following a job through the server's event stream (`GET /v1/videos/{id}/events`,
wire/events.py) instead of polling, read with httpx-sse.

The stream is read in a thread of its own that hands events over a queue, so a cancel is acted
on at once (the stream is closed under the reader) rather than at the next event. A stream that
breaks is opened again with `Last-Event-ID` (the server sends what was missed, or the state now)
up to RECONNECTS times in a row; after that, or when the server has no such stream (an older
h3bridge, a vLLM-Omni or SGLang server: any answer but a 200 event stream), the caller polls.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import ValidationError

from ..cancel import CancelToken
from ..errors import GenerationCancelled, MediaError, RemoteError
from ..progress import PreviewCallback, ProgressCallback, ProgressEvent
from ..wire.events import END_EVENT, PREVIEW_EVENT, PROGRESS_EVENT, EndData, PreviewData, ProgressData
from ..wire.videos import VIDEOS_PATH, JobStatus, VideoJob

if TYPE_CHECKING:
    from .remote import RemoteEngine

# Phase names of a remote job's ProgressEvents when the server names none (remote.py polls with them too).
QUEUED_PHASE = "queued on the server"
RUNNING_PHASE = "rendering on the server"
RECONNECTS = 5                # a broken stream is opened again this many times in a row, then polled
RECONNECT_PAUSE = 0.5         # seconds before the first reopening, doubled each time (at most 4 s)
CANCEL_CHECK_SECONDS = 0.05   # how often the waiting thread looks at the CancelToken


class StreamUnavailable(Exception):
    """The server offers no event stream for the job (the caller polls instead)."""


@dataclass
class _Item:
    kind: str                 # "open", "event", "closed", "broken", "unavailable"
    value: Any = None


class _Reader:
    """One connection to the stream, read in a daemon thread into `items`."""

    def __init__(self, engine: "RemoteEngine", job_id: str, last_event_id: str | None, items: queue.Queue) -> None:
        self.items = items
        self._response: httpx.Response | None = None
        self._closed = threading.Event()
        headers = dict(engine._headers())
        headers["Accept"] = "text/event-stream"
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self._thread = threading.Thread(target=self._run, args=(engine._http(), f"{VIDEOS_PATH}/{job_id}/events",
                                                                headers),
                                        name="h3bridge-remote-events", daemon=True)
        self._thread.start()

    def _run(self, client: httpx.Client, path: str, headers: dict[str, str]) -> None:
        from httpx_sse import SSEError, connect_sse
        try:
            with connect_sse(client, "GET", path, headers=headers) as source:
                self._response = source.response
                if self._closed.is_set():
                    return
                kind = source.response.headers.get("content-type", "").partition(";")[0].strip()
                if source.response.status_code != 200 or kind != "text/event-stream":
                    source.response.read()
                    self.items.put(_Item("unavailable", source.response))
                    return
                self.items.put(_Item("open"))
                for event in source.iter_sse():
                    self.items.put(_Item("event", event))
            self.items.put(_Item("closed"))
        except (httpx.HTTPError, SSEError, OSError, ValueError) as error:
            if not self._closed.is_set():
                self.items.put(_Item("broken", error))

    def close(self) -> None:
        """Stop reading (from another thread): closing the response ends the reader's blocking read."""
        self._closed.set()
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:        # noqa: BLE001 - closing a stream another thread reads; nothing to save
                pass
        # A read blocked in the socket may only return at the server's next keep-alive: the
        # daemon thread is not waited for beyond a moment (it only ever puts into a queue nobody reads).
        self._thread.join(0.5)


def follow_events(engine: "RemoteEngine", job: VideoJob, started: float, on_progress: ProgressCallback | None,
                  on_preview: PreviewCallback | None, cancel: CancelToken | None) -> VideoJob | None:
    """Follow `job` through its event stream until it ends: the completed job, or RemoteError
    (failed, or deleted on the server), or GenerationCancelled. None: follow it by polling from
    here (the stream broke RECONNECTS times in a row). StreamUnavailable: the server has no stream."""
    items: queue.Queue[_Item] = queue.Queue()
    last_event_id: str | None = None
    opened_once = False
    failures = 0
    reader = _Reader(engine, job.id, None, items)
    try:
        while True:
            try:
                item = items.get(timeout=CANCEL_CHECK_SECONDS)
            except queue.Empty:
                if cancel is not None and cancel.cancelled:
                    raise GenerationCancelled("generation cancelled; the server's job was deleted and no output "
                                              "was kept") from None
                continue
            if item.kind == "unavailable":
                if opened_once or not _has_no_streams(item.value):
                    return None          # busy, or the job is gone: this job is polled (which says why)
                raise StreamUnavailable()
            if item.kind == "open":
                opened_once, failures = True, 0
                continue
            if item.kind in ("closed", "broken"):
                failures += 1
                if failures > RECONNECTS:
                    return None
                pause = min(4.0, RECONNECT_PAUSE * 2 ** (failures - 1))
                if cancel is not None and cancel.wait(pause):
                    raise GenerationCancelled("generation cancelled; the server's job was deleted and no output "
                                              "was kept")
                if cancel is None:
                    time.sleep(pause)
                reader = _Reader(engine, job.id, last_event_id, items)
                continue
            event = item.value
            if event.id:
                last_event_id = event.id
            ended = _handle(engine, job, event.event, event.data, started, on_progress, on_preview)
            if cancel is not None and cancel.cancelled:
                raise GenerationCancelled("generation cancelled; the server's job was deleted and no output was kept")
            if ended is not None:
                return ended
    finally:
        reader.close()


def _has_no_streams(response: httpx.Response) -> bool:
    """Whether an answer to the stream's URL says the server has no event streams at all (no such
    route, or not an event stream), rather than that it has none for now (429: too many open; a
    job it no longer has: its 404 names `video_id`; a refused key)."""
    if response.status_code == 200:
        return True          # answered, but not with an event stream
    if response.status_code == 404:
        try:
            error = response.json().get("error")
        except (ValueError, AttributeError):
            return True
        return not (isinstance(error, dict) and error.get("param") == "video_id")
    return response.status_code in (405, 501)


def _handle(engine: "RemoteEngine", job: VideoJob, kind: str, data: str, started: float,
            on_progress: ProgressCallback | None, on_preview: PreviewCallback | None) -> VideoJob | None:
    """One event: progress and previews to the callbacks; the end as the completed job or an error."""
    if kind == PROGRESS_EVENT:
        progress = _parsed(ProgressData, data)
        if progress is not None and on_progress is not None:
            queued = progress.status is JobStatus.QUEUED
            on_progress(ProgressEvent(progress.phase or (QUEUED_PHASE if queued else RUNNING_PHASE),
                                      progress.done if progress.total else progress.progress,
                                      progress.total or 100, progress.fraction,
                                      time.monotonic() - started, progress.eta))
    elif kind == PREVIEW_EVENT and on_preview is not None:
        preview = _parsed(PreviewData, data)
        try:
            frame = preview.frame() if preview is not None else None
        except (MediaError, ValueError):     # a preview that does not decode is skipped, never the job
            frame = None
        if frame is not None:
            on_preview(frame)
    elif kind == END_EVENT:
        end = _parsed(EndData, data)
        if end is None:
            return None        # the job's row says how it ended: the stream closes and is opened again
        if end.status == "completed" and end.job is not None:
            return end.job
        if end.status == "failed" and end.job is not None and end.job.error is not None:
            error = end.job.error
            raise RemoteError(f"the server at {engine.base_url} failed job {job.id}: {error.message}",
                              url=engine.base_url, engine_message=error.message,
                              hint=error.hint or "the message is the server's own; see its log")
        raise RemoteError(f"the server at {engine.base_url} no longer has job {job.id} (it was deleted there "
                          "while it ran)", url=engine.base_url, status=404,
                          hint="the job was deleted or the server lost it; run the job again")
    return None


def _parsed(model, data: str):
    """An event's body, or None for one this client does not understand (a newer server's)."""
    try:
        return model.model_validate_json(data)
    except (ValidationError, ValueError):
        return None


__all__ = ["StreamUnavailable", "follow_events"]
