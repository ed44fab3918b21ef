"""The one-shot engine: one `h3` process per request, supervised from Python.

    from h3bridge import GenerationRequest, OneShotEngine
    engine = OneShotEngine(model_dir="~/models/MiniMax-H3")
    result = engine.generate(GenerationRequest("A red fox runs through snow"), Path("fox.mp4"))

The engine is antirez's `h3` binary (or any program with the same command line,
such as `h3-sim`). Everything here works from h3's observable behaviour: its flags
(main.c), its stderr progress records and `h3: <message>` lines, its exit codes
(0 ok, 2 usage, 1 failure), and its `--frames-dir` PPM files.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Sequence


from ..cancel import CancelToken, PauseControl
from .child import NOTHING, ChildJob, Nothing
from .job import Rendered, check_disks, open_job, run_job
from .process import EngineProcess, signal_name
from ..errors import (
    EngineCrashedError,
    EngineError,
    EngineNotFoundError,
    EngineStalledError,
    GenerationCancelled,
)
from ..history.recorder import recorded
from ..media.decode import read_frames_dir
from .lock import EngineLock, engine_lock
from ..progress import ProgressCallback, ProgressTracker
from ..request import GenerationRequest
from ..result import GenerationResult
from .disk import (
    DiskNeed,
    existing_folder,
    expected_clip_bytes,
    expected_frames_bytes,
    raise_for_disk_problem,
)
from .locate import (
    ENGINE_BUILD_HINT,
    MediaTools,
    check_media_tools,
    engine_environment,
    engine_variables,
    engine_working_directory,
    locate_engine,
    locate_media_tools,
    locate_model_dir,
)
from .h3_command import (
    argument_limit_error,
    check_argument_limits,
    engine_message_from,
    expected_phases,
    reference_arguments,
    request_arguments,
)
from .hints import failure_hint, phase_words
from .output import JobFiles, finish_result, raise_if_cancelled, resolve_output, staging_path
from .holder import waiting_reporter
from .protocol import EngineCapabilities
from ..progress import PreviewCallback

POLL_SECONDS = 0.05


# ----------------------------------------------------------------------------- locating things


# ----------------------------------------------------------------------------- command line


# ----------------------------------------------------------------------------- shared by every engine
# (the one-shot engine here and the warm session in session.py)


# ----------------------------------------------------------------------------- disks
# A full or read-only disk must be named as such. Without this, a full disk stops FFmpeg mid-clip,
# h3 then reports "cannot stream generated A/V to FFmpeg: Broken pipe" (h3_ffmpeg.c), and the
# advice would be to install FFmpeg. Both engines use what follows: a check before the render,
# and the same wording when the disk still stops one (from FFmpeg's stderr, or an OSError).


def one_shot_disk_needs(request: GenerationRequest, output_path: Path | None, *, writes_mp4: bool,
                        want_frames: bool) -> list[DiskNeed]:
    """Where a one-shot job writes: its MP4 beside the output (or in h3bridge's temporary folder
    when only the audio is wanted), and the frames in h3bridge's temporary folder."""
    temporary = Path(tempfile.gettempdir())
    needs = []
    if output_path is not None:
        needs.append(DiskNeed(existing_folder(output_path.parent), "the output folder", expected_clip_bytes(request)))
    elif writes_mp4:
        needs.append(DiskNeed(temporary, "h3bridge's temporary folder", expected_clip_bytes(request)))
    if want_frames:
        needs.append(DiskNeed(temporary, "h3bridge's temporary folder (frames)", expected_frames_bytes(request)))
    return needs


# ----------------------------------------------------------------------------- the command line's size


# ----------------------------------------------------------------------------- the engine

class OneShotEngine:
    """Runs one `h3` process per request.

    engine_path: the h3 binary (default: env H3_BIN, then `h3` on PATH), see locate_engine.
    model_dir: the MiniMax-H3 directory (default: env H3_MODEL_DIR).
    stall_timeout: kill the engine if it reports no progress for this many seconds
      (None disables the watchdog). The tiled video VAE decode reports nothing at
      upstream 8974cc0, so keep this generous on large clips.
    lock_path: the engine lock file (default lock.default_lock_path()); a warm engine's one-shot
      fallback takes the warm engine's, so the two never run at once.
    background: run each engine at background priority (engines/priority.py).
    """

    def __init__(self, engine_path: str | os.PathLike[str] | None = None,
                 model_dir: str | os.PathLike[str] | None = None, *,
                 stall_timeout: float | None = 600.0, lock_path: Path | None = None,
                 background: bool = False) -> None:
        self.engine_path = locate_engine(engine_path)
        self.model_dir = locate_model_dir(model_dir)
        self.stall_timeout = stall_timeout
        self.lock_path = lock_path
        self.background = background

    def command(self, request: GenerationRequest, output_arg: str, frames_dir: str | None) -> list[str]:
        """The exact argv for one job (`output_arg` '' means no MP4, as in h3)."""
        argv = [str(self.engine_path), "-d", str(self.model_dir), "-p", request.prompt, "-o", output_arg]
        argv += request_arguments(request)
        if frames_dir is not None:
            argv += ["--frames-dir", frames_dir]
        return argv

    def environment(self, tools: MediaTools) -> dict[str, str]:
        return engine_environment(tools)

    # The `Engine` protocol (protocol.py): nothing stays loaded between jobs, frames come from
    # h3's own `--frames-dir` PPMs (exact RGB), every valid request runs, there is nothing to close.
    capabilities = EngineCapabilities(warm_model=False, previews=False, exact_frames=True, remote=False,
                                      multiline_prompts=True)

    def check_supported(self, request: GenerationRequest) -> None:
        """Every valid request runs one-shot (a prompt over the OS argument limit is a
        RequestError from `generate`, before anything starts)."""

    def close(self) -> None:
        """Nothing to release: each job's engine is gone when `generate` returns."""

    def __enter__(self) -> "OneShotEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @recorded("one-shot")     # the job history (history/recorder.py)
    def generate(self, request: GenerationRequest, output: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, want_frames: bool = True, want_audio: bool = True,
                 on_progress: ProgressCallback | None = None, on_preview: PreviewCallback | None = None,
                 cancel: CancelToken | None = None, pause: PauseControl | None = None) -> GenerationResult:
        """Render one clip and return its frames, audio and MP4 (the `Engine` protocol).

        output: where the MP4 goes (None: no MP4 is kept). It is written under a temporary
          name in the same directory and renamed into place only on success; an existing
          file is never replaced unless `overwrite` (OutputExistsError before the engine starts).
        want_frames: read the frames into `result.frames` (uint8 [F, H, W, 3]).
        want_audio: decode the soundtrack into `result.audio` (float32 [channels, samples], 32 kHz).
        on_progress: called with ProgressEvents from the calling thread.
        on_preview: accepted and never called: the h3 command line shows denoise previews only
          on a terminal (`--show`).
        cancel: a CancelToken; cancelling (from any thread) stops the engine within a second
          and raises GenerationCancelled. No output or temporary file is left behind.
        pause: a PauseControl; while paused, h3's process group (FFmpeg too) is stopped, at any
          phase, and the stall watchdog and the timings leave that time out (child.py).

        Raises RequestError (bad request), OutputExistsError, EngineNotFoundError (FFmpeg
        missing), EngineError / EngineCrashedError / EngineStalledError (h3 failed; h3's own
        message is in `engine_message`), GenerationCancelled.
        """
        job = open_job(request, output, overwrite=overwrite, want_frames=want_frames, want_audio=want_audio,
                       cancel=cancel)
        check_media_tools(request, writes_mp4=job.writes_mp4)
        disk_needs = one_shot_disk_needs(request, job.output_path, writes_mp4=job.writes_mp4, want_frames=want_frames)
        check_disks(disk_needs)

        def run(files: JobFiles) -> Rendered:
            workdir, mp4_temp = files.workdir, files.mp4_temp
            frames_dir = workdir / "frames" if want_frames else None
            argv = self.command(request, "" if mp4_temp is None else str(mp4_temp),
                                None if frames_dir is None else str(frames_dir))
            # One engine per machine (lock.py): wait, cancellably, while another holds the model.
            env = self.environment(locate_media_tools())
            check_argument_limits(argv, env, request.prompt)
            with engine_lock(cancel=cancel, on_wait=waiting_reporter(on_progress, self.lock_path),
                             path=self.lock_path) as lock:
                stderr, timings = self._run(argv, request, env, writes_mp4=mp4_temp is not None,
                                            on_progress=on_progress, cancel=cancel, pause=pause, lock=lock,
                                            disk_needs=disk_needs,
                                            leftovers=[path for path in (mp4_temp, workdir) if path is not None])
            return Rendered(timings=timings, command=argv, engine_log=stderr, engine_variables=engine_variables(env),
                            read_frames=None if frames_dir is None else
                            lambda: read_frames_dir(frames_dir, request.frame_count, request.width, request.height))

        return run_job(job, run)

    def _run(self, argv: list[str], request: GenerationRequest, env: dict[str, str], *, writes_mp4: bool,
             on_progress: ProgressCallback | None, cancel: CancelToken | None, lock: EngineLock,
             pause: PauseControl | None = None,
             leftovers: list[Path], disk_needs: Sequence[DiskNeed] = ()) -> tuple[str, dict[str, float]]:
        """Run h3 to completion under supervision; return (stderr, timings) or raise.

        The engine is recorded beside the held lock with the temporary files it writes
        (`leftovers`), so that if this process dies, the next holder stops it and removes them.
        A disk in `disk_needs` that stopped FFmpeg or h3 is reported as a DiskError, even when
        h3 exited 0 (an FFmpeg that failed writing the MP4 trailer may exit 0 with a truncated file)."""
        child = ChildJob(cancel=cancel, pause=pause, stall_timeout=lambda: self.stall_timeout, on_progress=on_progress)
        tracker = ProgressTracker(expected_phases(request, writes_mp4=writes_mp4), child.now())
        try:
            # h3 opens h3_shaders.metal by relative path: run it from its own directory.
            process = EngineProcess(argv, cwd=engine_working_directory(self.engine_path), env=env,
                                    background=self.background)
        except OSError as error:
            if error.errno == errno.E2BIG:    # the prompt is over the system's argument limit
                raise argument_limit_error(argv, env, request.prompt) from None
            raise EngineNotFoundError(f"cannot start the engine {argv[0]}: {error.strerror}",
                                      hint=ENGINE_BUILD_HINT) from None

        def handle(piece_timeout: float) -> None:
            piece = process.next_piece(piece_timeout)
            while piece is not None:
                child.alive()
                event = tracker.feed(piece.text, piece.complete, now=child.now())
                if event is not None:
                    if on_progress is not None:
                        on_progress(event)
                    child.progressed(event)
                    # a host that cancels on seeing a phase (ComfyUI's interrupt, polled through
                    # CancelToken.check) gets no later phase: on a busy machine the engine's lines
                    # pile up, and draining them all first reported phases past the cancel
                    if cancel is not None and cancel.cancelled:
                        return
                piece = process.next_piece(0)

        def poll(timeout: float) -> int | Nothing:
            handle(timeout)
            if cancel is not None and cancel.cancelled:
                return NOTHING          # the wait raises the cancel
            status = process.poll()
            if status is None:
                return NOTHING
            process.stop()      # sweep up grandchildren (FFmpeg) and let stderr reach EOF
            handle(0)
            return status

        def cancelled() -> BaseException:
            process.stop()
            return GenerationCancelled("generation cancelled; the engine was stopped and no output was kept")

        def stalled() -> BaseException:
            process.stop()
            stderr = process.stderr_text
            message = engine_message_from(stderr)
            return EngineStalledError(
                f"the engine made no progress for {child.stall_words()} "
                f"{phase_words(child.last_event, before=ONE_SHOT_BEFORE_PROGRESS)} and was stopped",
                engine_message=message, exit_code=process.poll(), stderr=stderr,
                command=argv, hint=failure_hint(request, message, stalled=True))

        try:
            with child.attached(process.pgid):
                # Inside the try: an engine whose record cannot be written is stopped (EngineError).
                lock.record_engine(process.pid, leftovers=leftovers)
                child.wait(poll, on_cancel=cancelled, on_stall=stalled)
        finally:
            process.stop()
            lock.clear_engine()
        last_event = child.last_event
        stderr = process.stderr_text
        timings = tracker.finish(child.now())
        status = process.popen.returncode
        message = engine_message_from(stderr)
        if status >= 0:
            raise_for_disk_problem(stderr, disk_needs, engine_message=message)
        if status == 0:
            return stderr, timings
        if status < 0:
            raise EngineCrashedError(f"the engine crashed ({signal_name(-status)}) "
                                     f"{phase_words(last_event, before=ONE_SHOT_BEFORE_PROGRESS)}"
                                     + (f", after h3 said: {message}" if message else ""),
                                     engine_message=message, exit_code=status, stderr=stderr, command=argv,
                                     hint=failure_hint(request, message, signal_number=-status))
        if status == 2:
            raise EngineError(f"h3 rejected its command line: {message or 'usage error'}", engine_message=message,
                              exit_code=status, stderr=stderr, command=argv,
                              hint="this h3 build may be older or newer than h3bridge expects (upstream 8974cc0)")
        raise EngineError(f"h3 failed: {message or f'exit status {status}'}", engine_message=message,
                          exit_code=status, stderr=stderr, command=argv, hint=failure_hint(request, message, model_dir=self.model_dir))


# ----------------------------------------------------------------------------- what to do about a failure
# One place for both engines (the one-shot run above and the warm session in session.py).

ONE_SHOT_BEFORE_PROGRESS = "while loading the model, before its first progress report"


__all__ = ["OneShotEngine", "locate_engine", "locate_model_dir", "locate_media_tools", "MediaTools",
           "request_arguments", "expected_phases", "engine_message_from", "resolve_output", "check_media_tools",
           "engine_environment", "waiting_reporter", "finish_result", "staging_path", "raise_if_cancelled",
           "reference_arguments"]
