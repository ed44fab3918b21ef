"""The server's one worker: takes queued jobs in order and runs each on the warm engine, one at a
time. The engines take the machine-wide engine lock themselves (engines/lock.py), so a ComfyUI
on the same Mac and the server never load two models.

The worker owns the running job's CancelToken: `cancel(job_id)` (a DELETE, or the server
stopping) stops the engine's process group within the engine loop's poll (50 ms) and no clip
is published. It owns its PauseControl too: `set_paused(job_id, ...)` (POST .../pause, .../resume)
stops or continues the engine where it is; the jobs queued behind it wait, as they wait behind any
running job, and the event stream says `paused` (status and phase) until it runs again. A job's state changes are committed before anything depends on them: `start`
before the engine starts, `complete` after the engine published the clip.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace

from ..cancel import CancelToken, PauseControl
from ..engines.protocol import Engine
from ..errors import GenerationCancelled, H3BridgeError, RequestError
from ..progress import PAUSED_PHASE, PreviewFrame, ProgressEvent
from .jobs import JobStore, StoredJob
from .progress_feed import ProgressHub
from ..wire.videos import ErrorCode, JobStatus, VideoError, http_words, progress_percent

_log = logging.getLogger("h3bridge.serve")
NOT_READY_WAIT = 1.0      # seconds between looks at an engine that is not ready to take a job


class NotTaken(Exception):
    """The engine did not take the job (a fleet's server was down or full before it accepted it):
    the job goes back to the queue, in its place, for any worker to take."""


@dataclass
class _Running:
    job_id: str
    cancel: CancelToken
    done: threading.Event
    pause: PauseControl = field(default_factory=PauseControl)
    last: ProgressEvent | None = None       # the engine's newest real event (told again on resume)


class Worker:
    """Runs the queue on `engine` (a session hands what it cannot take to its one-shot fallback:
    engines/fallback.py, as `generate --engine session` does). Every job's progress (and,
    with `previews` on an engine that makes them, its denoise previews) is published to
    `events`, which GET /v1/videos/{id}/events streams."""

    def __init__(self, store: JobStore, engine: Engine, *, previews: bool = False, events: ProgressHub | None = None,
                 name: str = "h3bridge-serve-worker") -> None:
        self.store = store
        self.engine = engine
        # a fleet's front runs one worker per server over one queue, all publishing into one hub
        self.events = events if events is not None else ProgressHub()
        # previews cost the engine its preview VAE (library engine: ~10 GiB), so they are asked for
        self.previews = previews
        self._wake = threading.Condition()
        self._stopping = False
        self._running: _Running | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        """A job was queued."""
        with self._wake:
            self._wake.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking jobs; cancel the running one (it is queued again, to run after a restart)."""
        with self._wake:
            self._stopping = True
            running = self._running
            self._wake.notify_all()
        if running is not None:
            running.cancel.cancel()
        self._thread.join(timeout)
        if self.engine is not None:
            self.engine.close()

    def cancel(self, job_id: str, timeout: float = 30.0) -> bool:
        """If `job_id` is running, stop its engine and wait until the worker has let go of it;
        True if it was running."""
        with self._wake:
            running = self._running if self._running is not None and self._running.job_id == job_id else None
        if running is None:
            return False
        running.cancel.cancel()
        running.pause.resume()          # after the cancel: a paused engine wakes up to stop
        running.done.wait(timeout)
        return True

    def set_paused(self, job_id: str, paused: bool) -> bool:
        """Pause (its engine's process group stopped where it is, memory resident) or resume the
        running job `job_id`; True if it is the running one (pausing a paused job is no change)."""
        with self._wake:        # the job cannot end and another start meanwhile
            running = self._running if self._running is not None and self._running.job_id == job_id else None
            if running is None:
                return False
            changed = running.pause.pause() if paused else running.pause.resume()
            if changed and self.store.set_paused(job_id, paused):
                self._announce(running, paused)
        return True

    def _announce(self, running: _Running, paused: bool) -> None:
        """The event stream hears the pause (status and phase `paused`, where it was in `detail`)
        and, on resume, the engine's last event again."""
        last = running.last or ProgressEvent("starting", 0, 0, 0.0, 0.0)
        event = replace(last, phase=PAUSED_PHASE, eta=None, detail=last.phase) if paused else last
        self.events.progress(running.job_id, event, progress=progress_percent(last.fraction),
                             status=JobStatus.PAUSED if paused else JobStatus.IN_PROGRESS)

    def ready(self) -> bool:
        """Whether the engine can take a job now (a local engine always can; a fleet's server may be
        down: fleet/front.py). Asked before each job, never with the queue's lock held."""
        return True

    def next_job(self) -> StoredJob | None:
        """The job this worker takes next: the oldest queued one (a fleet's worker may prefer others)."""
        return self.store.next_queued()

    def run_engine(self, job_id: str, request, output, *, on_progress, cancel: CancelToken, pause: PauseControl,
                   **previews) -> None:
        """Render the job's clip into `output`, stopping where it is while `pause` is paused; raises
        NotTaken when the engine never took it."""
        self.engine.generate(request, output, overwrite=False, want_frames=False, want_audio=False,
                             on_progress=on_progress, cancel=cancel, pause=pause, **previews)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while True:
            if not self._stopping and not self.ready():
                with self._wake:
                    self._wake.wait(timeout=NOT_READY_WAIT)
                continue
            with self._wake:
                while not self._stopping and (job := self.next_job()) is None:
                    self._wake.wait(timeout=1.0)
                if self._stopping:
                    return
                running = _Running(job.id, CancelToken(), threading.Event())
                self._running = running
            try:
                if self.store.start(job.id):
                    self._run(job.id, running)
            except Exception:       # a bug here must not stop the queue
                _log.exception("h3bridge serve: job %s", job.id)
            finally:
                with self._wake:
                    self._running = None
                running.done.set()

    def _run(self, job_id: str, running: _Running) -> None:
        job = self.store.get(job_id)
        if job is None:
            return
        last: list[tuple[int, str]] = [(-1, "")]

        def on_progress(event: ProgressEvent) -> None:
            if event.phase == PAUSED_PHASE:     # set_paused has told the stream already
                return
            running.last = event
            report = (progress_percent(event.fraction), event.phase)
            if report != last[0]:
                last[0] = report
                self.store.report(job_id, *report)
            self.events.progress(job_id, event, progress=report[0])

        def on_preview(preview: PreviewFrame) -> None:
            self.events.preview(job_id, preview)

        try:
            request = self.store.request_of(job).validate()
            previews = {"on_preview": on_preview} if self.previews and self.engine.capabilities.previews else {}
            self.run_engine(job_id, request, self.store.video_path(job_id), on_progress=on_progress,
                            cancel=running.cancel, pause=running.pause, **previews)
        except NotTaken:
            self.store.requeue(job_id)
            return
        except GenerationCancelled:
            if self.store.get(job_id) is not None:      # not deleted: the server is stopping
                self.store.requeue(job_id)
            return
        except H3BridgeError as error:
            self.store.fail(job_id, failure(error))
            self._ended(job_id, "failed")
            _log.warning("h3bridge serve: job %s failed: %s", job_id, error.message)
            return
        except Exception as error:  # an unforeseen failure fails the job, with its words, not the server
            self.store.fail(job_id, VideoError(code=ErrorCode.ENGINE_FAILED.value, type="server_error",
                                               message=f"{type(error).__name__}: {error}"))
            self._ended(job_id, "failed")
            _log.exception("h3bridge serve: job %s", job_id)
            return
        self.store.complete(job_id)
        self._ended(job_id, "completed")

    def _ended(self, job_id: str, status) -> None:
        """The job's event streams end, with the job as it now is."""
        job = self.store.get(job_id)
        self.events.end(job_id, status, job.video_job() if job is not None else None)


def failure(error: H3BridgeError) -> VideoError:
    """A failed job's error object: the library's message, h3's own words when it said any, the fix."""
    message = error.message_in(http_words)
    engine_message = getattr(error, "engine_message", None)
    if engine_message and engine_message not in message:
        message = f"{message} (h3 said: {engine_message})"
    code = ErrorCode.REFUSED if error.before_start else ErrorCode.ENGINE_FAILED
    return VideoError(code=code.value, type="invalid_request_error" if isinstance(error, RequestError) else "server_error",
                      message=message, hint=error.hint_in(http_words), param=getattr(error, "field", None))
