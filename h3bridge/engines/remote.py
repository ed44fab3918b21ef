"""A video server of the OpenAI Videos API shape, driven as an engine: `h3bridge serve` on another
Mac, or an SGLang Diffusion / vLLM-Omni server (docs/remote.md says what those take).

    from h3bridge import GenerationRequest, RemoteEngine
    with RemoteEngine("http://studio-mac.local:8765") as engine:     # key: $H3BRIDGE_API_KEY
        result = engine.generate(GenerationRequest("A red fox runs through snow"), "fox.mp4")

One job is `POST /v1/videos` (JSON, or multipart when the request carries files), following
`GET /v1/videos/{id}/events` (server-sent events, remote_events.py) into ProgressEvents and
PreviewFrames, or polling `GET /v1/videos/{id}` on a server without that stream, and `GET /v1/videos/{id}/content` streamed under a
staging name beside the output and renamed into place when complete; a cancel sends
`DELETE /v1/videos/{id}`. The request body is the wire module's (one mapping for the server and
this client). No machine-wide engine lock is taken here: the engine is on the server, which
holds its own.
"""
from __future__ import annotations

import mimetypes
import os
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from ..cancel import CancelToken, PauseControl
from ..errors import (
    GenerationCancelled,
    RemoteAuthError,
    RemoteError,
    RemoteUnreachableError,
    RequestError,
)
from ..history.job import Device
from ..history.recorder import recorded
from ..media.decode import decode_video_frames
from ..progress import PreviewCallback, ProgressCallback, ProgressEvent
from ..request import GenerationRequest
from ..result import GenerationResult
from ..runnable import h3bridge_command
from ..wire.peers import Dialect, PeerBody, dialect_of, job_from_peer, request_to_peer
from ..wire.videos import API_KEY_ENV, DEFAULT_MODEL, IDEMPOTENCY_HEADER, VIDEOS_PATH, JobStatus, VideoJob, WireBody, error_from_body, request_to_wire, server_message  # noqa: F401 (fleet imports it from here)
from .child import NOTHING, JobClock, Nothing, wait_until
from .job import Rendered, open_job, run_job
from .output import JobFiles
from .protocol import EngineCapabilities
from .remote_pause import follow_pause
from .remote_events import QUEUED_PHASE, RUNNING_PHASE, StreamUnavailable, follow_events

POLL_SECONDS = 0.25           # between status polls; a cancel interrupts the wait at once
# A server whose queue is full (`h3bridge serve --max-queued`, any server behind a rate limit)
# answers a submission 429 with Retry-After: the same body is submitted again after that many
# seconds (at least FULL_RETRY_MIN, at most FULL_RETRY_MAX; 1 s without the header), for at most
# RemoteEngine.full_server_wait seconds in all. Nothing was queued by a 429, so nothing is doubled.
FULL_RETRY_MIN, FULL_RETRY_MAX = 0.2, 30.0
FULL_SERVER_PHASE = "waiting for room in the server's queue"
DOWNLOAD_CHUNK = 1 << 20
# Phase names of the ProgressEvents a remote job reports (the server's own phases when it sends
# them): QUEUED_PHASE and RUNNING_PHASE are remote_events.py's, which both ways of following use.
DOWNLOAD_PHASE = "download"

@dataclass(frozen=True)
class JobAdoption:
    """How a caller that must never pay twice for a job (a storyboard's shot) submits it.

    key: names the request for good (the same key for the same request on every run): sent as the
      Idempotency-Key header, so a server that already accepted this key answers with that job.
    job_id: the job an earlier run submitted for this very request, if it wrote one down: followed
      (and downloaded) instead of submitting again while the server still has it and it has not
      failed. Through a proxy in front of several servers, the id reaches the server holding it.
    on_submitted: called with the job's id as soon as the server has accepted it, before the job is
      followed, so the caller can write it down."""

    key: str
    job_id: str | None = None
    on_submitted: Callable[[str], None] | None = None


def _key_hint() -> str:
    """The fix for a refused key: the environment variable, and the server command it must match."""
    return (f"set {API_KEY_ENV} in the environment to the server's key (the one "
            f"`{h3bridge_command('serve', '--api-key', 'KEY')}` was given, or its environment); it is never "
            "taken as a flag")


def normalise_base_url(base_url: str) -> str:
    """`http://host:port` (a trailing `/` or `/v1` dropped): the root the Videos API paths hang off.
    Refuses what is not an http(s) URL with a host, before anything is sent."""
    text = str(base_url).strip()
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError, ValueError) as error:
        raise RequestError(f"the server URL {text!r} is not a URL ({error})", field="base_url",
                           hint="give the server's address, e.g. http://studio-mac.local:8765") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise RequestError(f"the server URL {text!r} is not an http:// or https:// address with a host",
                           field="base_url", hint="give the server's address, e.g. http://studio-mac.local:8765")
    root = text.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    return root


def _error_field(response: httpx.Response) -> tuple[str | None, str | None]:
    """(field, hint) a server sends beside its message (`error.param`, `error.hint`)."""
    try:
        error = error_from_body(response.json())
    except ValueError:
        error = None
    return (None, None) if error is None else (error.param, error.hint)


class RemoteEngine:
    """An engine on another machine, behind the OpenAI Videos API (the `Engine` protocol).

    base_url: the server, e.g. `http://studio-mac.local:8765` (a trailing `/v1` is fine).
    api_key: sent as `Authorization: Bearer`; default `$H3BRIDGE_API_KEY`, read at every job
      (so a key set later applies). None and no variable: no header (a loopback server needs none).
    model: the `model` field of each job (servers that host several models pick by it, and a proxy
      picks its group of servers by it); None: `MiniMax-H3` to an `h3bridge serve` or a proxy in
      front of several (the group `h3bridge fleet` writes by default; LiteLLM refuses a job without
      a model), nothing to a peer's server (which uses its own).
    poll_interval: seconds between status polls (for servers without an event stream).
    events: follow jobs through the server's event stream when it has one (`h3bridge serve`:
      progress as it happens, and previews when its engine makes them); False always polls, and
      so does a peer dialect.
    timeout: seconds any one HTTP exchange may take (connect, a poll, one download chunk).
    transport: an httpx transport (tests pass `httpx.MockTransport`).
    dialect: whose request shape to send: "h3bridge" (this project's server, every h3 setting),
      "vllm-omni" or "sglang" (their MiniMax-H3 servers' own shapes, docs/dialects.md). A setting
      the chosen peer has no field for is refused before anything is sent, naming it.
    full_server_wait: seconds to keep submitting again to a server whose queue is full (HTTP 429,
      after its Retry-After each time) before giving up with RemoteError; 0 gives up at once.
    """

    # The clip is rendered elsewhere and its frames are decoded from the downloaded H.264 MP4;
    # whether the server keeps its model warm is its business, not this client's promise, and so
    # are previews (an `h3bridge serve` whose engine makes them streams them; others never do).
    capabilities = EngineCapabilities(warm_model=False, previews=False, exact_frames=False, remote=True,
                                      multiline_prompts=True)

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None, *,
                 poll_interval: float = POLL_SECONDS, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None, events: bool = True,
                 dialect: "str | Dialect" = Dialect.H3BRIDGE, full_server_wait: float = 1800.0) -> None:
        self.base_url = normalise_base_url(base_url)
        self.dialect = dialect_of(dialect)
        self._api_key = api_key
        self.model = model
        self.poll_interval = poll_interval
        self.timeout = timeout
        self._transport = transport
        self.events = events
        self.full_server_wait = full_server_wait
        self._events_offered: bool | None = None     # whether the server has event streams (None: not asked yet)
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()     # one client for the threads of a parallel story

    def __repr__(self) -> str:       # never the key
        shown = "" if self.dialect is Dialect.H3BRIDGE else f", dialect={self.dialect.value!r}"
        return f"RemoteEngine({self.base_url!r}, model={self.model!r}{shown})"

    # ------------------------------------------------------------------ the Engine protocol

    def check_supported(self, request: GenerationRequest) -> None:
        """Every request the wire format carries can be sent to an h3bridge server, which refuses
        (HTTP 400, its message verbatim) what its engine cannot take. In a peer's dialect, an h3
        setting that peer has no field for is refused here (RequestError naming it)."""
        if self.dialect is not Dialect.H3BRIDGE:
            request_to_peer(request, self.dialect, model=self.model, encode_files=False)

    def close(self) -> None:
        """Close the HTTP connections; a later `generate` opens new ones."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def history_device(self) -> Device:
        """Where the job history says a remote job ran: the server (its own history, if it is an
        h3bridge server, has the chip and memory)."""
        return Device(f"server {self.base_url}")

    @recorded("remote")      # the job history (history/recorder.py)
    def generate(self, request: GenerationRequest, output: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, want_frames: bool = True, want_audio: bool = True,
                 on_progress: ProgressCallback | None = None, on_preview: PreviewCallback | None = None,
                 cancel: CancelToken | None = None, pause: PauseControl | None = None,
                 adoption: JobAdoption | None = None) -> GenerationResult:
        """Render one clip on the server and return it as the local engines do (the `Engine` protocol).

        The request is validated here first (every `generate` rule, the input files included),
        then submitted; the MP4 is downloaded under a staging name beside `output` and renamed
        into place when complete (a failed or cancelled download leaves nothing). `on_preview`
        gets the denoise previews a server's event stream carries (an `h3bridge serve` whose
        engine makes them); other servers send none. Cancelling deletes the server's job
        (`DELETE`) and raises GenerationCancelled. `adoption` (JobAdoption) makes a run that
        resumes after a kill follow the job it submitted before instead of paying for it twice.
        `pause` pauses and resumes the server's job while it runs (`POST .../pause` and `/resume`,
        remote_pause.follow_pause), and the result's timings leave the paused time out.

        Raises RequestError (a bad request, refused here or by the server with its words),
        OutputExistsError, RemoteAuthError (401/403), RemoteUnreachableError (no server at the
        URL, or the connection broke), RemoteError (the server failed the job: its message is
        `engine_message`), GenerationCancelled.
        """
        spec = open_job(request, output, overwrite=overwrite, want_frames=want_frames, want_audio=want_audio,
                        cancel=cancel)
        started = time.monotonic()
        clock = JobClock(pause)
        clock_started = clock.now()
        job_id: str | None = None

        def run(files: JobFiles) -> Rendered:
            nonlocal job_id
            mp4 = files.mp4_temp
            job = self._adopt(adoption.job_id) if adoption is not None and adoption.job_id else None
            if job is None:
                job = self._submit(request, started, on_progress, cancel,
                                   key=adoption.key if adoption is not None else None)
                if adoption is not None and adoption.on_submitted is not None:
                    adoption.on_submitted(job.id)
            job_id = job.id
            stop_following = follow_pause(self, job.id, pause)     # pause(): POST .../pause (remote_pause.py)
            try:
                job = self._follow(job, started, on_progress, on_preview, cancel)
                if mp4 is not None:
                    self._download(job.id, mp4, started, on_progress, cancel)
            finally:
                stop_following()
            return Rendered(timings={"total": clock.now() - clock_started},
                            command=[f"POST {self.base_url}{VIDEOS_PATH}", f"job {job.id}"], seed=job.seed,
                            read_frames=None if mp4 is None else
                            lambda: decode_video_frames(mp4, request.frame_count, request.width, request.height))

        try:
            return run_job(spec, run, mp4_for_frames=True)
        except (GenerationCancelled, KeyboardInterrupt):
            if job_id is not None and not self._delete(job_id):
                raise GenerationCancelled(f"generation cancelled; the server at {self.base_url} did not confirm "
                                          f"deleting job {job_id}, which may still be running there") from None
            raise

    # ------------------------------------------------------------------ HTTP

    @property
    def api_key(self) -> str | None:
        return self._api_key if self._api_key is not None else (os.environ.get(API_KEY_ENV) or None)

    def _http(self) -> httpx.Client:
        with self._client_lock:
            return self._open_client()

    def _open_client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, transport=self._transport,
                                        timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 15.0)),
                                        follow_redirects=False)
        return self._client

    def _headers(self) -> dict[str, str]:
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _exchange(self, method: str, path: str, *, what: str, before_start: bool = False,
                  headers: dict[str, str] | None = None, **options: Any) -> httpx.Response:
        """One request; a transport failure becomes RemoteUnreachableError naming the URL and the fix."""
        try:
            return self._http().request(method, path, headers={**self._headers(), **(headers or {})}, **options)
        except httpx.TimeoutException:
            raise RemoteUnreachableError(
                f"the server at {self.base_url} did not answer within {self.timeout:g} s ({what})",
                url=self.base_url, before_start=before_start,
                hint="check that the server is running and reachable from this machine; a busy server may "
                     "need a longer timeout") from None
        except httpx.TransportError as error:
            raise RemoteUnreachableError(
                f"cannot reach the server at {self.base_url} ({what}): {_transport_words(error)}",
                url=self.base_url, before_start=before_start,
                hint="check the URL and port, that the server is running there (`h3bridge serve` on that "
                     "machine, or the SGLang / vLLM-Omni server), and that no firewall stands between") from None

    def _raise_for_status(self, response: httpx.Response, *, what: str, job_id: str | None = None) -> None:
        status = response.status_code
        if status < 400:
            return
        message = server_message(response)
        where = f"{self.base_url}{response.request.url.path}"
        if status in (401, 403):
            sent = bool(self._headers())
            raise RemoteAuthError(
                f"the server at {self.base_url} refused {'the API key' if sent else 'a request without an API key'} "
                f"(HTTP {status}: {message})", url=self.base_url, status=status, engine_message=message,
                hint=_key_hint())
        if status in (400, 413, 422) and job_id is None:
            field, hint = _error_field(response)
            raise RequestError(message, field=field, hint=hint)
        if status == 404 and job_id is None:
            raise RemoteError(f"{where} does not exist (HTTP 404: {message}): {self.base_url} is not an OpenAI "
                              "Videos API server", url=self.base_url, status=status, engine_message=message,
                              before_start=True,
                              hint="give the server's base URL (scheme, host and port, e.g. "
                                   "http://studio-mac.local:8765), without /v1/videos")
        if status == 404:
            raise RemoteError(f"the server at {self.base_url} no longer has job {job_id} ({what}; HTTP 404: "
                              f"{message})", url=self.base_url, status=status, engine_message=message,
                              hint="the job was deleted or the server lost it; run the job again")
        raise RemoteError(f"the server at {self.base_url} failed ({what}; HTTP {status}): {message}",
                          url=self.base_url, status=status, engine_message=message,
                          before_start=job_id is None and status < 500,
                          hint="see the server's log; the message above is the server's own")

    def _job(self, response: httpx.Response, what: str) -> VideoJob:
        try:
            body = response.json()
            error = body.get("error") if isinstance(body, dict) else None
            if isinstance(error, dict) and "code" not in error:
                # SGLang Diffusion's failed jobs carry {"message": ...} alone.
                body["error"] = {"code": "error", **error}
            return VideoJob.model_validate(body) if self.dialect is Dialect.H3BRIDGE else job_from_peer(body)
        except ValueError:           # not JSON, or not a job (pydantic's ValidationError is a ValueError)
            raise RemoteError(f"the server at {self.base_url} answered {what} with something that is not a "
                              f"Videos API job: {response.text[:200]!r}", url=self.base_url,
                              status=response.status_code,
                              hint="check that the URL is an OpenAI Videos API server") from None

    # ------------------------------------------------------------------ a job

    def _adopt(self, job_id: str) -> VideoJob | None:
        """The job an earlier run submitted, if the server still has it and it has not failed (a
        failed job is submitted again; the caller's key then names the new one); None otherwise."""
        response = self._exchange("GET", f"{VIDEOS_PATH}/{job_id}", what=f"looking up job {job_id}",
                                  before_start=True)
        if response.status_code in (400, 404, 410):    # gone, or an id this server never made
            return None
        self._raise_for_status(response, what=f"looking up job {job_id}", job_id=job_id)
        job = self._job(response, f"a look-up of job {job_id}")
        return None if job.status is JobStatus.FAILED else job

    def _submit(self, request: GenerationRequest, started: float, on_progress: ProgressCallback | None,
                cancel: CancelToken | None, *, key: str | None = None) -> VideoJob:
        """POST the request (the wire module's body, or a peer's): JSON, or multipart when it
        carries files; submitted again while the server answers 429 (its queue is full), after its
        Retry-After, for at most `full_server_wait` seconds, each wait reported as progress and
        cut short by a cancel (nothing was queued, so there is nothing to delete).

        A server that reads only forms (vLLM-Omni's `/v1/videos` takes multipart/form-data, as the
        official openai client sends it) answers a JSON body 415 or 422 before queueing anything:
        the same body is then sent once more as a form."""
        headers = {IDEMPOTENCY_HEADER: key} if key else {}
        if self.dialect is not Dialect.H3BRIDGE:
            peer = request_to_peer(request, self.dialect, model=self.model)
            send = lambda: self._post_peer(peer, headers)     # noqa: E731
        else:
            body = request_to_wire(request, model=self.model or DEFAULT_MODEL)

            def send() -> httpx.Response:
                response = self._post(body, multipart=bool(body.files), headers=headers)
                if not body.files and response.status_code in (415, 422):
                    response = self._post(body, multipart=True, headers=headers)
                return response
        waited, tries = 0.0, 0

        def submit(_interval: float) -> "httpx.Response | Nothing":
            nonlocal waited, tries
            response = send()
            if response.status_code != 429:
                return response
            pause = _retry_after(response)
            if waited + pause > self.full_server_wait:
                raise RemoteError(
                    f"the server at {self.base_url} kept refusing the job for {waited:.0f} s: its queue is full "
                    f"(HTTP 429: {server_message(response)})", url=self.base_url, status=429,
                    engine_message=server_message(response), before_start=True,
                    hint=f"submit it later, give the server a longer queue (`{h3bridge_command('serve', '--max-queued', 'N')}`), "
                         "spread the work over several servers (docs/fleet.md), or wait longer "
                         "(RemoteEngine(full_server_wait=SECONDS))")
            tries += 1
            if on_progress is not None:
                on_progress(ProgressEvent(FULL_SERVER_PHASE, tries, tries + 1, 0.0, time.monotonic() - started))
            if cancel is not None:
                if cancel.wait(pause):
                    raise GenerationCancelled("generation cancelled while the server's queue was full; nothing "
                                              "was queued there")
            else:
                time.sleep(pause)
            waited += pause
            return NOTHING

        response = wait_until(submit)      # the one wait loop: 429s retried after Retry-After
        self._raise_for_status(response, what="submitting the job")
        return self._job(response, "the submission")

    def _post(self, body: WireBody, *, multipart: bool, headers: dict[str, str]) -> httpx.Response:
        with ExitStack() as stack:
            if multipart:
                # One ordered list of parts: the text fields (no file name), then the files in the
                # wire module's order (Ref2VA references are ordered). httpx would send a form with
                # no file urlencoded; this stays multipart.
                parts: list[tuple[str, tuple[Any, ...]]] = [(name, (None, value)) for name, value in body.form_fields()]
                parts += [(name, (path.name, stack.enter_context(open(path, "rb")),
                                  mimetypes.guess_type(path.name)[0] or "application/octet-stream"))
                          for name, path in body.files]
                options: dict[str, Any] = {"files": parts}
            else:
                options = {"json": body.fields}
            return self._exchange("POST", VIDEOS_PATH, what="submitting the job", before_start=True,
                                  headers=headers, **options)

    def _post_peer(self, body: PeerBody, headers: dict[str, str]) -> httpx.Response:
        """A peer's body: vLLM-Omni's form (always multipart: its endpoint reads forms only), or
        SGLang's JSON."""
        with ExitStack() as stack:
            if body.json is not None:
                options: dict[str, Any] = {"json": body.json}
            else:
                parts: list[tuple[str, tuple[Any, ...]]] = [(name, (None, value)) for name, value in body.form]
                parts += [(name, (path.name, stack.enter_context(open(path, "rb")), media_type))
                          for name, path, media_type in body.files]
                options = {"files": parts}
            return self._exchange("POST", VIDEOS_PATH, what="submitting the job", before_start=True,
                                  headers=headers, **options)

    def _follow(self, job: VideoJob, started: float, on_progress: ProgressCallback | None,
                on_preview: PreviewCallback | None, cancel: CancelToken | None) -> VideoJob:
        """Follow the job until it is completed (returned) or failed (raised), reporting progress:
        through its event stream when the server has one (remote_events.py: progress and previews
        as they happen), else by polling. A server found without the stream is polled from then on."""
        # The event stream is h3bridge's own (its end event carries the job in h3bridge's shape): a
        # job sent in a peer's dialect is polled, as those servers are.
        if (self.events and self.dialect is Dialect.H3BRIDGE and self._events_offered is not False
                and job.status is not JobStatus.COMPLETED):
            try:
                followed = follow_events(self, job, started, on_progress, on_preview, cancel)
                self._events_offered = True
                if followed is not None:
                    return followed
            except StreamUnavailable:
                self._events_offered = False
        return self._poll(job, started, on_progress, cancel)

    def _poll(self, job: VideoJob, started: float, on_progress: ProgressCallback | None,
              cancel: CancelToken | None) -> VideoJob:
        """Poll until the job is completed (returned) or failed (raised); report progress. The one
        wait loop (child.wait_until); a cancel ends the wait between polls (the caller deletes the job)."""
        last: ProgressEvent | None = None

        def poll_once(timeout: float) -> "VideoJob | Nothing":
            nonlocal job, last
            if job.status is JobStatus.COMPLETED:
                return job
            if job.status is JobStatus.FAILED:
                message = job.error.message if job.error is not None else "the server gave no reason"
                raise RemoteError(f"the server at {self.base_url} failed job {job.id}: {message}",
                                  url=self.base_url, engine_message=message,
                                  hint=(job.error.hint if job.error is not None else None)
                                  or "the message is the server's own; see its log")
            event = _progress_event(job, started)
            if on_progress is not None and event[:3] != (last[:3] if last else None):
                on_progress(ProgressEvent(*event))
            last = event
            if cancel is not None and cancel.wait(timeout):
                raise GenerationCancelled("generation cancelled; the server's job was deleted and no output was kept")
            if cancel is None:
                time.sleep(timeout)
            response = self._exchange("GET", f"{VIDEOS_PATH}/{job.id}", what=f"polling job {job.id}")
            self._raise_for_status(response, what=f"polling job {job.id}", job_id=job.id)
            job = self._job(response, f"a poll of job {job.id}")
            return NOTHING

        return wait_until(poll_once, interval=self.poll_interval)     # a cancel is seen in poll_once's wait

    def _download(self, job_id: str, target: Path, started: float, on_progress: ProgressCallback | None,
                  cancel: CancelToken | None) -> None:
        """Stream the MP4 into `target` (a staging name); a broken or cut-short download raises and
        the caller removes the file."""
        what = f"downloading job {job_id}"
        try:
            with self._http().stream("GET", f"{VIDEOS_PATH}/{job_id}/content", headers=self._headers()) as response:
                if response.status_code >= 400:
                    response.read()
                    self._raise_for_status(response, what=what, job_id=job_id)
                declared = response.headers.get("content-length")
                total = int(declared) if declared and declared.isdigit() else 0
                received = 0
                with open(target, "wb") as handle:
                    for chunk in response.iter_bytes(DOWNLOAD_CHUNK):
                        if cancel is not None and cancel.cancelled:
                            raise GenerationCancelled("generation cancelled during the download; the server's job "
                                                      "was deleted and no output was kept")
                        handle.write(chunk)
                        received += len(chunk)
                        if on_progress is not None:
                            on_progress(ProgressEvent(DOWNLOAD_PHASE, received, max(total, received), 1.0,
                                                      time.monotonic() - started))
                    handle.flush()
                    os.fsync(handle.fileno())
        except httpx.TimeoutException:
            raise RemoteUnreachableError(f"the server at {self.base_url} stopped sending job {job_id}'s MP4 for "
                                         f"{self.timeout:g} s", url=self.base_url,
                                         hint="check the server and the network, then run the job again") from None
        except httpx.TransportError as error:
            raise RemoteUnreachableError(f"the download of job {job_id}'s MP4 from {self.base_url} broke off: "
                                         f"{_transport_words(error)}", url=self.base_url,
                                         hint="check the server and the network, then run the job again") from None
        if total and received != total:
            raise RemoteUnreachableError(f"the download of job {job_id}'s MP4 from {self.base_url} ended after "
                                         f"{received} of {total} bytes", url=self.base_url,
                                         hint="check the server and the network, then run the job again")

    def delete_job(self, job_id: str) -> bool:
        """Delete the server's job `job_id` (a fleet's front cleaning up after a server that went
        away); True once the server confirms it or has no such job. Never raises."""
        return self._delete(job_id)

    def _delete(self, job_id: str) -> bool:
        """Cancel and delete the server's job; True once the server confirms it (or has no such
        job any more). Never raises: the caller is already reporting the cancel."""
        try:
            response = self._http().request("DELETE", f"{VIDEOS_PATH}/{job_id}", headers=self._headers(),
                                            timeout=min(self.timeout, 10.0))
        except httpx.HTTPError:
            return False
        return response.status_code < 300 or response.status_code == 404


def _retry_after(response: httpx.Response) -> float:
    """The seconds a 429 asks to wait (Retry-After in seconds; an HTTP date or none: 1 s), kept within
    [FULL_RETRY_MIN, FULL_RETRY_MAX] so a server cannot make a client spin or sleep for a day."""
    try:
        seconds = float(response.headers.get("retry-after", "1"))
    except ValueError:
        seconds = 1.0
    if seconds != seconds:      # NaN
        seconds = 1.0
    return min(max(seconds, FULL_RETRY_MIN), FULL_RETRY_MAX)


def _transport_words(error: httpx.TransportError) -> str:
    text = str(error) or type(error).__name__
    if isinstance(error, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused (nothing listens on that port)"
    return text


def _progress_event(job: VideoJob, started: float) -> tuple[str, int, int, float, float]:
    """The job's status as ProgressEvent fields: the server's own phase when it sends one
    (`h3bridge serve` does), and the standard `progress` 0-100."""
    elapsed = time.monotonic() - started
    if job.status is JobStatus.QUEUED:
        return (job.phase or QUEUED_PHASE, 0, 100, 0.0, elapsed)
    return (job.phase or RUNNING_PHASE, job.progress, 100, job.fraction, elapsed)


__all__ = ["IDEMPOTENCY_HEADER", "JobAdoption", "RemoteEngine", "normalise_base_url", "server_message"]
