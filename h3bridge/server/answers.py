"""The server's answers that are not a job: errors in a dialect's shape (dialects.py), the
unknown-video and full-queue refusals every route gives alike, and a job in its submitter's dialect."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from ..errors import QueueFullError
from ..wire.peers import Dialect
from ..wire.videos import ErrorCode, VideoError
from . import dialects
from .jobs import StoredJob


def error_response(status: int, code: ErrorCode, message: str, *, param: str | None = None,
                   hint: str | None = None, kind: str = "invalid_request_error",
                   headers: dict[str, str] | None = None, dialect: Dialect = Dialect.H3BRIDGE) -> JSONResponse:
    """An error answer in `dialect`'s shape: the job's own dialect once there is a job (its clients
    read every answer about it alike); h3bridge's before a body or a job says which (a missing key,
    an unknown video, a full queue)."""
    error = VideoError(code=code.value, message=message, param=param, hint=hint, type=kind)
    return dialect_error(status, error, dialect, headers)


def dialect_error(status: int, error: VideoError, dialect: Dialect,
                  headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(dialects.error_body(status, error, dialect), status_code=status, headers=headers)


def not_found(job_id: str) -> JSONResponse:
    return error_response(404, ErrorCode.NOT_FOUND, f"no video {job_id!r} on this server",
                          param="video_id", kind="not_found_error",
                          hint="list the server's videos with GET /v1/videos")


def queue_full(error: QueueFullError) -> JSONResponse:
    # h3bridge's own error shape in every dialect: the refusal comes before the body (and so the
    # dialect) is read, and what a router (LiteLLM) acts on is the status and Retry-After.
    return error_response(429, ErrorCode.QUEUE_FULL, error.message, hint=error.hint, kind="rate_limit_error",
                          headers={"Retry-After": str(error.retry_after)})


def job_dialect(job: StoredJob) -> Dialect:
    return dialects.job_dialect(job.shape)


def job_json(job: StoredJob) -> JSONResponse:
    """The job as its submitter's dialect reads it (dialects.py)."""
    return JSONResponse(dialects.job_body(job.video_job(), job_dialect(job)))
