"""The selftest itself: every engine this machine has, rendered, cancelled, paused, measured.

For each engine (one-shot, session, library when libh3 is found, remote when a URL is given),
opened by the one factory (engines/factory.open_engine):

1. the smallest legal render, then one at a mid canvas: frames and audio read back and checked,
   previews counted per denoise step, the memory plan's peak beside the measured peak of the engine
   process tree, the cost model's phase seconds beside the measured ones (gaps over 10 % flagged);
2. a cancel in a silent phase (the tiled video decode after "video VAE load" n/n reports nothing),
   one in denoise and one during FFmpeg, each timed from the cancel to the engine stopping, each
   followed by a leftover check (processes, h3bridge's temporary folders, partial files);
3. pause and resume once after the first denoise step (where the engine's `generate` takes a
   `pause`, a capability test): the engine's processes stopped while paused, the clip finished
   whole, and the same leftover check as after a cancel.

Jobs run `unrecorded`: the user's job history is never touched (the calibration, written by
`run_selftest` from the renders that finished, is the one entry it adds). Everything is written in the
run's own folder; a cancel of the whole run (Ctrl-C) removes that folder and adds nothing.
"""
from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..cancel import CancelToken, PauseControl
from ..errors import GenerationCancelled, H3BridgeError
from ..geometry import FPS, SAMPLE_RATE
from ..history.calibration import CalibrationEntry, planned_loop_and_other
from ..engines.child import NOTHING, Deadline, Nothing, wait_until
from ..progress import DENOISE_LOOP_PHASES, PAUSED_PHASE, ProgressEvent
from ..request import GenerationRequest
from ..result import GenerationResult
from ..upstream_costs import expected_phases
from ..vocabulary import EngineKind
from .facts import Found
from .measure import MemorySampler, ProgressLog, engine_processes
from .report import Check, Status, compare

PROMPT = "A red fox runs through snow at dawn"      # the selftest's own prompt: nothing of the user's
SMALLEST = dict(width=32, height=32, frames=22, steps=2)     # the smallest request h3 takes
MID = dict(width=640, height=352, frames=22, steps=4)        # a mid canvas (16:9-ish), still quick on a Mac
CANCEL_POINTS = ("silent phase", "denoise", "FFmpeg")
PAUSE_SECONDS = 0.5
PROCESS_GONE_SECONDS = 10.0      # how long a stopped engine may take to exit before it counts as left over
AUDIO_HOP = SAMPLE_RATE // 40    # one audio latent's samples: the audio may round up by up to one


@dataclass
class Plan:
    """What the run will do, decided before it starts (and stated, with its budget)."""

    engines: list[EngineKind]
    quick: bool
    smallest: GenerationRequest
    mid: GenerationRequest

    def renders(self) -> list[tuple[EngineKind, str, GenerationRequest]]:
        """(engine, what, request) of every render, in order (cancels and the pause render the mid request)."""
        jobs = []
        for kind in self.engines:
            jobs.append((kind, "smallest", self.smallest))
            if self.quick:
                continue
            jobs.append((kind, "mid", self.mid))
            jobs += [(kind, f"cancel in {point}", self.mid) for point in CANCEL_POINTS]
            jobs.append((kind, "pause and resume", self.mid))
        return jobs

    def budget_seconds(self) -> float:
        """The run's time by the cost model (upstream_costs: seconds on the reference M-series Mac,
        an M1 Ultra with 64 GB), every render counted whole with its loads: an upper bound there."""
        total = 0.0
        for _, _, request in self.renders():
            loop, other = planned_loop_and_other(expected_phases(request, writes_mp4=True))
            total += loop + other
        return total


def make_plan(kinds: list[EngineKind], *, quick: bool, mid: dict[str, int] | None = None) -> Plan:
    return Plan(engines=kinds[:1] if quick else kinds, quick=quick,
                smallest=GenerationRequest(PROMPT, **SMALLEST).validate(),
                mid=GenerationRequest(PROMPT, **(mid or MID)).validate())


@dataclass
class Rendered:
    """One finished render and what was measured around it."""

    kind: EngineKind
    what: str
    request: GenerationRequest
    result: GenerationResult
    log: ProgressLog
    sampler: MemorySampler | None
    wall: float

    def loop_and_other(self) -> tuple[float, float]:
        timings = {phase: seconds for phase, seconds in self.result.timings.items() if phase != "total"}
        loop = sum(timings.get(phase, 0.0) for phase in DENOISE_LOOP_PHASES)
        return loop, sum(seconds for phase, seconds in timings.items() if phase not in DENOISE_LOOP_PHASES)

    def calibration_entry(self, run: str, engine_path: str | None) -> CalibrationEntry:
        request = self.request
        planned_loop, planned_other = planned_loop_and_other(expected_phases(request, writes_mp4=True))
        loop, other = self.loop_and_other()
        return CalibrationEntry(engine=self.kind.value, width=request.render_width or request.width,
                                height=request.render_height or request.height, frame_count=request.frame_count,
                                steps=request.steps, layers=request.layers, seconds_per_step=loop / request.steps,
                                planned_seconds_per_step=planned_loop / request.steps, other_seconds=other,
                                planned_other_seconds=planned_other, run=run, engine_path=engine_path)


@dataclass
class Context:
    """What every step of one run shares."""

    found: Found
    folder: Path                  # the run's own folder (report, renders)
    cancel: CancelToken           # the whole run's (Ctrl-C)
    remote_url: str | None = None
    stall_timeout: float | None = 600.0
    inventory: Any = None         # the model's inventory, for the memory plan
    rendered: list[Rendered] = field(default_factory=list)
    _count: int = 0

    @property
    def renders(self) -> Path:
        return self.folder / "renders"

    def output(self, kind: EngineKind, what: str) -> Path:
        self._count += 1
        return self.renders / f"{self._count:02d}-{kind.value}-{what.replace(' ', '-')}.mp4"

    def job_token(self) -> CancelToken:
        """A token for one job that the whole run's cancel (Ctrl-C) also sets."""
        return CancelToken(check=lambda: self.cancel.cancelled)

    def stop_if_cancelled(self) -> None:
        if self.cancel.cancelled:
            raise GenerationCancelled("selftest cancelled")

    def open(self, kind: EngineKind) -> Any:
        from ..engines.factory import open_engine
        if kind is EngineKind.REMOTE:
            return open_engine(kind, remote_url=self.remote_url)
        return open_engine(kind, engine_path=self.found.engine, model_dir=self.found.model,
                           library_path=self.found.library, stall_timeout=self.stall_timeout, fallback=False)


# ----------------------------------------------------------------------------- renders

def render(context: Context, engine: Any, kind: EngineKind, what: str, request: GenerationRequest) -> list[Check]:
    """One render with every check of it; the Rendered kept in the context for the calibration."""
    context.stop_if_cancelled()
    output = context.output(kind, what)
    log = ProgressLog()
    local = kind is not EngineKind.REMOTE
    sampler = MemorySampler() if local else None
    started = time.monotonic()
    label = f"{kind.value} {what}"
    try:
        with sampler if sampler is not None else nullcontext():
            result = engine.generate(request, output, want_frames=True, want_audio=True, on_progress=log.on_progress,
                                     on_preview=log.on_preview, cancel=context.job_token())
    except GenerationCancelled:
        raise
    except H3BridgeError as error:
        return [Check(f"{label} render", Status.FAIL, f"{error.message} (fix: {error.hint})"
                      + (f"; h3 said: {error.engine_message}" if getattr(error, "engine_message", None) else ""))]
    wall = time.monotonic() - started
    rendered = Rendered(kind, what, request, result, log, sampler, wall)
    context.rendered.append(rendered)
    return [output_check(label, rendered, output), preview_check(label, rendered, engine),
            memory_check(label, rendered, context, warm=kind is not EngineKind.ONE_SHOT), time_check(label, rendered)]


def output_check(label: str, rendered: Rendered, output: Path) -> Check:
    """Frames and audio read back: their count, size and length."""
    request, result = rendered.request, rendered.result
    problems = []
    frames, audio = result.frames, result.audio
    want_shape = (request.frame_count, request.height, request.width, 3)
    if frames is None or tuple(frames.shape) != want_shape:
        problems.append(f"frames {None if frames is None else tuple(frames.shape)}, expected {want_shape}")
    clip = request.frame_count / FPS
    samples = None if audio is None else int(audio.shape[-1])
    if samples is None or abs(samples - clip * SAMPLE_RATE) > AUDIO_HOP:
        problems.append(f"audio {samples} samples, expected {clip * SAMPLE_RATE:.0f} (+-{AUDIO_HOP})")
    if not output.is_file() or output.stat().st_size == 0:
        problems.append("no MP4 written")
    figures = {"frames": None if frames is None else list(frames.shape), "audio_samples": samples,
               "mp4_bytes": output.stat().st_size if output.is_file() else None, "wall_seconds": rendered.wall}
    if problems:
        return Check(f"{label} render", Status.FAIL, "; ".join(problems), figures=figures)
    return Check(f"{label} render", Status.PASS,
                 f"{request.width}x{request.height}, {request.frame_count} frames, {samples / SAMPLE_RATE:.2f} s of "
                 f"audio read back; {rendered.wall:.1f} s", figures=figures)


def preview_check(label: str, rendered: Rendered, engine: Any) -> Check:
    name = f"{label} previews"
    if not engine.capabilities.previews:
        return Check(name, Status.SKIPPED, "this engine gives no denoise previews")
    steps = rendered.request.steps
    counts = [rendered.log.previews.get(step, 0) for step in range(steps)]
    figures = {"per_step": counts}
    if all(count >= 1 for count in counts):
        return Check(name, Status.PASS, f"a preview after each of the {steps} steps ({sum(counts)} in all)",
                     figures=figures)
    return Check(name, Status.FAIL, f"previews per step {counts}: a step without one", figures=figures)


def planned_peak(context: Context, request: GenerationRequest, *, warm: bool) -> int | None:
    from ..model.memory import plan_memory
    try:
        return plan_memory(request, context.inventory, session=warm).peak
    except H3BridgeError:
        return None


def memory_check(label: str, rendered: Rendered, context: Context, *, warm: bool) -> Check:
    name = f"{label} memory"
    sampler = rendered.sampler
    if sampler is None:
        return Check(name, Status.SKIPPED, "the remote engine's memory is the server's (its own selftest measures it)")
    planned = planned_peak(context, rendered.request, warm=warm)
    if planned is None or sampler.samples == 0:
        return Check(name, Status.SKIPPED, "no plan or no sample to compare")
    measured = {"peak": float(sampler.peak)}
    check = compare(name, measured, {"peak": float(planned)}, unit="bytes")
    check.figures.update({"peak_rss": sampler.peak_rss, "peak_phys_footprint": sampler.peak_footprint,
                          "samples": sampler.samples})
    source = "physical footprint" if sampler.peak_footprint else "resident size (no physical footprint on this OS)"
    check.detail = (f"measured {sampler.peak / 2**30:.2f} GiB ({source}), planned {planned / 2**30:.2f} GiB; "
                    + check.detail)
    if check.status is Status.SLOWER:       # memory over the plan is a finding of its own
        check.status = Status.FAIL if sampler.peak > planned * 1.5 else Status.SLOWER
    return check


def time_check(label: str, rendered: Rendered) -> Check:
    """The cost model's phase seconds beside the measured ones (the denoise loop under one name)."""
    planned_phases = expected_phases(rendered.request, writes_mp4=True)
    planned_loop, _ = planned_loop_and_other(planned_phases)
    planned = {phase: seconds for phase, seconds in planned_phases.items() if phase not in DENOISE_LOOP_PHASES}
    planned["denoise loop"] = planned_loop
    measured = {phase: seconds for phase, seconds in rendered.result.timings.items()
                if phase not in DENOISE_LOOP_PHASES and phase != "total" and phase in planned}
    loop, other = rendered.loop_and_other()
    measured["denoise loop"] = loop
    measured["total"] = loop + other
    planned["total"] = sum(planned.values())
    check = compare(f"{label} time", measured, planned)
    steps = rendered.request.steps
    check.detail = (f"{loop / steps:.3g} s per denoise step (planned {planned_loop / steps:.3g}); "
                    f"{measured['total']:.1f} s in phases (planned {planned['total']:.1f}); " + check.detail)
    return check


# ----------------------------------------------------------------------------- cancels and pause

@dataclass
class Leftovers:
    """What exists before a job, to tell what the job left."""

    temp: set[str]
    session_dirs: set[str]

    @classmethod
    def now(cls) -> "Leftovers":
        from ..engines.scratch import own_session_dirs
        return cls(temp=set(_own_temp()), session_dirs=own_session_dirs())

    def left(self, folder: Path, keep: set[Path], *, session: bool) -> list[str]:
        """What is there now and was not before: processes this one started, h3bridge's temporary
        folders of this process, (`session`: interactive h3's /tmp/h3-XXXXXX folders, which only
        a session makes; another program's session could make one meanwhile, so they are only
        looked for then), files in `folder` other than `keep`."""
        from ..engines.scratch import own_session_dirs
        found = []
        processes = engine_processes()
        if processes:
            import psutil
            _, alive = psutil.wait_procs(processes, timeout=PROCESS_GONE_SECONDS)
            found += [f"process {process.pid} ({_name(process)})" for process in alive]
        found += [f"temporary folder {path}" for path in sorted(set(_own_temp()) - self.temp)]
        if session:
            # another program's session may be making its own meanwhile: one that goes away within
            # the wait was not left behind by this job
            def none_new(timeout: float) -> "set[str] | Nothing":
                if not own_session_dirs() - self.session_dirs:
                    return set()
                time.sleep(timeout)         # nothing to wait on but the folder listing
                return NOTHING
            appeared = wait_until(none_new, deadline=Deadline(PROCESS_GONE_SECONDS),
                                  on_expired=lambda: own_session_dirs() - self.session_dirs)
            found += [f"session folder {path}" for path in sorted(appeared)]
        if folder.exists():
            found += [f"partial file {path.name}" for path in sorted(folder.rglob("*"))
                      if path.is_file() and path not in keep]
        return found


def _own_temp() -> list[str]:
    """h3bridge's scratch in the temporary folder made by this process (engines/scratch.py names)."""
    from ..engines.scratch import WORKDIR_PREFIX
    root = tempfile.gettempdir()
    prefix = f"{WORKDIR_PREFIX}{os.getpid()}-"
    try:
        return [os.path.join(root, name) for name in os.listdir(root) if name.startswith(prefix)]
    except OSError:
        return []


def _name(process: Any) -> str:
    try:
        return process.name()
    except Exception:  # noqa: BLE001 - gone while named
        return "exited"


def _cancel_at(point: str) -> Callable[[ProgressEvent], bool]:
    """When to cancel: the tiled decode after "video VAE load" n/n (a phase that reports
    nothing), the first denoise step done, FFmpeg's first record."""
    if point == "silent phase":
        return lambda event: event.phase == "video VAE load" and event.total > 0 and event.done >= event.total
    if point == "denoise":
        return lambda event: event.phase in DENOISE_LOOP_PHASES and event.done >= 1
    return lambda event: event.phase == "FFmpeg"


def cancel_check(context: Context, kind: EngineKind, point: str, request: GenerationRequest) -> Check:
    name = f"{kind.value} cancel in {point}"
    context.stop_if_cancelled()
    keep = {path for path in context.renders.rglob("*") if path.is_file()} if context.renders.exists() else set()
    before = Leftovers.now()
    output = context.output(kind, f"cancel {point}")
    token = context.job_token()
    should_cancel = _cancel_at(point)
    cancelled_at: list[float] = []
    where: list[str] = []

    def on_progress(event: ProgressEvent) -> None:
        if not cancelled_at and should_cancel(event):
            cancelled_at.append(time.monotonic())
            where.append(f"{event.phase} {event.done}/{event.total}")
            token.cancel()

    engine = context.open(kind)
    try:
        engine.generate(request, output, want_frames=False, want_audio=False, on_progress=on_progress, cancel=token)
        outcome = "finished"
    except GenerationCancelled:
        if context.cancel.cancelled:     # the whole run's Ctrl-C, not this check's cancel
            raise
        outcome = "cancelled"
    except H3BridgeError as error:
        outcome = f"failed: {error.message}"
    finally:
        stopped = time.monotonic()
        engine.close()
    left = before.left(context.renders, keep, session=kind is EngineKind.SESSION) if kind is not EngineKind.REMOTE else \
        [f"partial file {path.name}" for path in sorted(context.renders.rglob("*")) if path.is_file() and path not in keep]
    if not cancelled_at:
        return Check(name, Status.SKIPPED, f"the engine never reported that point ({outcome} without it)")
    seconds = stopped - cancelled_at[0]
    figures = {"at": where[0], "seconds_to_stop": seconds, "leftovers": left}
    if outcome != "cancelled":
        return Check(name, Status.FAIL, f"cancelled at {where[0]}, yet the job {outcome} ({seconds:.2f} s later)",
                     figures=figures)
    if left:
        return Check(name, Status.FAIL, f"stopped {seconds:.2f} s after the cancel at {where[0]}, but left "
                     + ", ".join(left), figures=figures)
    return Check(name, Status.PASS, f"stopped {seconds:.2f} s after the cancel at {where[0]}; nothing left "
                 "(processes, temporary folders, partial files)", figures=figures)


def takes_pause(engine: Any) -> bool:
    """The capability test: the engine's `generate` has a `pause` parameter (issue 34's job skeleton)."""
    try:
        return "pause" in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False


def pause_check(context: Context, kind: EngineKind, request: GenerationRequest) -> Check:
    """Pause once after the first denoise step, hold it PAUSE_SECONDS, resume: the engine's
    processes stopped while paused (a local engine), the clip finished whole, nothing left over."""
    name = f"{kind.value} pause and resume"
    context.stop_if_cancelled()
    keep = {path for path in context.renders.rglob("*") if path.is_file()} if context.renders.exists() else set()
    before = Leftovers.now() if kind is not EngineKind.REMOTE else None
    engine = context.open(kind)
    try:
        if not takes_pause(engine):
            return Check(name, Status.SKIPPED, "engine has no pause (its generate takes no `pause`)")
        pause = PauseControl()
        reached = threading.Event()
        heard_paused = threading.Event()
        stopped_states: list[bool] = []
        reported: list[bool] = []       # a local engine says it paused (a PAUSED_PHASE event)

        def on_progress(event: ProgressEvent) -> None:
            if event.phase == PAUSED_PHASE:
                heard_paused.set()
            elif event.phase in DENOISE_LOOP_PHASES and event.done >= 1 and not reached.is_set():
                pause.pause()       # here, on the job's thread: the engine cannot finish before it
                reached.set()

        def pause_once() -> None:
            reached.wait()          # set by the first denoise step, or when the job ends without one
            if not pause.paused:
                return
            try:
                if kind is not EngineKind.REMOTE:
                    stopped_states.append(_wait_all_stopped(context.cancel))
                    reported.append(_wait_for(heard_paused, context.cancel))
                context.cancel.wait(PAUSE_SECONDS)       # held for a while (a Ctrl-C ends it at once)
            finally:
                pause.resume()

        helper = threading.Thread(target=pause_once, name="h3bridge-selftest-pause", daemon=True)
        helper.start()
        output = context.output(kind, "pause")
        try:
            result = engine.generate(request, output, want_frames=False, want_audio=False, on_progress=on_progress,
                                     cancel=context.job_token(), pause=pause)
        except GenerationCancelled:
            raise
        except H3BridgeError as error:
            return Check(name, Status.FAIL, f"{error.message} (fix: {error.hint})")
        finally:
            reached.set()
            helper.join()
    finally:
        engine.close()
    keep.add(output)
    left = before.left(context.renders, keep, session=kind is EngineKind.SESSION) if before is not None else \
        [f"partial file {path.name}" for path in sorted(context.renders.rglob("*")) if path.is_file() and path not in keep]
    paused = pause.paused_seconds()
    figures = {"paused_seconds": paused, "engine_stopped_while_paused": stopped_states[0] if stopped_states else None,
               "paused_reported": heard_paused.is_set(), "frame_count": result.frame_count, "leftovers": left}
    problems = []
    if paused == 0:
        problems.append("the engine never reached a denoise step to pause in")
    if stopped_states and not stopped_states[0]:
        problems.append("paused, yet the engine's processes kept running")
    if reported and not reported[0]:
        problems.append(f"paused, yet the engine sent no `{PAUSED_PHASE}` progress event")
    if result.frame_count != request.frame_count or not output.is_file() or output.stat().st_size == 0:
        problems.append(f"the clip did not finish whole ({result.frame_count} of {request.frame_count} frames"
                        f"{'' if output.is_file() else ', no MP4'})")
    if left:
        problems.append("left " + ", ".join(left))
    if problems:
        return Check(name, Status.FAIL, "; ".join(problems), figures=figures)
    stopped = " with the engine's processes stopped" if stopped_states else ""
    return Check(name, Status.PASS, f"paused {paused:.1f} s in denoise{stopped} and resumed; the clip finished "
                 "whole; nothing left (processes, temporary folders, partial files)", figures=figures)


def _all_stopped() -> bool:
    from ..engines.groups import all_stopped
    return all_stopped(engine_processes())


def _wait_for(event: threading.Event, cancel: CancelToken) -> bool:
    """Whether `event` is set within PROCESS_GONE_SECONDS (False at once on the run's cancel)."""
    def poll(timeout: float) -> "bool | Nothing":
        if event.wait(timeout):
            return True
        return False if cancel.cancelled else NOTHING
    return wait_until(poll, deadline=Deadline(PROCESS_GONE_SECONDS), on_expired=lambda: False)


def _wait_all_stopped(cancel: CancelToken) -> bool:
    """Whether every process of the engine shows as stopped within PROCESS_GONE_SECONDS (the stop
    signal is sent before `pause()` returns; the system shows it a moment later)."""
    def poll(timeout: float) -> "bool | Nothing":
        if _all_stopped():
            return True
        return False if cancel.wait(timeout) else NOTHING
    return wait_until(poll, deadline=Deadline(PROCESS_GONE_SECONDS), on_expired=lambda: False)


# ----------------------------------------------------------------------------- one engine

def engine_checks(context: Context, kind: EngineKind, plan: Plan) -> Iterator[Check]:
    """Every check of one engine, as it finishes."""
    engine = context.open(kind)
    try:
        yield from render(context, engine, kind, "smallest", plan.smallest)
        if not plan.quick:
            yield from render(context, engine, kind, "mid", plan.mid)
    finally:
        engine.close()
    if plan.quick:
        return
    for point in CANCEL_POINTS:
        yield cancel_check(context, kind, point, plan.mid)
    yield pause_check(context, kind, plan.mid)


def remove_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


__all__ = ["CANCEL_POINTS", "Context", "MID", "PROMPT", "Plan", "Rendered", "SMALLEST", "cancel_check",
           "engine_checks", "make_plan", "pause_check", "render", "takes_pause"]
