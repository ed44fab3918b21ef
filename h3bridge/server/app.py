"""The HTTP surface of `h3bridge serve` (FastAPI): the OpenAI Videos API subset SGLang Diffusion and
vLLM-Omni implement, over the durable queue (jobs.py) and the worker (worker.py). create_app only
assembles it: the routes are in routes/ (one module per concern), the state they share is one
AppState (state.py), the key check and FastAPI's own refusals in guards.py, the error answers in
answers.py. The bind checks below run before the app is made (cli/serve.py).

    POST   /v1/videos               submit (JSON, or multipart with files) -> the job, queued
    POST   /v1/videos/sync          submit and answer with the MP4 once complete (vLLM-Omni's variant)
    GET    /v1/videos               list jobs (after, limit, order)
    GET    /v1/videos/{id}          the job: status, progress 0-100, error
    GET    /v1/videos/{id}/content  the MP4, once completed
    GET    /v1/videos/{id}/events   the job's progress as server-sent events (event_stream.py)
    POST   /v1/videos/{id}/pause    stop its engine where it is (memory resident); queued jobs wait
    POST   /v1/videos/{id}/resume   continue it
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

import ipaddress
import socket

from fastapi import FastAPI

from ..errors import RequestError
from .guards import install_guards
from .jobs import JobStore
from .routes import ROUTERS
from .state import STATE_ATTRIBUTE, AppState, ServeSettings
from .worker import Worker

__all__ = ["ServeSettings", "create_app", "check_bind", "check_api_key", "MIN_API_KEY_CHARS"]


def create_app(settings: ServeSettings, store: JobStore, worker: Worker) -> FastAPI:
    app = FastAPI(title="h3bridge serve", description="MiniMax-H3 on this Mac over the OpenAI Videos API",
                  version="1", docs_url=None, redoc_url=None, openapi_url=None)
    state = AppState(settings=settings, store=store, worker=worker)
    setattr(app.state, STATE_ATTRIBUTE, state)
    install_guards(app, state)
    for router in ROUTERS:
        app.include_router(router)
    return app


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
