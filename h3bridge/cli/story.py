"""`h3bridge story STORY.toml -o FILM.mp4`: render a storyboard, resume it, review shots."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..cancel import CancelToken
from .engine import (EXIT_OK, EXIT_USAGE, PhaseProgressBars, add_engine_run_options, bar_columns,
                          cli_words, engine_from_args, run_with_signals)
from ..errors import GenerationCancelled, H3BridgeError, RequestError
from ..fixes import Change, Fix, Given, said
from ..progress import WAITING_PHASE
from .flags import int_flag
from ..story.plan import StoryMemoryError
from ..story.runner import MAX_PARALLEL, StoryProgress, default_job_dir
from ..story.storyboard import PATH_KEYS, SHOT_KEYS, STORY_KEYS, Storyboard

# The storyboard's own words: its keys, and what its checks name ("shot", the file itself). A
# refusal about one of these is said as the storyboard says it (`frames = 22`), not in the
# command line's flags; the `story` command's own options (--redo, --only, -o) keep theirs.
STORYBOARD_FIELDS = frozenset({*SHOT_KEYS, *STORY_KEYS, *PATH_KEYS, "shot", "storyboard"})


def add_story_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "story", help="render a storyboard of chained shots into one film (resumable)",
        description="Render a storyboard (a TOML file of [[shot]] tables) shot by shot into one MP4. Every shot "
                    "is checked before the first starts; finished shots are kept in the job directory, so "
                    "running the same command again resumes, and only edited shots (and the shots that "
                    "continue from them) are rendered again.")
    parser.add_argument("storyboard", type=Path, metavar="STORY.toml", help="the storyboard file")
    parser.add_argument("-o", "--output", type=Path, metavar="FILM.mp4",
                        help="the film (default: the storyboard's name with .mp4, beside it)")
    parser.add_argument("--job-dir", type=Path, metavar="DIR",
                        help=f"where the shots and the manifest live (default: FILM{'.h3story'} beside the film)")
    review = parser.add_argument_group("review")
    review.add_argument("--redo", type=int_flag(), metavar="N",
                        help="re-roll shot N with a new seed (and render again the shots continuing from it)")
    review.add_argument("--seed", type=int_flag(), metavar="S", help="with --redo: the seed for shot N")
    review.add_argument("--pick", type=shot_take, action="append", metavar="SHOT=TAKE",
                        help="the film uses take TAKE of shot SHOT (a shot with takes = N); repeat for more shots. "
                             "Kept for later runs; renders nothing but the shots that continue from a re-picked one")
    review.add_argument("--only", type=int_flag(), metavar="N",
                        help="render shots 1..N and stop, for a look (their MP4s are in the job directory)")
    review.add_argument("--stop-after-shot", action="store_true",
                        help="render the next shot the film needs, then stop (the engine and its memory are "
                             "freed; the same command without it resumes). While a story renders, `kill -USR1 "
                             "PID` does the same")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a film at -o that this story's job did not write")
    parser.add_argument("--parallel", type=int_flag(), default=1, metavar="N",
                        help=f"with --remote: render up to N independent shots at once (1-{MAX_PARALLEL}; default "
                             "1). Shots after a cut start at once; an anchor or tail shot waits for the shot it "
                             "continues. The film is the same as one rendered shot after shot")
    parser.add_argument("--json", action="store_true", help="print a summary as JSON on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    add_engine_run_options(parser, warm_by_default=True)
    parser.set_defaults(handler=run_story_command)


class StoryProgressDisplay(PhaseProgressBars):
    """Shot k/N, the engine's phase, the overall fraction and the ETA: one tqdm bar on a
    terminal, a line per shot and phase otherwise (PhaseProgressBars' rules: it turns itself
    off if stderr breaks). With --parallel, every shot in flight has a bar of its own under
    the overall one (a line per shot and phase without a terminal)."""

    def __init__(self, enabled: bool = True, *, terminal: bool | None = None, parallel: int = 1) -> None:
        super().__init__(enabled, terminal=terminal)
        self.parallel = parallel
        self._shot_phases: dict[int, str] = {}     # without a terminal: the phase each shot last showed
        self._lanes: list = []                     # with --parallel on a terminal: one bar per shot in flight

    def _show(self, progress: StoryProgress) -> None:   # type: ignore[override]
        if progress.event is not None and progress.event.phase == WAITING_PHASE:
            # generate's wait display: who holds the engine, kept visible (a live line on a
            # terminal; otherwise a line at the start, at 10, 30, 60 s, then each minute)
            self._show_wait(progress.event)
            return
        if self._phase == WAITING_PHASE:       # the wait is over: its line stays, the shot's bar follows
            self.close()
            self._phase = None
        eta = "" if progress.eta is None else f", ETA {_duration(progress.eta)}"
        where = f"shot {progress.shot}/{progress.shots}"
        if not self.terminal:
            if progress.phase == "reused":
                return           # the notice said so
            if self._shot_phases.get(progress.shot) != progress.phase:
                self._shot_phases[progress.shot] = progress.phase
                flight = ", ".join(str(shot.shot) for shot in progress.in_flight)
                others = f"; shots in flight: {flight}" if self.parallel > 1 and flight else ""
                print(f"h3bridge: {where}: {progress.phase} (overall {progress.fraction:.0%}{eta}{others})",
                      file=sys.stderr, flush=True)
            return
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=1000, file=sys.stderr, leave=True, ncols=bar_columns(),
                             bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}]{postfix}")
        if self.parallel > 1:
            flight = len(progress.in_flight)
            self._bar.set_description_str(f"story: {flight} shot{'s' if flight != 1 else ''} in flight", refresh=False)
            self._bar.set_postfix_str(f"{progress.fraction:4.0%} of {progress.shots} shots{eta}", refresh=False)
        else:
            self._bar.set_description_str(f"{where} {progress.phase:<18.18}", refresh=False)
            self._bar.set_postfix_str(f"shot {progress.shot_fraction:4.0%}{eta}", refresh=False)
        self._bar.n = int(progress.fraction * 1000)
        self._bar.refresh()
        if self.parallel > 1:
            self._show_lanes(progress, tqdm)

    def _show_lanes(self, progress: StoryProgress, tqdm) -> None:
        """One bar per shot in flight, in shot order, below the overall bar; an empty lane is blank."""
        while len(self._lanes) < len(progress.in_flight):
            self._lanes.append(tqdm(total=1000, file=sys.stderr, leave=False, ncols=bar_columns(),
                                    position=len(self._lanes) + 1, bar_format="{desc} {percentage:3.0f}%|{bar}|"))
        for lane, bar in enumerate(self._lanes):
            if lane < len(progress.in_flight):
                shot = progress.in_flight[lane]
                bar.set_description_str(f"  shot {shot.shot}/{progress.shots} {shot.phase:<22.22}", refresh=False)
                bar.n = int(shot.fraction * 1000)
            else:
                bar.set_description_str(" " * 30, refresh=False)
                bar.n = 0
            bar.refresh()

    def close(self) -> None:
        for bar in self._lanes:
            try:
                bar.close()
            except (OSError, ValueError):
                pass
        self._lanes = []
        super().close()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def storyboard_setting(name: str, value: object) -> str:
    """One storyboard key as the storyboard writes it (TOML): `ssd_streaming = true`; a reference
    of one kind as a shot's `references` entry (h3bridge.fixes: the storyboard's renderer)."""
    if name == "references" and hasattr(value, "value"):
        return f'a reference {{ kind = "{value.value}", path = ... }}'     # type: ignore[attr-defined]
    if name not in STORYBOARD_FIELDS:     # not a storyboard key (force, preview): the command's flag
        return cli_words((Change(name, value),))
    if isinstance(value, str):
        return f"{name} = {json.dumps(value)}"
    shown = getattr(value, "value", value)
    return f"{name} = {json.dumps(shown) if isinstance(shown, str) else str(shown).lower() if isinstance(shown, bool) else shown}"


def storyboard_words(group: "Sequence[Change]") -> str:
    """A group of changes as storyboard keys: `ssd_streaming = true, layers = 40`; a setting the
    storyboard gave (a Given) as its key and value as given: `frames = 23`."""
    return ", ".join(storyboard_given(change) if isinstance(change, Given) else
                     storyboard_setting(change.field, change.value) for change in group)


def storyboard_given(change: Given) -> str:
    """A setting the storyboard gave, named in a message: `frames = 23`, `ssd_streaming`; one that
    is no storyboard key (force) as the command's flag."""
    if change.field not in STORYBOARD_FIELDS:
        return cli_words((change,))
    if change.value is None:
        return change.field
    return f"{change.field} = {change.value.lower() if change.value in ('True', 'False') else change.value}"


def storyboard_refusal(error: H3BridgeError) -> int:
    """Say a refusal about the storyboard in its words (its settings said as keys; main would say
    them as CLI flags); exit 2."""
    hint = error.hint_in(storyboard_words)
    text = error.message_in(storyboard_words) + (f"\n  fix: {hint}" if hint else "")
    try:
        print(f"h3bridge: {text}", file=sys.stderr)
    except OSError:
        pass
    return EXIT_USAGE


def check_parallel_flags(args: argparse.Namespace) -> None:
    """--parallel N: a number from 1 to MAX_PARALLEL, and above 1 only with --remote (said in flags)."""
    if not 1 <= args.parallel <= MAX_PARALLEL:
        raise RequestError(f"--parallel {args.parallel}: shots rendered at once must be from 1 to {MAX_PARALLEL}",
                           field="parallel", hint=f"give --parallel a number from 1 to {MAX_PARALLEL}, or drop it "
                                                  "to render shot after shot")
    if args.parallel > 1 and not getattr(args, "remote", None):
        raise RequestError(f"--parallel {args.parallel} needs --remote URL: this machine's engine renders one clip "
                           "at a time, so shots can only render at once on servers", field="parallel",
                           hint="add --remote URL (an `h3bridge serve`, or a proxy in front of several), "
                                "or drop --parallel")


def shot_take(text: str) -> tuple[int, int]:
    """--pick SHOT=TAKE: two whole numbers (safeio.numbers), as the shot and its take."""
    from ..safeio.numbers import read_int
    shot, equals, take = text.partition("=")
    fix = "give --pick SHOT=TAKE, e.g. --pick 2=3 (the film uses take 3 of shot 2)"
    if not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not SHOT=TAKE; fix: {fix}")
    try:
        return (read_int(shot, field=None, minimum=1, hint=fix), read_int(take, field=None, minimum=1, hint=fix))
    except RequestError as error:
        raise argparse.ArgumentTypeError(f"{error.message}; fix: {error.hint}") from None


shot_take.__name__ = "SHOT=TAKE"
shot_take.reads_number = True      # type: ignore[attr-defined]  (the conformance walk's marker)


def check_pick_flags(args: argparse.Namespace, storyboard: Storyboard) -> dict[int, int]:
    """--pick SHOT=TAKE for shots and takes the storyboard has (said in flags), as run_story's picks."""
    count = len(storyboard.shots)
    picks: dict[int, int] = {}
    for shot, take in args.pick or ():
        if shot > count:
            raise RequestError(f"--pick {shot}={take}: the story has shots 1 to {count}", field="pick",
                               hint=f"name a shot from 1 to {count}, e.g. --pick {count}=1")
        takes = storyboard.takes_for(shot)
        if take > takes:
            raise RequestError(f"--pick {shot}={take}: shot {shot} has " + (f"takes 1 to {takes}" if takes > 1 else
                                                                          "one take (no takes = N)"), field="pick",
                               hint=f"give a take from 1 to {takes}, e.g. --pick {shot}={takes}" if takes > 1 else
                               f"add takes = 2 (or more) to shot {shot}'s [[shot]] table, then run the story again")
        picks[shot] = take
    return picks


def run_story_command(args: argparse.Namespace) -> int:
    if args.seed is not None and args.redo is None:
        raise RequestError("--seed is for a shot being re-rolled", field="seed", hint="add --redo N")
    check_parallel_flags(args)
    with warnings.catch_warnings(record=True) as renamed:
        warnings.simplefilter("always", DeprecationWarning)
        try:
            storyboard = Storyboard.from_toml(args.storyboard)
        except RequestError as error:     # everything reading the file finds is the storyboard's
            return storyboard_refusal(error)
    for warning in renamed:           # old key spellings (vocabulary.py): one line each
        if issubclass(warning.category, DeprecationWarning):
            print(f"h3bridge: notice: {args.storyboard}: {warning.message}", file=sys.stderr)
    try:
        return _run_story(args, storyboard)
    except StoryMemoryError as error:     # the plan says CLI flags; the settings live in the storyboard
        return storyboard_refusal(error.in_words(setting=storyboard_setting, everywhere="at the top of the storyboard (before "
                             "the first [[shot]])", in_shot="in shot {shot}'s [[shot]] table (instead of seconds)",
                             force="run the same command with --force"))
    except RequestError as error:
        if error.field in STORYBOARD_FIELDS:      # a shot's request, checked by story.plan
            return storyboard_refusal(error)
        raise


@contextmanager
def stop_after_shot_on_signal(stop: threading.Event, notice: Callable[[str], None]) -> Iterator[None]:
    """SIGUSR1 (`kill -USR1 PID`) while a story renders: stop after the shot rendering now."""
    def requested(signum: int, frame: object) -> None:
        if not stop.is_set():
            stop.set()
            notice("stopping after the shot rendering now (SIGUSR1); the same command resumes the story")

    previous = signal.signal(signal.SIGUSR1, requested)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _run_story(args: argparse.Namespace, storyboard: Storyboard) -> int:
    from ..story.runner import run_story
    output = args.output if args.output is not None else args.storyboard.with_suffix(".mp4")
    job_dir = args.job_dir if args.job_dir is not None else default_job_dir(output)
    picks = check_pick_flags(args, storyboard)        # before any engine is opened
    engine = engine_from_args(args)
    display = StoryProgressDisplay(enabled=not args.quiet, parallel=args.parallel)

    def notice(text: "str | Fix") -> None:     # a notice that names settings: said as storyboard keys
        display.close()
        try:
            print(f"h3bridge: {said(text, storyboard_words)}", file=sys.stderr, flush=True)
        except OSError:
            pass

    cancel, stop_after_shot = CancelToken(), threading.Event()
    if args.stop_after_shot:
        stop_after_shot.set()
    def keeps_finished_shots(error: GenerationCancelled) -> None:
        error.message = f"{error.message}; finished shots are kept in {job_dir}: run the same command again to resume"

    run = run_with_signals(engine, display, cancel, lambda pause: run_story(
        storyboard, output, engine=engine, job_dir=job_dir, redo=args.redo, redo_seed=args.seed, only=args.only,
        overwrite=args.overwrite, force=args.force, storyboard_path=str(args.storyboard), on_progress=display,
        on_notice=notice, cancel=cancel, parallel=args.parallel, picks=picks, stop_after_shot=stop_after_shot,
        pause=pause), also=stop_after_shot_on_signal(stop_after_shot, notice), on_cancelled=keeps_finished_shots)
    if run.status is not None:
        return run.status
    result = run.outcome
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    else:
        film = f"wrote {result.output}" if result.assembled else \
            (f"kept {result.output}" if result.output is not None else
             f"stopped after shot {result.stopped_after_shot} (run the same command without --stop-after-shot to "
             "go on)" if result.stopped_after_shot is not None else f"shots 1-{args.only} are ready")
        # (an unchanged film: the runner's notice already said it "is up to date"; once is enough)
        takes = "" if all(len(shot.takes) <= 1 for shot in result.shots) else \
            (f" ({result.rendered_takes} take(s) rendered; picks: "
             + ", ".join(f"shot {shot.index} take {shot.pick}" for shot in result.shots if len(shot.takes) > 1)
             + f"; every take on the contact sheet {result.contact_sheet})")
        print(f"h3bridge: {film}: {result.film_frames} frames ({result.film_frames / 24:.1f} s); "
              f"{result.rendered} shot(s) rendered, {len(result.shots) - result.rendered} kept{takes}; "
              f"shots in {result.job_dir}; {result.wall_seconds:.1f} s wall time", file=sys.stderr)
    return EXIT_OK
