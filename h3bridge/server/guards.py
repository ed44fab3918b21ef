"""What stands in front of every route: the API key (constant-time Bearer check; /health and CORS
preflights pass), CORS when asked for, and FastAPI's own refusals (unknown path, a query value of
the wrong type) answered in h3bridge's error shape."""
from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import RequestError
from ..wire.videos import HEALTH_PATH, ErrorCode
from .answers import error_response
from .state import AppState, app_state

KEY_HINT = "send Authorization: Bearer <key> (the server's --api-key or $H3BRIDGE_API_KEY)"


def install_guards(app: FastAPI, state: AppState) -> None:
    if state.settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(state.settings.cors_origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"])
    app.middleware("http")(require_key)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)


def key_refusal(request: Request, key: bytes | None) -> JSONResponse | None:
    """The 401 for a request without the right key, or None when it may pass."""
    if key is None or request.url.path == HEALTH_PATH or request.method == "OPTIONS":
        return None
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8"), key):
        return None
    return error_response(401, ErrorCode.UNAUTHORIZED, "missing API key" if not header else "wrong API key",
                          hint=KEY_HINT, kind="authentication_error", headers={"WWW-Authenticate": "Bearer"})


async def require_key(request: Request, call_next):
    refusal = key_refusal(request, app_state(request).api_key)
    return refusal if refusal is not None else await call_next(request)


async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    code = ErrorCode.NOT_FOUND if error.status_code == 404 else ErrorCode.INVALID_REQUEST
    return error_response(error.status_code, code, str(error.detail))


async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0] if error.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()) if part not in ("query", "path"))
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, RequestError):       # a safeio.numbers refusal: its own words and fix
        return error_response(400, ErrorCode.INVALID_REQUEST, cause.message, param=cause.field or where or None,
                              hint=cause.hint)
    return error_response(400, ErrorCode.INVALID_REQUEST, f"{where}: {first.get('msg', 'invalid')}",
                          param=where or None)
