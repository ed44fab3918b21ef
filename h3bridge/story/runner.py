"""Rendering a storyboard shot by shot on any Engine, resuming from the job directory.

    plan -> for each shot: reuse it (recorded, key unchanged, files intact) or render it
         -> record it in the manifest -> assemble the film

A shot renders on `engine` (by default the warm session, so the model stays loaded from shot to
shot); a session hands what it cannot take to one-shot (engines/fallback.py). The manifest is saved after
every shot, so a crash, a kill or Ctrl-C costs at most the shots that were running.

With `parallel=N` (a remote engine only: a server, or a proxy in front of several) the story
is cut into chains, each a `cut` shot and the `anchor`/`tail` shots that continue from it, and
up to N chains render at once, each in its own thread: a shot after a cut starts at once, a
continuing shot waits for the shot it continues (it is next in its chain). Every shot renders
exactly the request it would render in a serial run, so the film is the same.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..cancel import CancelToken, PauseControl
from ..engines.fallback import choose_engine
from ..engines.protocol import Engine
from ..errors import GenerationCancelled, OutputExistsError, RemoteError, RequestError
from ..geometry import FPS, SAMPLE_RATE
from ..media.decode import remove_quietly
from ..progress import ProgressEvent
from ..request import GenerationRequest, request_fields
from .assemble import FilmPiece, FilmResult, assemble_film, chapter_title, crossfade_samples, sample_at
from ..fixes import Blank, Fix, changes, given, joined
from ..safeio.outputs import ALLOW_OVERWRITE, check_output
from .jobdir import FilmRecord, JobDir, Manifest, RemoteJobRecord, ShotRecord, file_sha256
from .plan import PlannedShot, StoryPlan, check_picks, continued_request, plan_story
from .storyboard import Continuation, Storyboard
from .sheet import write_story_sheet
from ..vocabulary import EngineKind

JOB_DIR_SUFFIX = ".h3story"
# Shots rendered at once at most (`parallel`): each holds a server job, a thread and an open download.
MAX_PARALLEL = 16


def default_job_dir(output: Path) -> Path:
    """Beside the film: FILM.mp4 -> FILM.h3story/."""
    return output.with_name(output.stem + JOB_DIR_SUFFIX)


@dataclass(frozen=True)
class ShotInFlight:
    """A shot being rendered now (with `parallel`, several are): its phase and its own fraction."""

    shot: int
    phase: str
    fraction: float


@dataclass(frozen=True)
class StoryProgress:
    """Where a story is: shot `shot` of `shots` (the one this report is about), the engine's
    phase, overall fraction and ETA, and every shot being rendered at this moment."""

    shot: int
    shots: int
    phase: str                   # the engine's phase, or "reused", "assembling"
    shot_fraction: float
    fraction: float              # of the work this run does (shots to render, then the assembly)
    elapsed: float
    eta: float | None            # seconds left, from the shots so far (None until it can be told)
    event: ProgressEvent | None = None
    in_flight: tuple[ShotInFlight, ...] = ()     # the shots rendering now, in shot order


StoryProgressCallback = Callable[[StoryProgress], None]


@dataclass
class TakeOutcome:
    """One take of a shot with takes: its number, seed and MP4 in the job folder."""

    take: int
    seed: int
    video_path: Path
    reused: bool


@dataclass
class ShotOutcome:
    index: int
    video_path: Path                  # the take the film uses (the pick)
    seed: int
    frame_count: int
    reused: bool                      # every take of the shot was kept from the job folder
    wall_seconds: float
    redo_reason: str | None = None    # why a recorded shot was rendered again
    pick: int = 1                     # the take the film uses
    takes: list[TakeOutcome] = field(default_factory=list)    # every take (one for a shot without takes)

    @property
    def rendered_takes(self) -> int:
        return sum(not take.reused for take in self.takes)


@dataclass
class StoryResult:
    output: Path | None               # the film (None with `only` short of the last shot)
    job_dir: Path
    shots: list[ShotOutcome]
    film_frames: int
    film_samples: int
    chapters: list[tuple[int, int, str]] = field(default_factory=list)
    assembled: bool = False           # False: the film on disk was already up to date
    wall_seconds: float = 0.0
    pieces: list[FilmPiece] = field(default_factory=list)   # the shots as the film uses them (assemble.film_arrays)
    stopped_after_shot: int | None = None    # stop_after_shot: the shot it stopped after (no film yet)
    contact_sheet: Path | None = None         # with takes: JOB/takes.png (story/sheet.py), picks marked

    @property
    def rendered(self) -> int:
        return sum(not shot.reused for shot in self.shots)

    @property
    def rendered_takes(self) -> int:
        """Takes rendered by this run (each a denoise), over every shot."""
        return sum(shot.rendered_takes for shot in self.shots)

    def summary(self) -> dict[str, object]:
        return {"output": None if self.output is None else str(self.output), "job_dir": str(self.job_dir),
                "film_frames": self.film_frames, "film_seconds": self.film_frames / FPS,
                "film_samples": self.film_samples, "assembled": self.assembled,
                "rendered": self.rendered, "reused": len(self.shots) - self.rendered,
                "rendered_takes": self.rendered_takes, "wall_seconds": self.wall_seconds,
                "stopped_after_shot": self.stopped_after_shot,
                "contact_sheet": None if self.contact_sheet is None else str(self.contact_sheet),
                "chapters": [{"start_frame": a, "end_frame": b, "title": t} for a, b, t in self.chapters],
                "shots": [{**asdict(shot), "video_path": str(shot.video_path),
                           "takes": [{**asdict(take), "video_path": str(take.video_path)} for take in shot.takes]}
                          for shot in self.shots]}


def run_story(storyboard: Storyboard, output: str | os.PathLike[str] | None, *, engine: Engine | None = None,
              fallback: Engine | None = None, job_dir: str | os.PathLike[str] | None = None,
              redo: int | None = None, redo_seed: int | None = None, only: int | None = None,
              overwrite: bool = False, force: bool = False, storyboard_path: str | None = None,
              on_progress: StoryProgressCallback | None = None, on_notice: "Callable[[str | Fix], None] | None" = None,
              cancel: CancelToken | None = None, parallel: int = 1,
              picks: Mapping[int, int] | None = None, stop_after_shot: threading.Event | None = None,
              pause: PauseControl | None = None) -> StoryResult:
    """Render `storyboard` into `output` (an MP4), resuming what its job directory holds.

    engine: any Engine; None means the warm session for $H3_BIN / $H3_MODEL_DIR (shared_session),
      with a one-shot fallback for shots it cannot take. The storyboard's `background = true` puts a
      local engine at background priority (engines/priority.py; a warm one stays so until it restarts).
    redo: re-roll shot `redo` (with `redo_seed`, else a new random seed) and whatever continues from it.
    only: render shots 1..only and stop (no film unless that is every shot).
    overwrite: replace an `output` this job did not write (the film it wrote itself is replaced
      when the story changed).
    on_notice: one-line messages for the user (a shot reused, a damaged file redone, ...); one that
    names settings is a Fix (h3bridge.fixes), for the host to say in its words.
    parallel: render up to this many independent shots at once (1 to MAX_PARALLEL); more than 1
      needs a remote engine (one local engine renders one clip at a time). A failing shot stops
      the others (their server jobs are cancelled); finished shots are kept for the next run.
    on_progress and on_notice are called from the rendering threads with `parallel` > 1, one at a time.
    picks: shot -> the take the film uses, for shots with `takes` (kept in the job folder for later
      runs; default the first take). Every take is kept; picking another renders nothing, except a
      shot that continues from the re-picked one (its start frame changed).
    stop_after_shot: once set (before the start, or from any thread while a shot renders), the story
      stops after the shot it is rendering (every shot in flight, with `parallel`): that shot is
      finished and kept, nothing else starts, and no film is made; running it again resumes from
      there. Unlike pausing, this frees the engine's memory.
    pause: pausing it stops the engine where it is (every shot in flight); resume goes on.
    Everything the plan can refuse is refused before the first shot starts.
    """
    started = time.monotonic()
    check_parallel(parallel, engine)
    notice = on_notice or (lambda text: None)
    if engine is None:      # the warm session for $H3_BIN / $H3_MODEL_DIR, falling back to one-shot
        from ..engines.factory import open_engine
        engine = open_engine(EngineKind.SESSION, shared=True, background=storyboard.background)
    elif fallback is not None:
        from ..engines.fallback import FallbackEngine
        engine = FallbackEngine(engine, lambda: fallback)
    output_path = Path(output) if output is not None else None
    if output_path is None and job_dir is None:
        raise RequestError("a story needs an output file or a job directory", field="output",
                           hint="give the film's path (-o FILM.mp4), or a job directory")
    folder = Path(job_dir) if job_dir is not None else default_job_dir(output_path)  # type: ignore[arg-type]
    count = len(storyboard.shots)
    for name, value in (("redo", redo), ("only", only)):
        if value is not None and not (isinstance(value, int) and 1 <= value <= count):
            raise RequestError(Fix(f"{{}}: the story has shots 1 to {count}", (given(name, repr(value)),)), field=name,
                               hint=f"give a shot number from 1 to {count}")
    if redo_seed is not None and redo is None:
        raise RequestError("redo_seed is only for a shot being re-rolled", field="redo_seed",
                           hint=Fix("give the shot too ({})", (changes(redo=Blank("N")),)))
    if storyboard.background:        # the story's engine at background priority (engines/priority.py)
        if engine.capabilities.remote:
            from ..runnable import h3bridge_command
            notice("background = true: a remote engine renders at its server's priority; the story renders "
                   f"there as the server runs (`{h3bridge_command('serve', '--background')}` there lowers it)")
        else:
            engine.background = True
    model_dir = getattr(engine, "model_dir", None)
    last = only if only is not None else count
    new_seed = (redo_seed if redo_seed is not None else secrets.randbits(32)) if redo is not None else None

    check_picks(storyboard, picks)       # the picks asked for now: refused before anything, in any case

    def plan_for(manifest: Manifest) -> tuple[StoryPlan, dict[int, int]]:
        overrides = dict(manifest.seed_overrides)
        if redo is not None:
            overrides[redo] = new_seed      # type: ignore[assignment]
        chosen = _kept_picks(storyboard, manifest.picks, notice)
        chosen.update(picks or {})
        plan = plan_story(storyboard, model_dir, seed_overrides=overrides, force=force,
                          session=engine.capabilities.warm_model, picks=chosen)
        if output_path is not None and last == count:
            _check_output(output_path, manifest, overwrite)
        return plan, overrides

    # A new job: everything is checked before its folder exists, so a refused storyboard leaves
    # no empty FILM.h3story/ behind.
    planned = plan_for(Manifest()) if not os.path.lexists(folder) else None
    with JobDir(folder) as jobs:
        try:
            manifest = jobs.load()
            if jobs.damaged_manifest is not None:
                notice(f"the job's manifest was unreadable and was kept as {jobs.damaged_manifest.name}; "
                       "its shots are rendered again")
            if planned is None or manifest.seed_overrides or manifest.picks or manifest.film is not None:
                planned = plan_for(manifest)     # (another run may have made the folder meanwhile)
        except BaseException:
            jobs.remove_if_created()
            raise
        plan, overrides = planned
        for warning in plan.model_warnings:
            notice(joined("warning: ", warning))
        manifest.seed_overrides = overrides
        manifest.picks = {shot.index: shot.pick for shot in plan.shots if shot.pick != 1}
        manifest.storyboard = storyboard_path or manifest.storyboard
        runner = _Runner(plan, jobs, manifest, engine, on_progress, notice, cancel, started, last,
                         parallel, stop_after_shot, pause)
        try:
            outcomes = runner.render_shots()
        except BaseException:
            jobs.remove_if_created()     # nothing finished (a full disk, a refusal, a cancel): no empty job folder
            raise
        result = StoryResult(None, folder, outcomes, sum(plan.shot(o.index).request.frame_count
                                                          - plan.shot(o.index).dropped_frames for o in outcomes), 0)
        if len(outcomes) < last:        # stop_after_shot: the rest, and the film, come with the next run
            result.stopped_after_shot = max((o.index for o in outcomes if not o.reused), default=None)
        elif output_path is not None and last == count:
            film = runner.assemble(output_path, overwrite)
            result.output, result.assembled = output_path, film is not None
            record = manifest.film
            assert record is not None
            result.film_frames, result.film_samples = record.frames, record.samples
            result.chapters = film.chapters if film is not None else _chapters_of(plan)
        result.pieces = _pieces(plan, manifest.shots, folder)[:len(outcomes)]
        result.contact_sheet = write_story_sheet(outcomes, folder)
        result.wall_seconds = time.monotonic() - started
        return result


def _kept_picks(storyboard: Storyboard, recorded: Mapping[int, int], notice: Callable[[str], None]) -> dict[int, int]:
    """The picks an earlier run recorded that the storyboard still has (a shot given fewer takes
    since goes back to its first take, said once)."""
    kept = {}
    for shot, take in recorded.items():
        if 1 <= shot <= len(storyboard.shots) and 1 <= take <= storyboard.takes_for(shot):
            kept[shot] = take
        elif 1 <= shot <= len(storyboard.shots):
            notice(f"shot {shot} has no take {take} any more; the film uses its take 1")
    return kept


def check_parallel(parallel: object, engine: Engine | None) -> None:
    """`parallel` is a whole number from 1 to MAX_PARALLEL, and above 1 only on a remote engine."""
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= MAX_PARALLEL:
        raise RequestError(f"parallel={parallel!r}: shots rendered at once must be a whole number from 1 to "
                           f"{MAX_PARALLEL}", field="parallel",
                           hint=f"give parallel a number from 1 to {MAX_PARALLEL} (1 renders shot after shot)")
    if parallel > 1 and (engine is None or not engine.capabilities.remote):
        raise RequestError(f"parallel={parallel} needs a remote engine: one local engine renders one clip at a "
                           "time, so shots cannot render at once on it", field="parallel",
                           hint="give engine=RemoteEngine(URL) (a server, or a proxy in front of several), "
                                "or parallel=1")


def story_chains(shots: list[PlannedShot]) -> list[list[PlannedShot]]:
    """The shots cut into chains that can render independently: each starts at a `cut` shot (or
    the first shot) and holds the `anchor`/`tail` shots that continue from it, in order."""
    chains: list[list[PlannedShot]] = []
    for shot in shots:
        if shot.continues and chains:
            chains[-1].append(shot)
        else:
            chains.append([shot])
    return chains


def _chapters_of(plan: StoryPlan) -> list[tuple[int, int, str]]:
    from .assemble import film_chapters
    return film_chapters(_pieces(plan, {}))


def _check_output(output: Path, manifest: Manifest, overwrite: bool) -> None:
    """Before anything renders: an existing film is replaced only if this job wrote it (and it is
    unchanged since), or with `overwrite`; never a folder, device node, FIFO or link, whatever
    `overwrite` says, and only in a folder that takes new files (safeio.outputs)."""
    check_output(output, overwrite=True, field="output", label="the output",
                 allow_overwrite=ALLOW_OVERWRITE)
    if overwrite or not os.path.lexists(output):
        return
    record = manifest.film
    if record is not None and _holds(output, record.sha256):    # the film this job wrote, unchanged since
        return
    raise OutputExistsError(f"{output} already exists and was not written by this story's job",
                            hint=Fix("choose another output, or pass {} to replace it", (changes(overwrite=True),)))


def _holds(path: Path, sha256: str) -> bool:
    """Whether `path` is a regular file with this SHA-256 (a FIFO or a device is never read)."""
    try:
        return file_sha256(path) == sha256
    except OSError:
        return False


def _pieces(plan: StoryPlan, records: dict[int, ShotRecord], job_path: Path | None = None) -> list[FilmPiece]:
    story = plan.storyboard
    pieces = []
    for shot in plan.shots:
        fade = 0 if shot.index == 1 or (shot.continuation is Continuation.CUT and not story.crossfade_cuts) \
            else crossfade_samples(story.crossfade_frames)
        record = records.get(shot.index)
        video = (job_path / record.video) if record is not None and job_path is not None else Path()
        pieces.append(FilmPiece(shot.index, video, shot.request.frame_count, shot.dropped_frames, fade,
                                chapter_title(shot.index, shot.request.prompt)))
    return pieces


def _digest(array: np.ndarray | None) -> str:
    return "" if array is None else hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


class _Runner:
    def __init__(self, plan: StoryPlan, jobs: JobDir, manifest: Manifest, engine: Engine,
                 on_progress: StoryProgressCallback | None,
                 notice: Callable[[str], None], cancel: CancelToken | None, started: float, last: int,
                 parallel: int = 1, stop_after_shot: threading.Event | None = None,
                 pause: PauseControl | None = None) -> None:
        self.plan, self.jobs, self.manifest = plan, jobs, manifest
        self.engine = engine
        self.on_progress, self._notice, self.cancel = on_progress, notice, cancel
        self.started, self.last, self.parallel = started, last, parallel
        self.stop_after_shot, self.pause = stop_after_shot or threading.Event(), pause
        self.rendered_any = threading.Event()      # a shot was rendered (not kept) by this run
        self.weights = {shot.index: shot.request.frame_count * shot.request.steps for shot in plan.shots}
        self.to_render: list[int] = []
        self.takes_to_render: dict[int, int] = {}        # per shot in to_render: its takes to render
        self.done_weight = 0.0
        self.render_seconds = 0.0
        # With parallel shots: the manifest (and its file) change under `_manifest_lock`, the
        # progress bookkeeping and the caller's callbacks under `_report_lock`.
        self._manifest_lock = threading.RLock()
        self._report_lock = threading.RLock()
        self.in_flight: dict[int, ShotInFlight] = {}
        # Set once this run has had work done (a server accepted a shot's job, an engine reported
        # progress, a shot finished): from then on a server that cannot be reached is a failure of
        # the story (CLI exit 1), not a refusal before anything ran (exit 2), whichever step met it.
        self.work_began = threading.Event()

    def notice(self, text: "str | Fix") -> None:
        with self._report_lock:
            self._notice(text)

    def _record(self, record: ShotRecord, *, in_film: bool = True) -> None:
        """Keep `record` among its shot's takes (and, `in_film`, make it the one the film uses), and
        save the manifest (atomically): from here on it is finished."""
        with self._manifest_lock:
            self.manifest.use(record, in_film=in_film)
            pending = self.manifest.remote_jobs.get(record.index)
            if pending is not None and pending.key == record.key:     # its server job is done with
                del self.manifest.remote_jobs[record.index]
            self.jobs.save(self.manifest)

    def _adoption(self, shot: PlannedShot, engine: Engine) -> dict[str, object]:
        """For a shot rendered on a server: the `adoption` option that writes its job's id down the
        moment the server accepts it, and follows the job an earlier (killed) run submitted for this
        very shot instead of paying for it twice. Nothing for a local engine."""
        if not engine.capabilities.remote:
            return {}
        from ..engines.remote import JobAdoption, RemoteEngine
        if not isinstance(engine, RemoteEngine):
            return {}
        url = engine.base_url
        with self._manifest_lock:
            pending = self.manifest.remote_jobs.get(shot.index)
            story_id = self.manifest.story_id
        # (asked of this URL even when it was submitted to another, e.g. a server restarted on a new
        # port: a server that does not have the job answers 404, and the shot is submitted anew)
        earlier = pending.job_id if pending is not None and pending.key == shot.key else None
        if earlier is not None:
            self.notice(f"shot {shot.index}: following job {earlier}, submitted by an earlier run")

        def submitted(job_id: str) -> None:
            self.work_began.set()
            with self._manifest_lock:
                self.manifest.remote_jobs[shot.index] = RemoteJobRecord(shot.key, job_id, url)
                self.jobs.save(self.manifest)

        return {"adoption": JobAdoption(key=f"h3story-{story_id}-shot{shot.index}-{shot.key}", job_id=earlier,
                                        on_submitted=submitted)}

    # ------------------------------------------------------------------ shots

    def _reusable(self, shot: PlannedShot, shots: dict[int, ShotRecord]) -> tuple[ShotRecord | None, str | None]:
        """The take of the shot that can be kept (the one in use, or an earlier take made for the
        shot as it is now, e.g. an edit undone), else (None, why not; None for a shot never
        rendered). `shots`: the takes the shots before it use."""
        record = self.manifest.take(shot.index, shot.key)
        if record is None:
            if shot.index in self.manifest.shots and shot.pick == 1:
                if shot.continues:
                    return None, (f"it changed, or shot {shot.index - 1}, which it continues from, did (an edit, a "
                                  "re-roll or another take picked)")
                return None, "it changed, or the shot it continues from did"
            return None, None
        problem = self.jobs.problem_with(record)
        if problem is not None:
            return None, problem
        request = shot.request
        if (record.frame_count, record.width, record.height) != (request.frame_count, request.width, request.height):
            return None, "its recorded size is not the shot's"
        if shot.continues and record.continued_from != self._continued_from(shot, shots):
            return None, f"shot {shot.index - 1}, which it continues from, was rendered again"
        return record, None

    def _continued_from(self, shot: PlannedShot, shots: dict[int, ShotRecord]) -> str:
        previous = shots.get(shot.index - 1)
        if previous is None:
            return ""
        return previous.last_frame_sha256 if shot.continuation is Continuation.ANCHOR else previous.video_sha256

    def render_shots(self) -> list[ShotOutcome]:
        # The work this run expects (for progress and the ETA); a shot found stale later is added.
        expected = dict(self.manifest.shots)
        for shot in self.plan.shots[:self.last]:
            # every take needs the pick of the shot before it; the film's take decides what follows
            missing = [number for number in range(1, shot.takes + 1)
                       if self._reusable(shot.take(number), expected)[0] is None]
            if missing:
                self.to_render.append(shot.index)
                self.takes_to_render[shot.index] = len(missing)
            record = self._reusable(shot, expected)[0]
            if record is None:
                expected.pop(shot.index, None)
            else:
                expected[shot.index] = record
        self.total_weight = sum(self.weights[i] * self.takes_to_render[i] for i in self.to_render) or 1.0
        chains = story_chains(self.plan.shots[:self.last])
        if self.parallel == 1 or len(chains) == 1:
            return self._render_chain(self.plan.shots[:self.last], self.cancel)
        return self._render_chains(chains)

    def _render_chain(self, chain: list[PlannedShot], cancel: CancelToken | None) -> list[ShotOutcome]:
        """The shots one after another, up to the one rendering when `stop_after_shot` is set."""
        outcomes: list[ShotOutcome] = []
        for shot in chain:
            if outcomes and self.stop_after_shot.is_set() and any(not o.reused for o in outcomes):
                break
            outcomes.append(self._take(shot, cancel))
        return outcomes

    def _render_chains(self, chains: list[list[PlannedShot]]) -> list[ShotOutcome]:
        """Up to `parallel` chains at once, each shot after shot in its own thread. The first
        failure stops the other chains (their running shots are cancelled) and is raised once
        every thread has let go; the shots finished by then are in the manifest."""
        stop = CancelToken(check=(lambda: self.cancel.cancelled) if self.cancel is not None else None)
        outcomes: dict[int, ShotOutcome] = {}
        failures: list[BaseException] = []

        def render_chain(chain: list[PlannedShot]) -> None:
            try:
                for shot in chain:
                    if stop.cancelled or (self.stop_after_shot.is_set() and self.rendered_any.is_set()):
                        return
                    outcomes[shot.index] = self._take(shot, stop)
            except BaseException as error:      # noqa: BLE001 - raised below, in the caller's thread
                with self._report_lock:
                    failures.append(error)
                stop.cancel()

        with ThreadPoolExecutor(max_workers=min(self.parallel, len(chains)),
                                thread_name_prefix="h3bridge-story-shot") as pool:
            try:
                for future in [pool.submit(render_chain, chain) for chain in chains]:
                    future.result()
            except BaseException:      # Ctrl-C in this thread: the shots in flight are cancelled, then it is raised
                stop.cancel()
                raise
        if failures:
            # the failure that stopped the story, not the cancels it caused in the other chains
            first = next((error for error in failures if not isinstance(error, GenerationCancelled)), failures[0])
            raise first
        if stop.cancelled:
            raise GenerationCancelled("the story was cancelled; run it again to resume")
        return [outcomes[index] for index in sorted(outcomes)]

    def _take(self, shot: PlannedShot, cancel: CancelToken | None) -> ShotOutcome:
        """Every take of the shot, reused or rendered, in take order; the film's is its pick."""
        if self.parallel > 1 and shot.takes > 1:      # a remote engine: the takes are server jobs at once
            outcomes = self._takes_at_once(shot, cancel)
        else:
            outcomes = [self._one_take(shot.take(number), number == shot.pick, cancel)
                        for number in range(1, shot.takes + 1)]
        picked = outcomes[shot.pick - 1]
        if shot.takes > 1:
            picked.takes = [TakeOutcome(number, outcome.seed, outcome.video_path, outcome.reused)
                            for number, outcome in enumerate(outcomes, 1)]
            picked.reused = all(outcome.reused for outcome in outcomes)
            picked.redo_reason = next((outcome.redo_reason for outcome in outcomes if outcome.redo_reason), None)
            picked.wall_seconds = sum(outcome.wall_seconds for outcome in outcomes if not outcome.reused)
        return picked

    def _takes_at_once(self, shot: PlannedShot, cancel: CancelToken | None) -> list[ShotOutcome]:
        """The shot's takes rendered up to `parallel` at once (each its own server job, as chains
        are), as takes.render_at_once renders a request's: the first failure cancels the others and
        is raised once all have let go; the takes finished by then are recorded."""
        from ..takes import render_at_once
        return render_at_once(lambda index, stop: self._one_take(shot.take(index + 1), index + 1 == shot.pick, stop),
                              shot.takes, self.parallel, cancel, thread_name=f"h3bridge-story-shot{shot.index}-take",
                              cancelled="the story was cancelled; run it again to resume")

    def _one_take(self, shot: PlannedShot, in_film: bool, cancel: CancelToken | None) -> ShotOutcome:
        """Reuse one take of the shot (`shot` is that take: its seed and key), or render it;
        `in_film`: it is the take the film uses (the pick)."""
        if cancel is not None and cancel.cancelled:
            raise GenerationCancelled("the story was cancelled; run it again to resume")
        take = "" if self.plan.shot(shot.index).takes == 1 else f" take {shot.pick}"
        what = f"shot {shot.index}{take}"
        record, reason = self._reusable(shot, self.manifest.shots)
        if record is not None:
            if in_film and self.manifest.shots.get(shot.index) is not record:     # an earlier take, back in use
                self._record(record)
            self.notice(f"shot {shot.index}/{len(self.plan.shots)}{take}: kept from the job directory ({record.video})")
            self._report(shot.index, "reused", 1.0, None)
            outcome = ShotOutcome(shot.index, self.jobs.path / record.video, record.seed,
                                  record.frame_count, True, record.wall_seconds, pick=shot.pick)
            outcome.takes = [TakeOutcome(shot.pick, record.seed, outcome.video_path, True)]
            return outcome
        with self._report_lock:
            if shot.index not in self.to_render:
                self.to_render.append(shot.index)
            if self.takes_to_render.get(shot.index, 0) <= 0:      # a take found stale now: more work
                self.takes_to_render[shot.index] = self.takes_to_render.get(shot.index, 0) + 1
                self.total_weight += self.weights[shot.index]
        if reason is not None:
            self.notice(f"{what}: rendering it again: {reason}")
        return self._render(shot, reason, cancel, in_film=in_film)

    def _engine_for(self, request: GenerationRequest) -> Engine:
        """The engine that renders this shot (recorded in its manifest entry): a session's fallback
        for what it cannot take, said as a notice; an engine without one refuses it here."""
        chosen = choose_engine(self.engine, request)
        if chosen.refusal is not None:
            self.notice(chosen.refusal.message_with(after="; this shot runs one-shot instead"))
        chosen.engine.check_supported(request)
        return chosen.engine

    def _render(self, shot: PlannedShot, reason: str | None, cancel: CancelToken | None, *,
                in_film: bool = True) -> ShotOutcome:
        jobs = self.jobs
        video = jobs.shot_file(shot.index, shot.key, ".mp4")
        last_frame = jobs.shot_file(shot.index, shot.key, ".last.png")
        # Files of this very take left by a run that died before recording it: not finished, redone.
        for leftover in (video, last_frame):
            remove_quietly(leftover)
        request = continued_request(shot, *self._continuity_inputs(shot))
        engine = self._engine_for(request)
        began, paused_before = time.monotonic(), self._paused_seconds()

        def progress(event: ProgressEvent) -> None:
            if not engine.capabilities.remote:     # (a server's progress comes after it accepted the job)
                self.work_began.set()
            self._report(shot.index, event.phase, event.fraction, event)

        try:
            paused = {"pause": self.pause} if self.pause is not None else {}
            result = engine.generate(request, video, want_frames=True, want_audio=True, on_progress=progress,
                                     cancel=cancel, **paused, **self._adoption(shot, engine))
        except BaseException as error:
            with self._report_lock:
                self.in_flight.pop(shot.index, None)
            if isinstance(error, RemoteError) and error.before_start and self.work_began.is_set():
                # the same dead server exited 2 or 1 by whether it died between shots or during one
                error.before_start = False
            raise
        self.work_began.set()
        frames, audio = result.frames, result.audio
        assert frames is not None and audio is not None
        from ..media.references import write_png
        write_png(frames[-1], last_frame)
        # (paused time is no time the shot took: its record, and the story's ETA, leave it out)
        seconds = time.monotonic() - began - (self._paused_seconds() - paused_before)
        record = ShotRecord(
            index=shot.index, key=shot.key, seed=request.seed, video=video.name, video_sha256=file_sha256(video),
            last_frame=last_frame.name, last_frame_sha256=file_sha256(last_frame),
            frames_sha256=_digest(frames), audio_sha256=_digest(audio), frame_count=int(frames.shape[0]),
            width=result.width, height=result.height, audio_samples=int(audio.shape[1]),
            request=request_fields(request),
            engine={"kind": type(engine).__name__, "engine_path": str(getattr(engine, "engine_path", "")),
                    "model_dir": str(getattr(engine, "model_dir", "")), "warm": engine.capabilities.warm_model,
                    "variables": dict(result.engine_variables)},
            wall_seconds=seconds)
        record.continued_from = self._continued_from(shot, self.manifest.shots) if shot.continues else ""
        self._record(record, in_film=in_film)      # the take is finished from here on
        self.rendered_any.set()
        with self._report_lock:
            self.done_weight += self.weights[shot.index]
            self.takes_to_render[shot.index] = self.takes_to_render.get(shot.index, 1) - 1
            self.render_seconds += seconds
            self._report(shot.index, "done", 1.0, None)
        outcome = ShotOutcome(shot.index, video, request.seed, record.frame_count, False, seconds, reason, pick=shot.pick)
        outcome.takes = [TakeOutcome(shot.pick, request.seed, video, False)]
        return outcome

    def _paused_seconds(self) -> float:
        return self.pause.paused_seconds() if self.pause is not None else 0.0

    def _continuity_inputs(self, shot: PlannedShot) -> tuple[Path | None, Path | None]:
        if not shot.continues:
            return None, None
        previous = self.manifest.shots[shot.index - 1]
        if shot.continuation is Continuation.ANCHOR:
            return self.jobs.path / previous.last_frame, None
        assert shot.tail_frames is not None
        return None, self._tail_file(previous, shot.tail_frames)

    def _tail_file(self, previous: ShotRecord, frames: int) -> Path:
        """The previous shot's last `frames` frames with their sound, as a reference video."""
        from ..media.decode import decode_audio, decode_video_frames
        from .mp4 import write_clip
        path = self.jobs.path / f"{Path(previous.video).stem}.tail{frames}.mp4"
        if path.exists():
            remove_quietly(path)       # made for the same shot file and length; made again rather than trusted
        source = self.jobs.path / previous.video
        all_frames = decode_video_frames(source, previous.frame_count, previous.width, previous.height)
        tail = all_frames[-frames:]
        del all_frames
        audio = decode_audio(source)
        end = sample_at(previous.frame_count)
        samples = round(frames * SAMPLE_RATE / FPS)
        clip_audio = audio[:, max(0, end - samples):end]
        return write_clip(path, iter(tail), previous.width, previous.height, clip_audio)

    # ------------------------------------------------------------------ film

    def assemble(self, output: Path, overwrite: bool) -> FilmResult | None:
        story = self.plan.storyboard
        # what the film is made of: its shots, and how they are joined
        keys = [shot.key for shot in self.plan.shots] + [f"joins:{story.crossfade_frames}:{story.crossfade_cuts}"]
        record = self.manifest.film
        if record is not None and record.shot_keys == keys and _holds(output, record.sha256):
            self.notice(f"{output} is up to date")
            return None
        self._report(len(self.plan.shots), "assembling", 0.0, None)
        pieces = _pieces(self.plan, self.manifest.shots, self.jobs.path)
        first = self.plan.shot(1).request
        film = assemble_film(pieces, output, first.width, first.height, replace=True, cancel=self.cancel)
        with self._manifest_lock:
            self.manifest.film = FilmRecord(path=str(output.resolve()), sha256=file_sha256(output), shot_keys=keys,
                                            frames=film.frames, samples=film.samples)
            self.jobs.save(self.manifest)
        self._report(len(self.plan.shots), "assembled", 1.0, None)
        return film

    # ------------------------------------------------------------------ progress

    def _report(self, index: int, phase: str, shot_fraction: float, event: ProgressEvent | None) -> None:
        with self._report_lock:
            if index in self.to_render and phase not in ("done", "reused", "assembling", "assembled"):
                self.in_flight[index] = ShotInFlight(index, phase, shot_fraction)
            else:
                self.in_flight.pop(index, None)
            if self.on_progress is None:
                return
            running = sum(self.weights[shot.shot] * shot.fraction for shot in self.in_flight.values())
            fraction = min(1.0, (self.done_weight + running) / self.total_weight) if self.to_render else 1.0
            elapsed = time.monotonic() - self.started
            eta = None
            if self.done_weight > 0:           # from the shots rendered so far: seconds per unit of work
                # (shots rendered at once: each took its own wall time, the story's runs `parallel` at a time)
                rate = self.render_seconds / self.done_weight / min(self.parallel, max(1, len(self.in_flight)))
                eta = rate * (self.total_weight - self.done_weight - running)
            elif fraction > 0.02:
                eta = elapsed * (1.0 - fraction) / fraction
            self.on_progress(StoryProgress(index, len(self.plan.shots), phase, shot_fraction, fraction, elapsed,
                                           None if eta is None else max(0.0, eta), event,
                                           tuple(self.in_flight[key] for key in sorted(self.in_flight))))


__all__ = ["MAX_PARALLEL", "ShotInFlight", "ShotOutcome", "TakeOutcome", "StoryProgress", "StoryResult", "check_parallel",
           "default_job_dir", "run_story", "story_chains"]
