"""The library engine: libh3 (upstream's C API, h3.h) through ctypes, in a supervised worker.

    from h3bridge import LibraryEngine
    with LibraryEngine("~/h3.c/libh3.dylib", "~/models/MiniMax-H3") as engine:
        result = engine.generate(request, "fox.mp4", on_preview=show)   # result.frames: exact RGB

What it gives over the CLI engines (oneshot.py, session.py):

* previews: `on_preview` gets a `PreviewFrame` after every Euler step (`preview_denoise = 1`;
  it costs upstream's preview VAE, ~10 GiB, phase "preview VAE load", so it is off unless asked);
* exact frames without PPM files: `on_frame` in the worker writes each final frame into a
  memory-mapped file the host maps as `result.frames` (uint8 [F, H, W, 3]); nothing goes
  through a pipe and the host holds the array once (the file is unlinked at once, the mapping
  stays);
* a warm model for any prompt (no line protocol: several lines, leading '!' all fine), with
  `h3_cache_set_enabled(ctx, 1)` as upstream's interactive mode does;
* a cancel that reaches C: the progress callback returns 1 (upstream unwinds at its next
  check, "generation cancelled during <phase>").

The library runs in a worker process (library_worker.py) in its own process group: a Metal
fault or a segfault in C ends the worker, never the host. The worker runs in the h3.c checkout
(`h3_dir`, default the library's folder: upstream compiles `h3_shaders.metal` from the working
directory). The warm-engine rules are warm.py's (machine-wide lock while the worker lives, idle
timeout, stepping aside). A job that is cancelled, crashes, stalls or whose callback raises
takes the worker with it only when `h3_generate` does not return (its state is unknown then); a
job h3 refuses (`h3_generate` returned NULL) leaves it warm, as upstream's interactive loop does.

Cancel (a CancelToken, or ComfyUI's interrupt raised from a callback): the worker is told at once
and its callbacks return 1. libh3 has no other cancel: upstream (h3.c 8974cc0) records the
callback's 1 and looks at it only between phases (`if (progress.cancelled) goto cleanup;`), and
during denoising also after each step when previews are on (`on_frame` returning 1 stops the
sampler). If `h3_generate` returns within CANCEL_GRACE seconds, it returned through the same
cleanup as any refused job: the context and its caches stay valid (upstream itself drops a DiT a
cancel interrupted mid-denoise), so the worker stays warm and the next job loads nothing. If it
has not (the cancel landed inside a long phase: a DiT or VAE load, the text encoder, denoising
without previews, the tiled VAE decode, which report progress but never look at the answer
until they end), the worker's process group is killed. Either way the job ends within a second
and nothing of it is left.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..cancel import CancelToken, PauseControl
from ..fixes import Blank, Fix, changes, literal
from .child import NOTHING, ChildJob, Deadline, Nothing, child_gone, reap, wait_until
from .job import Rendered, check_disks, open_job, run_job
from ..errors import (
    EngineError,
    EngineNotFoundError,
    EngineStalledError,
    GenerationCancelled,
    LibraryLoadError,
    ModelError,
)
from ..history.recorder import recorded
from ..model.memory import MachineFacts
from ..progress import PreviewCallback, PreviewFrame, ProgressCallback, ProgressEvent, ProgressTracker
from ..request import GenerationRequest
from ..result import GenerationResult
from ..upstream_costs import REFERENCE_SECONDS
from .disk import DiskNeed, raise_for_disk_problem
from .h3_command import engine_message_from, expected_phases
from .hints import failure_hint, phase_words
from .library_wire import h3_params_fields, h3_references, receive, send
from .locate import check_media_tools, engine_environment, engine_variables, locate_media_tools, locate_model_dir
from .oneshot import one_shot_disk_needs
from .output import JobFiles
from .process import EngineChild, EngineProcess
from .protocol import EngineCapabilities
from .warm import DEFAULT_IDLE_TIMEOUT, WarmEngine

LIBRARY_ENV = "H3_LIBRARY"
# After a cancel: how long h3_generate may take to return on its own (the worker then stays warm)
# before the group is killed; with CANCEL_KILL_GRACE and the host's reaping, the job ends within a
# second even with every CPU busy (bench/bench_interrupt.py).
CANCEL_GRACE = 0.5
# SIGTERM to SIGKILL when a cancelled job's worker is killed: its output is thrown away anyway.
CANCEL_KILL_GRACE = 0.1
# How often the job loop looks at the cancel token and the watchdog.
POLL_SECONDS = 0.05
# How long a worker may take to load the library and h3_load_dir (metadata only, no weights).
LOAD_TIMEOUT = 120.0
WORKER_MODULE = "h3bridge.engines.library_worker"
WORKER_BEFORE_PROGRESS = "before the job's first progress report"
WORKER_STARTING = "while the worker loaded the library (before any progress report)"


def locate_library(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The libh3 shared library: `explicit`, else $H3_LIBRARY; checked as libh3.load_library
    checks it (missing, not a library, a static archive, the wrong OS or CPU: LibraryLoadError)."""
    from ..libh3 import check_library_file, _fix_hint

    raw = os.fspath(explicit) if explicit is not None and os.fspath(explicit) else os.environ.get(LIBRARY_ENV)
    if not raw:
        raise LibraryLoadError(f"no libh3 library given (no library path, {LIBRARY_ENV} unset)",
                               hint=Fix("pass {} or set H3_LIBRARY; " + literal(_fix_hint()),
                                        (changes(library_path=Blank("PATH")),)))
    return check_library_file(Path(raw).expanduser().absolute()).absolute()


def machine_facts_from_device(device: Mapping[str, Any]) -> MachineFacts:
    """The memory plan's machine from `h3_device()`: Metal's recommended working set is what the
    GPU may hold (better than psutil's total), the device name says the chip (M5: int8 DiT)."""
    total = int(device.get("physical_memory") or 0)
    working_set = int(device.get("recommended_working_set") or 0) or None
    return MachineFacts(total_memory=total, chip=str(device.get("name") or "") or None, system="Darwin",
                        tensor_ops_disabled=os.environ.get("H3_NAX") == "0", gpu_working_set=working_set)


# ============================================================================ the worker process

@dataclass(frozen=True)
class _WorkerIdentity:
    """What a worker was started from; any change means a restart."""

    library: str
    mtime_ns: int
    size: int
    model_dir: str
    cwd: str
    engine_variables: tuple[tuple[str, str], ...]


class _Worker(EngineChild):
    """One library worker: our messages to its stdin, its messages (read by a thread) in `messages`,
    its stderr (libh3's own prints: cache notices, warnings) through EngineProcess."""

    def __init__(self, argv: list[str], *, cwd: str, env: dict[str, str], background: bool = False) -> None:
        self.engine = EngineProcess(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    background=background)
        self.messages: "queue.Queue[tuple[dict[str, Any], bytes | None] | None]" = queue.Queue()
        self.ready: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read, name=f"h3-library-worker-{self.pid}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stream = self.engine.popen.stdout
        assert stream is not None
        try:
            while True:
                item = receive(stream)
                if item is None:
                    break
                self.messages.put(item)
        except (OSError, ValueError):
            pass
        self.messages.put(None)

    def send(self, message: dict[str, Any]) -> bool:
        stdin = self.engine.popen.stdin
        try:
            assert stdin is not None
            send(stdin, message)
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False     # the worker is gone: its control stream hits EOF and the job says why

    def stderr_since(self, offset: int) -> str:
        return self.engine.stderr_text[offset:]

    def drain_stderr(self) -> bool:
        """Consume the stderr pieces (they are also kept whole in stderr_text); True if any came."""
        came = False
        while self.engine.pieces.qsize():
            try:
                self.engine.pieces.get_nowait()
            except queue.Empty:
                break
            came = True
        return came

    def kill(self) -> None:
        self.engine.stop()
        for stream in (self.engine.popen.stdin, self.engine.popen.stdout):
            try:
                if stream is not None:
                    stream.close()
            except (OSError, ValueError):
                pass
        self._reader.join(timeout=1)


@dataclass
class _Job:
    request: GenerationRequest
    tracker: ProgressTracker
    on_progress: ProgressCallback | None
    on_preview: PreviewCallback | None
    cancel: CancelToken | None
    stderr_offset: int = 0
    last_event: ProgressEvent | None = None
    before_progress: str = WORKER_BEFORE_PROGRESS
    previews: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    disk_needs: list[DiskNeed] = field(default_factory=list)     # where the job writes (disk-full errors)
    child: ChildJob = None  # type: ignore[assignment]   # cancel, pause and the stall watchdog (child.py)

    def __post_init__(self) -> None:
        if self.child is None:
            self.child = ChildJob(cancel=self.cancel, pause=None, stall_timeout=None, on_progress=self.on_progress)

    def where(self) -> str:
        return phase_words(self.last_event, before=self.before_progress)


class _CallbackRaised(Exception):
    """Internal: the caller's on_progress/on_preview raised `error`."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


# ============================================================================ the engine

class LibraryEngine(WarmEngine):
    """MiniMax-H3 through libh3 in a warm worker process (see the module docstring).

    Parameters:
        library_path: libh3's shared library (a .dylib from `h3bridge build-engine`, or the test
            double from `h3-sim-lib`); default $H3_LIBRARY.
        model_dir: the MiniMax-H3 directory (default $H3_MODEL_DIR).
        h3_dir: the worker's working directory, the h3.c checkout holding h3_shaders.metal
            (default: the library's own folder, where build-engine writes it).
        idle_timeout: seconds without a job after which the worker exits (memory goes back).
        stall_timeout: kill the worker when a job reports nothing for this long (None: never).
        lock_path, env: the engine lock file; the worker's environment (default ours with FFmpeg pinned).
        background: run the worker at background priority (engines/priority.py; settable later).
    """

    idle_thread_name = "h3-library-idle"

    def __init__(self, library_path: str | os.PathLike[str] | None = None,
                 model_dir: str | os.PathLike[str] | None = None, *, h3_dir: str | os.PathLike[str] | None = None,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, stall_timeout: float | None = 600.0,
                 lock_path: Path | None = None, env: dict[str, str] | None = None, background: bool = False) -> None:
        self.library_path = locate_library(library_path)
        self.model_dir = locate_model_dir(model_dir)
        self.h3_dir = Path(h3_dir).expanduser().absolute() if h3_dir else self.library_path.resolve().parent
        if not self.h3_dir.is_dir():
            raise EngineNotFoundError(f"the h3.c folder {self.h3_dir} (h3_dir) does not exist",
                                      hint="give the h3.c checkout the library was built from (it holds "
                                           "h3_shaders.metal, which libh3 compiles at run time)")
        super().__init__(idle_timeout=idle_timeout, lock_path=lock_path, background=background)
        # True while a failed job left the worker warm and waiting; set and read only under the job guard
        self._worker_idle_after_failure = False
        self.stall_timeout = stall_timeout
        self.env = env
        self._worker: _Worker | None = None
        self._identity: _WorkerIdentity | None = None
        self._device: dict[str, Any] | None = None
        self._job_number = 0
        self.starts = 0          # workers started so far (tests and benchmarks read it)
        self.jobs = 0

    # ------------------------------------------------------------------ public surface

    @property
    def device(self) -> dict[str, Any] | None:
        """`h3_device()` as the last worker reported it (name, memory, GPU family, ...)."""
        return self._device

    capabilities = EngineCapabilities(warm_model=True, previews=True, exact_frames=True, remote=False,
                                      multiline_prompts=True)

    def check_supported(self, request: GenerationRequest) -> None:
        """Every valid request runs: the prompt and the paths reach h3_generate as C strings."""

    def machine_facts(self, *, cancel: CancelToken | None = None,
                      on_progress: ProgressCallback | None = None) -> MachineFacts:
        """The memory plan's machine facts from the library's `h3_device()`: from the running
        worker, else from a worker started only to load the library and the model's metadata
        (no weights) and stopped again. That worker is started as a job's is: after the model
        check (a FIFO or a device among the files h3_load_dir opens is refused, never waited on),
        under the machine-wide engine lock and recorded in it, and `cancel` (a SIGTERM, in the
        CLI) stops it and the wait for the lock."""
        if self._device is None:
            env = self._environment(locate_media_tools())
            probe = _Job(GenerationRequest("probe"), ProgressTracker((), time.monotonic()), on_progress, None, cancel)
            with self._job(on_progress=on_progress, cancel=cancel):
                try:
                    self._ensure_worker(env, probe)
                finally:
                    if self._worker is not None:
                        self._shutdown(graceful=True)       # only its facts were wanted
        assert self._device is not None
        return machine_facts_from_device(self._device)

    @recorded("library")     # the job history (history/recorder.py)
    def generate(self, request: GenerationRequest, output: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, want_frames: bool = True, want_audio: bool = True,
                 on_progress: ProgressCallback | None = None, on_preview: PreviewCallback | None = None,
                 cancel: CancelToken | None = None, pause: PauseControl | None = None) -> GenerationResult:
        """Render one clip in the warm worker (the `Engine` protocol). `on_preview` set turns
        upstream's denoise previews on (`preview_denoise = 1`, the ~10 GiB preview VAE); frames
        are the library's own RGB, mapped from a file the worker writes (see the module docstring).

        Raises what the one-shot engine raises; EngineError with `h3_last_error()` verbatim in
        `engine_message` when h3_generate fails; EngineCrashedError when the worker dies (the next
        job starts a new one); LibraryLoadError / ModelError when the library or h3_load_dir fail.
        An exception raised by `on_progress` or `on_preview` stops the job and is re-raised.
        `pause` stops the worker's process group while paused (child.py); the worker stays warm."""
        spec = open_job(request, output, overwrite=overwrite, want_frames=want_frames, want_audio=want_audio,
                        cancel=cancel)
        tools = check_media_tools(request, writes_mp4=spec.writes_mp4)
        disk_needs = one_shot_disk_needs(request, spec.output_path, writes_mp4=spec.writes_mp4, want_frames=want_frames)
        check_disks(disk_needs)
        env = self._environment(tools)
        preview = on_preview is not None
        phases = expected_phases(request, writes_mp4=spec.writes_mp4)
        if preview:
            phases["preview VAE load"] = REFERENCE_SECONDS["preview VAE load"]
        child = ChildJob(cancel=cancel, pause=pause, stall_timeout=lambda: self.stall_timeout, on_progress=on_progress)
        job = _Job(request=request, tracker=ProgressTracker(phases, child.now()), on_progress=on_progress,
                   on_preview=on_preview, cancel=cancel, disk_needs=disk_needs, child=child)

        def run(files: JobFiles) -> Rendered:
            workdir, mp4_temp = files.workdir, files.mp4_temp
            frames_path = workdir / "frames.rgb" if want_frames else None
            shape = (request.frame_count, request.height, request.width)
            if frames_path is not None:
                with open(frames_path, "wb") as handle:
                    handle.truncate(int(np.prod(shape)) * 3)
            job.fields = h3_params_fields(request, output_path=None if mp4_temp is None else str(mp4_temp),
                                          preview=preview)
            with self._job(on_progress=on_progress, cancel=cancel):
                try:
                    self._ensure_worker(env, job)
                    assert self._worker is not None
                    child.attach(self._worker.engine.pgid)     # a worker started by this job is attached already
                    self._lock.record_engine(self._worker.pid, leftovers=[
                        str(path) for path in (mp4_temp, workdir) if path is not None])
                    done = self._run(job, frames_path=frames_path, shape=shape, preview=preview)
                except _CallbackRaised as raised:
                    child.let_go()
                    if self._worker is not None and not self._worker_idle_after_failure:
                        self._shutdown(graceful=False)
                    raise raised.error from None
                except BaseException:
                    child.let_go()
                    if self._worker is not None and not self._worker_idle_after_failure:
                        self._shutdown(graceful=False)
                    raise
                finally:
                    child.detach()      # a warm worker never stays stopped after its job
                self.jobs += 1
                engine_log = self._worker.stderr_since(job.stderr_offset) if self._worker else ""
            timings = job.tracker.finish(child.now())

            def read_frames() -> np.ndarray:
                if done["frames_written"] != request.frame_count:
                    raise EngineError(f"libh3 delivered {done['frames_written']} of {request.frame_count} frames",
                                      stderr=engine_log, command=self._command(job))
                # Copy-on-write: the array is writable, the file never changes; unlinking the
                # file (with workdir, when the job ends) leaves the mapping in place.
                return np.memmap(frames_path, dtype=np.uint8, mode="c", shape=(*shape, 3))

            return Rendered(timings=timings, command=self._command(job), engine_log=engine_log,
                            engine_variables=engine_variables(env), seed=int(done["result"]["seed"]),
                            read_frames=None if frames_path is None else read_frames)

        return run_job(spec, run)

    # ------------------------------------------------------------------ the job


    def _command(self, job: _Job) -> list[str]:
        """What ran, for result.command and error reports: the call and its h3_params fields."""
        return ["h3_generate", str(self.library_path), *(f"{name}={value}" for name, value in job.fields.items())]

    def _run(self, job: _Job, *, frames_path: Path | None, shape: tuple[int, int, int], preview: bool) -> dict:
        worker = self._worker
        assert worker is not None
        self._job_number += 1
        number = self._job_number
        job.stderr_offset = len(worker.engine.stderr_text)
        self._worker_idle_after_failure = False
        worker.send({"op": "generate", "job": number, "prompt": job.request.prompt, "fields": job.fields,
                     "references": h3_references(job.request),
                     "frames_path": None if frames_path is None else str(frames_path),
                     "frame_shape": list(shape), "preview": preview})
        child = job.child

        def poll(timeout: float) -> dict | Nothing:
            try:
                item = worker.messages.get(timeout=timeout)
            except queue.Empty:
                if worker.drain_stderr():
                    child.alive()
                return NOTHING
            child.alive()
            if item is None:
                self._worker_gone(worker, job)
            message, payload = item
            if message.get("job") != number:
                return NOTHING
            kind = message["ev"]
            if kind == "progress":
                event = job.tracker.update(message["phase"], message["done"], message["total"], now=child.now())
                if event is not None:
                    job.last_event = event
                    self._call(job.on_progress, event, worker, number)
                    child.progressed(event)
            elif kind == "preview" and payload is not None:
                image = np.frombuffer(payload, dtype=np.uint8).reshape(message["height"], message["width"], 3)
                job.previews += 1
                self._call(job.on_preview, PreviewFrame(step=message["step"], total_steps=message["total_steps"],
                                                        frame_index=message["frame_index"], image=image),
                           worker, number)
            elif kind == "done":
                return message
            elif kind == "failed":
                self._failed(message, worker, job)
            return NOTHING

        def cancelled() -> BaseException:
            kept = self._cancel(worker, number)
            return GenerationCancelled("generation cancelled; no output was kept and the library worker stays warm"
                                       if kept else
                                       "generation cancelled; the library worker was stopped and no output was kept")

        def stalled() -> BaseException:
            log = worker.stderr_since(job.stderr_offset)
            message = engine_message_from(log)
            return EngineStalledError(
                f"the library worker made no progress for {child.stall_words()} {job.where()} "
                "and was stopped", engine_message=message, stderr=log, command=self._command(job),
                hint=failure_hint(job.request, message, stalled=True))

        return child.wait(poll, on_cancel=cancelled, on_stall=stalled, interval=POLL_SECONDS)

    def _call(self, callback: Any, value: Any, worker: _Worker, number: int) -> None:
        """The caller's callback; if it raises, the job stops (cancel, then the group) and the
        exception is re-raised by generate."""
        if callback is None:
            return
        try:
            callback(value)
        except BaseException as error:      # noqa: BLE001 - re-raised as it was by generate
            self._cancel(worker, number)
            raise _CallbackRaised(error) from None

    def _cancel(self, worker: _Worker, number: int) -> bool:
        """Ask the worker's callbacks to return 1 and give h3_generate CANCEL_GRACE to return:
        then the worker stays warm (True; its context is as after a refused job, see the module
        docstring). Otherwise its process group is stopped (False)."""
        if worker.send({"op": "cancel", "job": number}):
            def poll(timeout: float) -> bool | Nothing:
                try:
                    item = worker.messages.get(timeout=timeout)
                except queue.Empty:
                    return NOTHING
                if item is None:
                    return False
                # "done": the cancel came after the last check (FFmpeg's end); the result is dropped.
                return True if item[0].get("job") == number and item[0]["ev"] in ("done", "failed") else NOTHING

            if wait_until(poll, deadline=Deadline(CANCEL_GRACE), on_expired=lambda: False):
                self._worker_idle_after_failure = True
                return True
        worker.engine.stop(grace=CANCEL_KILL_GRACE)
        self._shutdown(graceful=False)
        return False

    def _failed(self, message: dict[str, Any], worker: _Worker, job: _Job) -> None:
        """h3_generate returned NULL: h3_last_error() verbatim, in the exception family."""
        text = message.get("message")
        log = worker.stderr_since(job.stderr_offset)
        if message.get("callback_error"):
            raise EngineError(f"the library worker's callback failed: {message['callback_error']}",
                              engine_message=text, stderr=log, command=self._command(job))
        self._worker_idle_after_failure = True      # upstream's context is fine after a refused job
        raise_for_disk_problem(log, job.disk_needs, engine_message=text)
        raise EngineError(f"h3 failed: {text}" if text else "h3_generate failed without a message",
                          engine_message=text, exit_code=None, stderr=log, command=self._command(job),
                          hint=failure_hint(job.request, text, model_dir=self.model_dir))

    def _worker_gone(self, worker: _Worker, job: _Job) -> None:
        """The worker's control stream ended: it died. A typed error naming where."""
        ended = reap(worker.engine.popen)
        worker.engine.wait_reader(1.0)
        log = worker.stderr_since(job.stderr_offset)
        message = engine_message_from(log)
        raise child_gone("the library worker", ended, where=job.where(), engine_message=message, stderr=log,
                         command=self._command(job),
                         hint=failure_hint(job.request, message, signal_number=ended.signal) if ended.signal
                         else failure_hint(job.request, message, model_dir=self.model_dir))

    # ------------------------------------------------------------------ worker lifecycle

    def _environment(self, tools: Any) -> dict[str, str]:
        env = dict(self.env) if self.env is not None else engine_environment(tools)
        # The worker runs in the h3.c checkout: it must still import this h3bridge.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
        return env

    def _identity_for(self, env: Mapping[str, str]) -> _WorkerIdentity:
        try:
            stat = self.library_path.stat()
        except OSError:
            locate_library(self.library_path)     # raises the one-sentence error
            raise
        return _WorkerIdentity(library=os.path.realpath(self.library_path), mtime_ns=stat.st_mtime_ns,
                               size=stat.st_size, model_dir=os.path.realpath(self.model_dir), cwd=str(self.h3_dir),
                               engine_variables=tuple(engine_variables(env).items()))

    def _start_worker(self, env: dict[str, str]) -> _Worker:
        locate_library(self.library_path)     # changed since? one sentence before anything starts
        _refuse_special_model_files(self.model_dir)
        argv = [sys.executable, "-m", WORKER_MODULE, str(self.library_path), str(self.model_dir)]
        try:
            return _Worker(argv, cwd=str(self.h3_dir), env=env, background=self.background)
        except OSError as error:
            raise EngineNotFoundError(f"cannot start the library worker ({sys.executable}): {error.strerror}") from None

    def _await_ready(self, worker: _Worker, job: _Job | None) -> None:
        """The worker's first message: "ready" (device and model facts) or "load_failed"."""
        clock = job.child.clock if job is not None else None      # paused time does not count
        deadline = Deadline(LOAD_TIMEOUT, clock)

        def poll(timeout: float) -> bool | Nothing:
            try:
                item = worker.messages.get(timeout=timeout)
            except queue.Empty:
                worker.drain_stderr()
                return NOTHING
            if item is None:
                gone = job if job is not None else _Job(GenerationRequest("probe"),
                                                        ProgressTracker((), time.monotonic()), None, None, None)
                gone.before_progress = WORKER_STARTING
                self._worker_gone(worker, gone)
            message, _ = item
            if message["ev"] == "ready":
                worker.ready = message
                self._device = message.get("device") or {}
                return True
            if message["ev"] == "load_failed":
                text = message.get("message") or "unknown error"
                if message.get("stage") == "model":
                    # h3_load_dir's h3_last_error(NULL), verbatim
                    raise ModelError(f"h3 could not load the model directory {self.model_dir}: {text}",
                                     hint="check the model directory (h3bridge verify)")
                raise LibraryLoadError(text, path=self.library_path, hint=message.get("hint"))
            return NOTHING

        def too_slow() -> bool:
            raise EngineStalledError(f"the library worker did not load the library within {LOAD_TIMEOUT:g} s",
                                     stderr=worker.engine.stderr_text)

        wait_until(poll, cancel=job.cancel if job is not None else None,
                   on_cancel=lambda: GenerationCancelled("cancelled while the library worker started"),
                   deadline=deadline, on_expired=too_slow, interval=POLL_SECONDS,
                   on_idle=job.child.report_pause if job is not None else None)

    def _ensure_worker(self, env: dict[str, str], job: _Job) -> None:
        """Reuse the running worker if it came from the same library, model, folder and H3_*
        variables; otherwise (re)start one, first taking the machine-wide engine lock."""
        identity = self._identity_for(env)
        if self._worker is not None and (not self._worker.alive() or identity != self._identity):
            self._shutdown(graceful=self._worker.alive())
        if self._worker is not None:
            return
        self._take_engine_lock(on_progress=job.on_progress, cancel=job.cancel)
        try:
            self._worker = self._start_worker(env)
            job.child.attach(self._worker.engine.pgid)      # paused while it loads, too
            self._lock.record_engine(self._worker.pid)
            self._identity = identity
            self.starts += 1
            self._await_ready(self._worker, job)
        except BaseException:
            self._shutdown(graceful=False)
            raise

    # WarmEngine's hooks

    def _child(self) -> "_Worker | None":
        return self._worker

    def _stop_engine(self, *, graceful: bool) -> None:
        worker, self._worker = self._worker, None
        self._identity = None
        if worker is not None:
            if graceful and worker.alive():
                worker.quit()
            else:
                worker.kill()

    def _kill_engine_now(self) -> None:
        worker = self._worker
        if worker is not None:
            worker.engine.stop()      # the job's thread sees the control stream end and raises




def _refuse_special_model_files(model_dir: Path) -> None:
    """h3_load_dir opens every shard of the model: a FIFO there blocks it for good (in C, where no
    cancel reaches) and a device never ends. The model check's own finding (stat only, no header
    read) is raised before a worker starts; everything else h3_load_dir reports itself, at once."""
    from ..model.inventory import inspect_model
    for problem in inspect_model(model_dir, read_headers=False).errors:
        if problem.kind == "not-a-file":
            raise problem.exception()


# ============================================================================ one per host process

_shared: dict[tuple[str, str, str], LibraryEngine] = {}
_shared_guard = threading.Lock()


def shared_library_engine(library_path: str | os.PathLike[str] | None = None,
                          model_dir: str | os.PathLike[str] | None = None, *,
                          h3_dir: str | os.PathLike[str] | None = None, **options: Any) -> LibraryEngine:
    """The process-wide LibraryEngine for this library, model and h3.c folder (ComfyUI's library
    mode): every caller gets the same warm worker, which steps aside and times out as warm.py
    says. `options` (LibraryEngine keywords) apply only when it is first created."""
    library = locate_library(library_path)
    model = locate_model_dir(model_dir)
    folder = Path(h3_dir).expanduser().absolute() if h3_dir else library.resolve().parent
    key = (os.path.realpath(library), os.path.realpath(model), str(folder))
    with _shared_guard:
        engine = _shared.get(key)
        if engine is None:
            engine = LibraryEngine(library, model, h3_dir=folder, **options)
            _shared[key] = engine
        return engine


__all__ = ["LibraryEngine", "LIBRARY_ENV", "locate_library", "machine_facts_from_device", "shared_library_engine"]
