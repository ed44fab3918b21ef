"""Recording every job an engine runs, around its `generate`: one decorator per engine.

    from ..history.recorder import recorded

    class MyEngine:
        @recorded("my-engine")
        def generate(self, request, output=None, *, ..., on_progress=None, ...): ...

The decorated `generate` (the `Engine` protocol's signature) then

* looks up past runs of the request's shape on this device (this engine's at this engine path
  first, then this engine's, then any engine's) and, when there are some, adds `eta` (seconds
  left, history/eta.py) to every ProgressEvent the caller receives and replaces its `fraction`
  with the fraction done in those runs' seconds (the engine's own is weighed by upstream's costs,
  which another engine, h3-sim, or another machine does not follow); a shape with no past runs
  gets the upstream cost model's phases in this machine's seconds when `h3bridge selftest` has
  calibrated it (history/calibration.py);
* inserts a `running` row before the engine starts (so a host killed mid-job leaves a row,
  shown as `interrupted`), and when `generate` returns or raises, records the outcome
  (`completed`, `failed` with the message, `cancelled`), the run and waiting times and each
  phase's seconds. Completed jobs keep the engine's own `result.timings` when it has them;
  otherwise (and for failed or cancelled jobs) the phases are timed from the ProgressEvents
  as they arrive here. A completed job also gets `finishing` (stats.FINISHING): from the last
  progress record to `generate` returning (publishing, reading frames and audio back), which
  the ETA counts too. A request refused before anything ran (`before_start` errors: a bad
  request, an existing output, a full disk, a request this engine cannot take) leaves no row.

The engine's name is the decorator's argument. The device is this machine
(`job.local_device()`); an engine that runs jobs elsewhere (a remote engine) says where by
defining `history_device(self) -> history.job.Device`. `engine_path` is recorded when the
engine has that attribute.

The history is a courtesy: if its file is broken, locked or missing a folder, the job runs
without a record and one warning per job is logged (logger "h3bridge.history"; without logging
configured Python prints it on stderr). A failing history is never the render's failure.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from ..errors import GenerationCancelled, H3BridgeError
from ..cancel import PauseControl
from ..progress import PAUSED_PHASE, WAITING_PHASE, ProgressCallback, ProgressEvent
from ..request import GenerationRequest
from .calibration import calibrated_phase_seconds, load_calibration
from .eta import EtaEstimator
from .job import Device, local_device, request_record, shape_key
from .stats import FINISHING, expected_finishing_seconds, expected_phase_seconds, expected_starting_seconds
from .store import CANCELLED, COMPLETED, FAILED, HistoryStore, HistoryUnavailable, JobEnd, JobRow, NewJob

log = logging.getLogger("h3bridge.history")
# How many past runs of a shape the ETA is taken from (the newest).
ETA_RUNS = 20

Generate = TypeVar("Generate", bound=Callable[..., Any])


def recorded(engine: str) -> Callable[[Generate], Generate]:
    """Decorate an engine's `generate` so every job it runs is recorded (module docstring)."""
    def decorate(generate: Generate) -> Generate:
        @functools.wraps(generate)
        def generate_and_record(self: Any, request: GenerationRequest, output: Any = None, **options: Any) -> Any:
            if _UNRECORDED.get():
                return generate(self, request, output, **options)
            job = JobRecorder.begin(engine, request, output, engine_object=self, pause=options.get("pause"))
            options["on_progress"] = job.progress_callback(options.get("on_progress"))
            try:
                result = generate(self, request, output, **options)
            except BaseException as error:
                job.end_with_error(error)
                raise
            job.end_with_result(result)
            return result
        return generate_and_record  # type: ignore[return-value]
    return decorate


# Jobs run inside `unrecorded()` (in this thread) leave no row: `h3bridge selftest` measures the
# machine without touching the user's history (it writes only its calibration entry).
_UNRECORDED: ContextVar[bool] = ContextVar("h3bridge_unrecorded", default=False)


@contextmanager
def unrecorded() -> Iterator[None]:
    """Run jobs without recording them in the job history (nor reading it for an ETA)."""
    token = _UNRECORDED.set(True)
    try:
        yield
    finally:
        _UNRECORDED.reset(token)


class JobRecorder:
    """One job's record. Every store operation is guarded: the first failure logs the warning
    and turns the rest of this job's recording off."""

    def __init__(self, store: HistoryStore | None, started: float, expected: dict[str, float]) -> None:
        self.store = store
        self.started = started
        self.job_id: int | None = None
        self.estimator = EtaEstimator(expected, started)
        self.last_event_at: float | None = None     # when the engine's last progress record came
        self.clock: Callable[[], float] = time.monotonic    # paused time left out (begin)

    # ------------------------------------------------------------------ start

    @classmethod
    def begin(cls, engine: str, request: GenerationRequest, output: Any, *, engine_object: Any = None,
              store: HistoryStore | None = None, pause: PauseControl | None = None) -> "JobRecorder":
        # The job's times leave its paused seconds out, as the engine's own timings do.
        clock = time.monotonic if pause is None else (lambda: time.monotonic() - pause.paused_seconds())
        recorder = cls._begin(engine, request, output, engine_object=engine_object, store=store, started=clock())
        recorder.clock = clock
        return recorder

    @classmethod
    def _begin(cls, engine: str, request: GenerationRequest, output: Any, *, engine_object: Any,
               store: HistoryStore | None, started: float) -> "JobRecorder":
        store = store if store is not None else HistoryStore()
        if not store.enabled:
            return cls(None, started, {})
        try:
            shape = shape_key(request)
            record = request_record(request)
        except (H3BridgeError, ValueError, TypeError, AttributeError):
            return cls(None, started, {})     # not a valid request: generate refuses it, nothing runs
        recorder = cls(store, started, {})
        try:
            device = _device_of(engine_object)
            path = getattr(engine_object, "engine_path", None)
            past = _past_runs(store, device, shape, engine, None if path is None else str(path))
            if past:
                recorder.estimator = EtaEstimator(expected_phase_seconds(past), started,
                                                  finishing=expected_finishing_seconds(past),
                                                  starting=expected_starting_seconds(past))
            else:       # a shape never run here: the cost model in this machine's seconds, if a selftest measured them
                calibration = load_calibration(store=store, device=device, engine=engine,
                                               engine_path=None if path is None else str(path))
                if calibration is not None:
                    recorder.estimator = EtaEstimator(calibrated_phase_seconds(
                        request, calibration, writes_mp4=output is not None and output != ""), started)
            pid, pid_started = _this_process()
            recorder.job_id = store.start_job(NewJob(
                engine=engine, device=device, shape=shape, request=record,
                engine_path=None if path is None else str(path),
                output=None if output is None or output == "" else str(Path(output)),
                program=Path(sys.argv[0]).name if sys.argv and sys.argv[0] else None,
                pid=pid, pid_started=pid_started))
        except Exception as error:  # noqa: BLE001 - nothing in the history may fail a render
            recorder._give_up(error)
        return recorder

    # ------------------------------------------------------------------ during

    def progress_callback(self, on_progress: ProgressCallback | None) -> ProgressCallback:
        """The callback the engine gets: times the phases, adds the ETA, passes the event on."""
        def forward(event: ProgressEvent) -> None:
            if event.phase == PAUSED_PHASE:       # not a phase of the engine's: nothing to time
                if on_progress is not None:
                    on_progress(event)
                return
            now = self.clock()
            if event.phase != WAITING_PHASE:
                self.last_event_at = now
            try:
                eta = self.estimator.estimate(event, now)
                fraction = None if eta is None else self.estimator.fraction()
            except Exception:  # noqa: BLE001 - an estimate is never worth a failed render
                eta = fraction = None
            if on_progress is not None:
                if eta is not None:
                    event = replace(event, eta=eta, fraction=event.fraction if fraction is None else fraction)
                on_progress(event)
        return forward

    # ------------------------------------------------------------------ end

    def end_with_result(self, result: Any) -> None:
        engine_timings = {p: s for p, s in (getattr(result, "timings", None) or {}).items() if p != "total"}
        self._end(COMPLETED, engine_timings=engine_timings)

    def end_with_error(self, error: BaseException) -> None:
        if isinstance(error, H3BridgeError) and error.before_start:
            if self.store is not None and self.job_id is not None:
                try:
                    self.store.forget_job(self.job_id)
                except Exception as problem:  # noqa: BLE001
                    self._give_up(problem)
            return
        if isinstance(error, (GenerationCancelled, KeyboardInterrupt)):
            outcome = CANCELLED
        else:
            outcome = FAILED
        message = error.message if isinstance(error, H3BridgeError) else (str(error) or type(error).__name__)
        self._end(outcome, error_type=type(error).__name__, message=message,
                  engine_message=getattr(error, "engine_message", None))

    def _end(self, outcome: str, *, engine_timings: dict[str, float] | None = None, error_type: str | None = None,
             message: str | None = None, engine_message: str | None = None) -> None:
        if self.store is None or self.job_id is None:
            return
        try:
            now = self.clock()
            timings = self.estimator.tracker.finish(now)
            total = timings.pop("total")
            waited = timings.pop(WAITING_PHASE, 0.0)
            phases = dict(engine_timings or timings)
            if outcome == COMPLETED and self.last_event_at is not None:
                phases[FINISHING] = now - self.last_event_at
            self.store.finish_job(self.job_id, JobEnd(
                outcome=outcome, phases=phases, total_seconds=total, waited_seconds=waited,
                error_type=error_type, message=message, engine_message=engine_message))
        except Exception as error:  # noqa: BLE001
            self._give_up(error)

    def _give_up(self, error: BaseException) -> None:
        """The one warning of this job; no more history work for it."""
        if self.store is None:
            return
        self.store = None
        if isinstance(error, HistoryUnavailable):
            log.warning("h3bridge: job history skipped, the render goes on: %s", error)
        else:
            log.warning("h3bridge: job history skipped, the render goes on: %s: %s", type(error).__name__, error)


def _device_of(engine_object: Any) -> Device:
    method = getattr(engine_object, "history_device", None)
    return method() if callable(method) else local_device()


def _past_runs(store: HistoryStore, device: Device, shape: str, engine: str, engine_path: str | None) -> list[JobRow]:
    """Past completed runs of this shape on this device: this engine's with this engine program
    if it has any (h3-sim and h3 on one Mac are one engine kind, not one speed), else this
    engine's, else every engine's (the first job in a warm session runs like a one-shot job)."""
    return (engine_path is not None and store.completed_jobs(device=device, shape=shape, engine=engine,
                                                             engine_path=engine_path, limit=ETA_RUNS)) \
        or store.completed_jobs(device=device, shape=shape, engine=engine, limit=ETA_RUNS) \
        or store.completed_jobs(device=device, shape=shape, limit=ETA_RUNS)


def _this_process() -> tuple[int, float | None]:
    import psutil
    try:
        return os.getpid(), psutil.Process().create_time()
    except psutil.Error:
        return os.getpid(), None


__all__ = ["recorded", "JobRecorder", "ETA_RUNS", "unrecorded"]
