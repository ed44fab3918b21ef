"""POST /v1/videos and POST /v1/videos/sync: receive one body (JSON or multipart with files),
translate a peer's dialect, validate it exactly as `h3bridge generate` validates its flags, and
queue it; or refuse it with HTTP 400 in the body's dialect before anything is queued.

With `max_queued` a submission that finds that many jobs waiting is refused with HTTP 429 and
`Retry-After` before its body is read; an Idempotency-Key sent again answers with the job it made.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.requests import ClientDisconnect

from ...errors import H3BridgeError, QueueFullError, RequestError
from ...wire.peers import Dialect
from ...wire.videos import (
    http_words,
    DEFAULT_MODEL,
    IDEMPOTENCY_HEADER,
    VIDEOS_PATH,
    ErrorCode,
    JobStatus,
    VideoError,
    clip_shape,
    refusal_body,
    request_from_wire,
    request_to_wire,
)
from .. import dialects
from ..answers import dialect_error, error_response, job_dialect, job_json, queue_full
from ..jobs import StoredJob, idempotency_key_problem, new_job_id
from ..state import AppState, State
from ..uploads import ReceivedBody, receive_body

router = APIRouter()
_log = logging.getLogger("h3bridge.serve")
# After a refusal mid-upload, read (and drop) at most this much more of the body, so the client
# gets the 400 rather than a connection reset while it is still sending.
DRAIN_LIMIT = 64 * 1024 * 1024
SYNC_POLL_SECONDS = 0.25      # how often POST /v1/videos/sync looks at its job


@router.post(VIDEOS_PATH)
async def create_video(request: Request, state: State) -> JSONResponse:
    outcome = await Submission(request, state).run()
    return outcome if isinstance(outcome, Response) else job_json(outcome)


@router.post(VIDEOS_PATH + "/sync")
async def create_video_sync(request: Request, state: State) -> Response:
    """vLLM-Omni's synchronous variant: the job is queued as any other, and the answer is its
    MP4 once complete (X-Request-Id names the job). Past settings.sync_timeout the answer is 504
    naming the job, which keeps running: poll it and download its content."""
    outcome = await Submission(request, state).run()
    if isinstance(outcome, Response):
        return outcome
    started = time.monotonic()
    while (answer := await _sync_answer(state, outcome, started)) is None:
        await asyncio.sleep(SYNC_POLL_SECONDS)
    return answer


async def _sync_answer(state: AppState, job: StoredJob, started: float) -> Response | None:
    """The sync answer once there is one (the clip, its failure, its deletion, the timeout); None: wait."""
    current = await run_in_threadpool(state.store.get, job.id)
    dialect, named = job_dialect(job), {"X-Request-Id": job.id}
    if current is None:
        return dialect_error(404, VideoError(code=ErrorCode.NOT_FOUND.value, type="not_found_error",
                                             message=f"video {job.id} was deleted before it completed",
                                             param="video_id"), dialect)
    video = state.store.video_path(job.id)
    if current.status is JobStatus.COMPLETED and video.is_file():
        return FileResponse(video, media_type="video/mp4", filename=f"{job.id}.mp4",
                            headers={**named, "X-Inference-Time-S": f"{time.monotonic() - started:.3f}"})
    if current.status is JobStatus.FAILED:
        error = current.error or VideoError(code=ErrorCode.ENGINE_FAILED.value, message="the job failed")
        return dialect_error(500, error, dialect, named)
    if time.monotonic() - started > state.settings.sync_timeout:
        return dialect_error(504, _sync_timeout(job.id, state.settings.sync_timeout), dialect, named)
    return None


def _sync_timeout(job_id: str, seconds: float) -> VideoError:
    return VideoError(code="timeout", type="server_error", param="video_id",
                      message=f"video {job_id} did not complete within {seconds:g} s; it is still queued or rendering",
                      hint=f"poll GET {VIDEOS_PATH}/{job_id} and download {VIDEOS_PATH}/{job_id}/content once it "
                           f"is completed (POST {VIDEOS_PATH} does this without waiting)")


@dataclass
class Submission:
    """One POST body on its way to the queue, and what a refusal of it needs: its dialect (known
    once its field names are) and the uploads it named."""
    request: Request
    state: AppState
    job_id: str = field(default_factory=new_job_id)
    received: ReceivedBody | None = None
    translated: dialects.TranslatedBody | None = None
    dialect: Dialect = Dialect.H3BRIDGE

    def __post_init__(self) -> None:
        self.stream: AsyncIterator[bytes] = self.request.stream()
        self.key = self.request.headers.get(IDEMPOTENCY_HEADER)

    async def run(self) -> StoredJob | Response:
        """The queued job (or the one an Idempotency-Key sent again names), or the refusal."""
        early = await self._before_body()
        if early is not None:
            await _drain(self.stream)
            return early
        try:
            job = await self._receive()
        except BaseException as error:
            self._discard()
            refusal = self._refusal(error)
            if refusal is None:
                raise
            if isinstance(error, RequestError):
                await _drain(self.stream)
            return refusal
        self.state.worker.notify()
        return job

    async def _before_body(self) -> StoredJob | Response | None:
        """What is answered before the body is read: a bad or repeated Idempotency-Key, a full queue."""
        if self.key is not None:
            problem = idempotency_key_problem(self.key)
            if problem is not None:
                return error_response(400, ErrorCode.INVALID_REQUEST, f"the {IDEMPOTENCY_HEADER} header {problem}",
                                      param=IDEMPOTENCY_HEADER,
                                      hint="send 1 to 255 visible ASCII characters, or no such header")
            # Sent again (its client was killed before it wrote the job's id down): the same job,
            # before the queue's room is even counted.
            earlier = await run_in_threadpool(self.state.store.job_for_key, self.key)
            if earlier is not None:
                return earlier
        if self.state.settings.max_queued is not None:
            try:
                await run_in_threadpool(self.state.store.check_room, self.state.settings.max_queued)
            except QueueFullError as error:
                return queue_full(error)
        return None

    async def _receive(self) -> StoredJob:
        settings, inputs = self.state.settings, self.state.store.inputs_dir(self.job_id)
        self.received = await receive_body(self.request.headers.get("content-type", ""),
                                           self.request.headers.get("content-length"), self.stream, inputs,
                                           settings.limits)
        self.dialect = dialects.detect([name for name, _ in self.received.pairs]
                                       + [upload.field for upload in self.received.uploads])
        self.translated = await run_in_threadpool(dialects.translate, self.received.pairs, self.received.uploads,
                                                  inputs, settings.limits)
        job = await run_in_threadpool(self._accept, self.translated)
        if job.id != self.job_id:        # the same key was accepted meanwhile, beside this submission
            self._discard()
        return job

    def _accept(self, translated: dialects.TranslatedBody) -> StoredJob:
        request, model = request_from_wire(translated.pairs, translated.uploads)
        request.validate()
        if self.state.settings.preflight is not None:
            self.state.settings.preflight(request)
        fields = request_to_wire(request).fields     # canonical names: what the job re-reads after a restart
        shape = clip_shape(request)
        if translated.dialect is not Dialect.H3BRIDGE:
            shape[dialects.DIALECT_KEY] = translated.dialect.value
        return self.state.store.add(self.job_id, model=model or DEFAULT_MODEL, fields=fields,
                                    uploads=translated.uploads, shape=shape, max_queued=self.state.settings.max_queued,
                                    idempotency_key=self.key)

    def _refusal(self, error: BaseException) -> Response | None:
        """The answer to a failed submission; None: not a refusal (raised on)."""
        if isinstance(error, RequestError):
            uploads = (self.translated.uploads if self.translated is not None
                       else self.received.uploads if self.received is not None else ())
            return dialect_error(400, refusal_body(error, uploads).error, self.dialect)
        if isinstance(error, QueueFullError):     # the last place went to a submission beside this one
            return queue_full(error)
        if isinstance(error, H3BridgeError):      # the model check or the memory plan refused it
            return dialect_error(400, VideoError(code=ErrorCode.INVALID_REQUEST.value,
                                                 message=error.message_in(http_words), hint=error.hint_in(http_words),
                                                 type="invalid_request_error"), self.dialect)
        if isinstance(error, ClientDisconnect):
            # The client closed the connection mid-body: nothing to answer and nothing is wrong with
            # the server, so one quiet line (no traceback) and the partial upload is removed.
            _log.info("POST %s: the client went away before its body was complete; nothing was queued",
                      self.request.url.path)
            return error_response(400, ErrorCode.INVALID_REQUEST, "the request body ended before it was complete "
                                  "(the client closed the connection)", hint="send the whole body")
        return None

    def _discard(self) -> None:
        shutil.rmtree(self.state.store.job_dir(self.job_id), ignore_errors=True)


async def _drain(stream: AsyncIterator[bytes]) -> None:
    read = 0
    try:
        async for chunk in stream:
            read += len(chunk)
            if read > DRAIN_LIMIT:
                return
    except Exception:        # the client went away, or the stream was already consumed
        return
