"""The HTTP surface of `h3bridge serve` (FastAPI): the OpenAI Videos API subset SGLang Diffusion and
vLLM-Omni implement, over the durable queue (jobs.py) and the worker (worker.py).

    POST   /v1/videos               submit (JSON, or multipart with files) -> the job, queued
    GET    /v1/videos               list jobs (after, limit, order)
    GET    /v1/videos/{id}          the job: status, progress 0-100, error
    GET    /v1/videos/{id}/content  the MP4, once completed
    GET    /v1/videos/{id}/events   the job's progress as server-sent events (event_stream.py)
    DELETE /v1/videos/{id}          cancel (a running job's engine is stopped) and delete its files
    GET    /health                  readiness (no key needed; says nothing about jobs)

With `max_queued` (serve --max-queued) a submission that finds that many jobs waiting is refused
with HTTP 429 and `Retry-After` before its body is read: a load balancer in front of several
servers (LiteLLM's proxy, h3bridge fleet) cools this one down and sends the job to another.

A submission is validated exactly as `h3bridge generate` validates its flags (the same
GenerationRequest.validate, and the same model check and memory plan) and refused with HTTP 400
and the library's message before it is queued. With an API key every route but /health needs
`Authorization: Bearer <key>`, compared in constant time.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..errors import H3BridgeError, QueueFullError, RequestError
from ..request import GenerationRequest
from ..safeio.numbers import IntField
from ..wire.events import EVENTS_PATH
from ..wire.peers import Dialect
from ..wire.videos import (
    DEFAULT_MODEL,
    HEALTH_PATH,
    IDEMPOTENCY_HEADER,
    VIDEOS_PATH,
    ErrorCode,
    JobStatus,
    VideoDeleted,
    VideoError,
    VideoList,
    clip_shape,
    http_words,
    refusal_body,
    request_from_wire,
    request_to_wire,
)
from . import dialects
from .jobs import DEFAULT_MAX_QUEUED, JobStore, StoredJob, idempotency_key_problem, is_job_id, new_job_id
from .progress_feed import StreamSlots
from .uploads import ReceivedBody, UploadLimits, receive_body
from .worker import Worker

_log = logging.getLogger("h3bridge.serve")
# After a refusal mid-upload, read (and drop) at most this much more of the body, so the client
# gets the 400 rather than a connection reset while it is still sending.
DRAIN_LIMIT = 64 * 1024 * 1024
SYNC_POLL_SECONDS = 0.25      # how often POST /v1/videos/sync looks at its job


@dataclass
class ServeSettings:
    data_dir: Path
    api_key: str | None = None
    limits: UploadLimits = field(default_factory=UploadLimits)
    cors_origins: tuple[str, ...] = ()
    engine_name: str = "session"
    # The checks `generate` makes before it starts an engine, beyond the request's own rules
    # (cli.preflight_generate: the model check and the memory plan); raises H3BridgeError.
    preflight: Callable[[GenerationRequest], None] | None = None
    model: dict[str, object] | None = None     # /health's model state (server/command.py model_health)
    sync_timeout: float = 1800.0               # POST /v1/videos/sync waits at most this long for its clip
    stream_slots: StreamSlots = field(default_factory=StreamSlots)     # open event streams, bounded
    max_queued: int | None = DEFAULT_MAX_QUEUED    # jobs waiting behind the running one; None: no bound
    previews: bool = False                     # the event streams carry denoise previews (serve --previews)


def error_response(status: int, code: ErrorCode, message: str, *, param: str | None = None,
                   hint: str | None = None, kind: str = "invalid_request_error",
                   headers: dict[str, str] | None = None, dialect: Dialect = Dialect.H3BRIDGE) -> JSONResponse:
    """An error answer in `dialect`'s shape: the job's own dialect once there is a job (its clients
    read every answer about it alike); h3bridge's before a body or a job says which (a missing key,
    an unknown video, a full queue)."""
    error = VideoError(code=code.value, message=message, param=param, hint=hint, type=kind)
    return JSONResponse(dialects.error_body(status, error, dialect), status_code=status, headers=headers)


def create_app(settings: ServeSettings, store: JobStore, worker: Worker) -> FastAPI:
    app = FastAPI(title="h3bridge serve", description="MiniMax-H3 on this Mac over the OpenAI Videos API",
                  version="1", docs_url=None, redoc_url=None, openapi_url=None)
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"])
    key = settings.api_key.encode("utf-8") if settings.api_key else None

    @app.middleware("http")
    async def require_key(request: Request, call_next):
        if key is not None and request.url.path != HEALTH_PATH and request.method != "OPTIONS":
            header = request.headers.get("authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8"), key):
                return error_response(401, ErrorCode.UNAUTHORIZED,
                                      "missing API key" if not header else "wrong API key",
                                      hint="send Authorization: Bearer <key> (the server's --api-key or "
                                           "$H3BRIDGE_API_KEY)", kind="authentication_error",
                                      headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.NOT_FOUND if error.status_code == 404 else ErrorCode.INVALID_REQUEST
        return error_response(error.status_code, code, str(error.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part not in ("query", "path"))
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, RequestError):       # a safeio.numbers refusal: its own words and fix
            return error_response(400, ErrorCode.INVALID_REQUEST, cause.message, param=cause.field or where or None,
                                  hint=cause.hint)
        return error_response(400, ErrorCode.INVALID_REQUEST, f"{where}: {first.get('msg', 'invalid')}",
                              param=where or None)

    def not_found(job_id: str) -> JSONResponse:
        return error_response(404, ErrorCode.NOT_FOUND, f"no video {job_id!r} on this server",
                              param="video_id", kind="not_found_error",
                              hint="list the server's videos with GET /v1/videos")

    @app.get(HEALTH_PATH)
    def health() -> dict[str, object]:
        return {"status": "ok", "engine": settings.engine_name, "model": settings.model, "previews": settings.previews}

    def job_json(job: StoredJob) -> dict[str, object]:
        """The job as its submitter's dialect reads it (dialects.py)."""
        return dialects.job_body(job.video_job(), dialects.job_dialect(job.shape))

    def queue_full(error: QueueFullError) -> JSONResponse:
        # h3bridge's own error shape in every dialect: the refusal comes before the body (and so the
        # dialect) is read, and what a router (LiteLLM) acts on is the status and Retry-After.
        return error_response(429, ErrorCode.QUEUE_FULL, error.message, hint=error.hint, kind="rate_limit_error",
                              headers={"Retry-After": str(error.retry_after)})

    async def submit(request: Request) -> tuple[StoredJob | None, JSONResponse | None]:
        """Receive, translate (a peer's dialect), validate and queue one body: the job, or the refusal."""
        job_id = new_job_id()
        inputs = store.inputs_dir(job_id)
        stream = request.stream()
        received: ReceivedBody | None = None
        translated: dialects.TranslatedBody | None = None
        dialect = Dialect.H3BRIDGE
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is not None:
            problem = idempotency_key_problem(key)
            if problem is not None:
                await _drain(stream)
                return None, error_response(400, ErrorCode.INVALID_REQUEST, f"the {IDEMPOTENCY_HEADER} header {problem}",
                                            param=IDEMPOTENCY_HEADER,
                                            hint="send 1 to 255 visible ASCII characters, or no such header")
            # Sent again (its client was killed before it wrote the job's id down): the same job,
            # before the queue's room is even counted.
            earlier = await run_in_threadpool(store.job_for_key, key)
            if earlier is not None:
                await _drain(stream)
                return earlier, None
        if settings.max_queued is not None:
            try:
                await run_in_threadpool(store.check_room, settings.max_queued)
            except QueueFullError as error:
                await _drain(stream)
                return None, queue_full(error)
        try:
            received = await receive_body(request.headers.get("content-type", ""),
                                          request.headers.get("content-length"), stream, inputs, settings.limits)
            dialect = dialects.detect([name for name, _ in received.pairs] + [u.field for u in received.uploads])
            translated = await run_in_threadpool(dialects.translate, received.pairs, received.uploads, inputs,
                                                 settings.limits)
            job = await run_in_threadpool(_accept, job_id, translated, key)
            if job.id != job_id:        # the same key was accepted meanwhile, beside this submission
                shutil.rmtree(store.job_dir(job_id), ignore_errors=True)
        except RequestError as error:
            shutil.rmtree(store.job_dir(job_id), ignore_errors=True)
            await _drain(stream)
            uploads = translated.uploads if translated is not None else received.uploads if received is not None else ()
            body = refusal_body(error, uploads)
            return None, JSONResponse(dialects.error_body(400, body.error, dialect), status_code=400)
        except QueueFullError as error:     # the last place went to a submission beside this one
            shutil.rmtree(store.job_dir(job_id), ignore_errors=True)
            return None, queue_full(error)
        except H3BridgeError as error:     # the model check or the memory plan refused it
            shutil.rmtree(store.job_dir(job_id), ignore_errors=True)
            refusal = VideoError(code=ErrorCode.INVALID_REQUEST.value, message=error.message_in(http_words),
                                 hint=error.hint_in(http_words), type="invalid_request_error")
            return None, JSONResponse(dialects.error_body(400, refusal, dialect), status_code=400)
        except ClientDisconnect:
            # The client closed the connection mid-body: nothing to answer and nothing is wrong with
            # the server, so one quiet line (no traceback) and the partial upload is removed.
            shutil.rmtree(store.job_dir(job_id), ignore_errors=True)
            _log.info("POST %s: the client went away before its body was complete; nothing was queued",
                      request.url.path)
            return None, error_response(400, ErrorCode.INVALID_REQUEST, "the request body ended before it was "
                                        "complete (the client closed the connection)",
                                        hint="send the whole body")
        except BaseException:
            shutil.rmtree(store.job_dir(job_id), ignore_errors=True)
            raise
        worker.notify()
        return job, None

    @app.post(VIDEOS_PATH)
    async def create_video(request: Request) -> JSONResponse:
        job, refusal = await submit(request)
        if refusal is not None:
            return refusal
        assert job is not None
        return JSONResponse(job_json(job))

    @app.post(VIDEOS_PATH + "/sync")
    async def create_video_sync(request: Request):
        """vLLM-Omni's synchronous variant: the job is queued as any other, and the answer is its
        MP4 once complete (X-Request-Id names the job). Past settings.sync_timeout the answer is 504
        naming the job, which keeps running: poll it and download its content."""
        job, refusal = await submit(request)
        if refusal is not None:
            return refusal
        assert job is not None
        dialect = dialects.job_dialect(job.shape)
        started = time.monotonic()
        while True:
            current = await run_in_threadpool(store.get, job.id)
            if current is None:
                error = VideoError(code=ErrorCode.NOT_FOUND.value, message=f"video {job.id} was deleted before it "
                                   "completed", type="not_found_error", param="video_id")
                return JSONResponse(dialects.error_body(404, error, dialect), status_code=404)
            if current.status is JobStatus.COMPLETED and store.video_path(job.id).is_file():
                return FileResponse(store.video_path(job.id), media_type="video/mp4", filename=f"{job.id}.mp4",
                                    headers={"X-Request-Id": job.id,
                                             "X-Inference-Time-S": f"{time.monotonic() - started:.3f}"})
            if current.status is JobStatus.FAILED:
                error = current.error or VideoError(code=ErrorCode.ENGINE_FAILED.value, message="the job failed")
                return JSONResponse(dialects.error_body(500, error, dialect), status_code=500,
                                    headers={"X-Request-Id": job.id})
            if time.monotonic() - started > settings.sync_timeout:
                error = VideoError(code="timeout", type="server_error", param="video_id",
                                   message=f"video {job.id} did not complete within {settings.sync_timeout:g} s; it is "
                                           "still queued or rendering",
                                   hint=f"poll GET {VIDEOS_PATH}/{job.id} and download {VIDEOS_PATH}/{job.id}/content "
                                        f"once it is completed (POST {VIDEOS_PATH} does this without waiting)")
                return JSONResponse(dialects.error_body(504, error, dialect), status_code=504,
                                    headers={"X-Request-Id": job.id})
            await asyncio.sleep(SYNC_POLL_SECONDS)

    def _accept(job_id: str, translated: "dialects.TranslatedBody", idempotency_key: str | None = None):
        request, model = request_from_wire(translated.pairs, translated.uploads)
        request.validate()
        if settings.preflight is not None:
            settings.preflight(request)
        fields = request_to_wire(request).fields     # canonical names: what the job re-reads after a restart
        shape = clip_shape(request)
        if translated.dialect is not Dialect.H3BRIDGE:
            shape[dialects.DIALECT_KEY] = translated.dialect.value
        return store.add(job_id, model=model or DEFAULT_MODEL, fields=fields, uploads=translated.uploads, shape=shape,
                         max_queued=settings.max_queued, idempotency_key=idempotency_key)

    @app.get(VIDEOS_PATH)
    def list_videos(after: str | None = None, limit: Annotated[int, IntField(1, 100, field="limit")] = 20,
                    order: str = "desc") -> JSONResponse:
        if order not in ("asc", "desc"):
            return error_response(400, ErrorCode.INVALID_REQUEST, f"order={order!r} must be asc or desc",
                                  param="order")
        jobs, more = store.list(after=after, limit=limit, newest_first=order == "desc")
        data = [job.video_job().listed() for job in jobs]
        page = VideoList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                         has_more=more).model_dump(mode="json")
        page["data"] = [dialects.job_body(item, dialects.job_dialect(job.shape))
                        for item, job in zip(data, jobs)]
        return JSONResponse(page)

    @app.get(VIDEOS_PATH + "/{video_id}")
    def retrieve_video(video_id: str) -> JSONResponse:
        job = store.get(video_id) if is_job_id(video_id) else None
        if job is None:
            return not_found(video_id)
        return JSONResponse(job_json(job))

    @app.get(VIDEOS_PATH + "/{video_id}/content")
    def download_video(video_id: str, variant: str = "video"):
        job = store.get(video_id) if is_job_id(video_id) else None
        if job is None:
            return not_found(video_id)
        if variant != "video":
            return error_response(400, ErrorCode.INVALID_REQUEST,
                                  f"variant={variant!r}: this server has only the video (an MP4 with its audio)",
                                  param="variant", hint="ask for variant=video", dialect=dialects.job_dialect(job.shape))
        path = store.video_path(video_id)
        if job.status is not JobStatus.COMPLETED or not path.is_file():
            return error_response(409, ErrorCode.NOT_READY, f"video {video_id} is {job.status.value}; its content "
                                  "is there once it is completed", param="video_id",
                                  hint="poll GET /v1/videos/{id} until status is completed",
                                  dialect=dialects.job_dialect(job.shape))
        return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")

    @app.get(EVENTS_PATH)
    async def video_events(video_id: str, request: Request):
        job = await run_in_threadpool(store.get, video_id) if is_job_id(video_id) else None
        if job is None:
            return not_found(video_id)
        client = request.client.host if request.client is not None else ""
        slots = settings.stream_slots
        if not slots.take(client):
            return error_response(429, ErrorCode.INVALID_REQUEST,
                                  f"too many open event streams (at most {slots.per_client} per client, "
                                  f"{slots.total} in all)", param="video_id", kind="rate_limit_error",
                                  hint="close the streams of jobs you no longer follow, or poll GET /v1/videos/{id}",
                                  headers={"Retry-After": "5"}, dialect=dialects.job_dialect(job.shape))
        from .event_stream import event_stream_response
        return event_stream_response(video_id, store, worker.events, slots, client,
                                     request.headers.get("last-event-id"), request.is_disconnected)

    @app.delete(VIDEOS_PATH + "/{video_id}")
    def delete_video(video_id: str) -> JSONResponse:
        if not is_job_id(video_id) or not store.remove(video_id):
            return not_found(video_id)
        worker.cancel(video_id)          # stops its engine if it is running, and waits for that
        store.remove_files(video_id)
        worker.events.end(video_id, "cancelled", None)      # its event streams end
        return JSONResponse(VideoDeleted(id=video_id).model_dump(mode="json"))

    return app


async def _drain(stream) -> None:
    read = 0
    try:
        async for chunk in stream:
            read += len(chunk)
            if read > DRAIN_LIMIT:
                return
    except Exception:        # the client went away, or the stream was already consumed
        return


MIN_API_KEY_CHARS = 16
MAKE_A_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


def check_bind(host: str, api_key: str | None) -> None:
    """An API key, when given, must be one (check_api_key); without one, every address `host`
    resolves to must be loopback (RequestError naming the flag). The name is resolved as the
    server will bind it (socket.getaddrinfo): its spelling says nothing (`127.lan.example` may
    be 0.0.0.0)."""
    if api_key is not None:
        check_api_key(api_key)
        return
    outside = addresses_beyond_loopback(host)
    if not outside:
        return
    where = f"--host {host}" + ("" if outside == [host] else f" (which resolves to {', '.join(outside)})")
    raise RequestError(f"{where} would serve this Mac's engine to the network without an API key",
                       field="api_key", hint=f"set H3BRIDGE_API_KEY (or --api-key) to a long random key (make one "
                                             f"with {MAKE_A_KEY}), or serve on 127.0.0.1 only")


def addresses_beyond_loopback(host: str) -> list[str]:
    """The addresses `host` binds to that are not loopback; [host] itself when it does not
    resolve (the bind would fail, or mean something unknown: not provably this machine only)."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OSError):
        return [host]
    outside: list[str] = []
    for *_, address in found:
        text = str(address[0]).split("%", 1)[0]      # an IPv6 scope (fe80::1%en0)
        try:
            parsed = ipaddress.ip_address(text)
        except ValueError:
            outside.append(text)
            continue
        mapped = getattr(parsed, "ipv4_mapped", None)      # ::ffff:127.0.0.1
        if not (parsed.is_loopback or (mapped is not None and mapped.is_loopback)) and text not in outside:
            outside.append(text)
    return outside if found else [host]


def check_api_key(api_key: str) -> None:
    """A key is what a person would call one: at least MIN_API_KEY_CHARS visible ASCII characters
    (clients send it in an HTTP header; a space or a tab there is stripped, so such a key would
    refuse every request, and one character is guessed at once)."""
    visible = all("!" <= char <= "~" for char in api_key)
    if len(api_key) >= MIN_API_KEY_CHARS and visible:
        return
    problem = ("has spaces, tabs or characters other than visible ASCII" if not visible
               else f"is {len(api_key)} characters")
    raise RequestError(f"the API key (--api-key or $H3BRIDGE_API_KEY) {problem}; a key must be at least "
                       f"{MIN_API_KEY_CHARS} visible ASCII characters (letters, digits, punctuation; no spaces)",
                       field="api_key", hint=f"make one with {MAKE_A_KEY} and set H3BRIDGE_API_KEY to it")
