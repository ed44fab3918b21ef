"""Takes: one request rendered with several seeds, to keep the best.

Take t (1-based) of a request renders it with the t-th seed: by default the request's own seed
and the ones above it (seed, seed+1, ...), or a list given outright. Every take runs on the one
engine given, in turn: a warm engine (session, library) loads the model once, so N takes cost N
denoises, not N loads; one-shot starts h3 for each. On a remote engine with `parallel` above 1 the
takes are that many server jobs at once (a fleet behind a proxy spreads them), as a storyboard's
`parallel` spreads its shots.

Files, named from the output (`clip.mp4`): `clip.take1.mp4`, `clip.take2.mp4`, ... and the contact
sheet `clip.takes.png` (a few frames of each take, a row per take, labelled with its number and
seed). Every name is checked before the first take starts, and only a regular file is ever
replaced (with `overwrite`), through safeio.outputs.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import numpy as np

from .cancel import CancelToken, PauseControl
from .engines.protocol import Engine
from .errors import GenerationCancelled, RequestError
from .fixes import Fix, changes, given
from .safeio.outputs import ALLOW_OVERWRITE
from .progress import PreviewCallback, ProgressCallback
from .request import MAX_SEED, GenerationRequest
from .result import GenerationResult

MAX_TAKES = 20                  # as storyboard packs offer (1-20 candidates per scene)
MAX_PARALLEL_TAKES = 16         # takes rendered at once on a remote engine (story.runner.MAX_PARALLEL)
TAKE_INFIX = ".take"            # clip.mp4 -> clip.take1.mp4
SHEET_SUFFIX = ".takes.png"     # clip.mp4 -> clip.takes.png

TakeCallback = Callable[[int, int], None]       # (take number, its seed), as a take starts


@dataclass
class TakesResult:
    """Every take of one request, in take order, and the contact sheet (None without an output)."""

    takes: list[GenerationResult]
    seeds: list[int]
    contact_sheet: Path | None
    sheet: np.ndarray | None = None      # the contact sheet's pixels, uint8 [H, W, 3]

    def take(self, number: int) -> GenerationResult:
        """Take `number` (1-based)."""
        if not 1 <= number <= len(self.takes):
            raise RequestError(f"pick={number}: there are takes 1 to {len(self.takes)}", field="pick",
                               hint=f"give a take from 1 to {len(self.takes)}")
        return self.takes[number - 1]


def take_seeds(first_seed: int, takes: int) -> list[int]:
    """The seeds of `takes` takes from `first_seed` upward (checked: every seed is a uint64)."""
    check_takes(takes)
    last = first_seed + takes - 1
    if last > MAX_SEED:
        raise RequestError(Fix(f"{{}} from {{}} would need seeds up to {last}, past h3's largest seed {MAX_SEED}",
                               (given("takes", takes), given("seed", first_seed))), field="seed",
                           hint=Fix("use {} or lower, or give each take's seed", (changes(seed=MAX_SEED - takes + 1),)))
    return list(range(first_seed, last + 1))


def check_takes(takes: object) -> int:
    if isinstance(takes, bool) or not isinstance(takes, int) or not 1 <= takes <= MAX_TAKES:
        raise RequestError(f"takes={takes!r} must be a whole number from 1 to {MAX_TAKES}", field="takes",
                           hint=f"use takes=3 (at most {MAX_TAKES})")
    return takes


def seeds_for(request: GenerationRequest, takes: int | None = None, seeds: Sequence[int] | None = None) -> list[int]:
    """The seed of every take: `seeds` as given (their count must be `takes`, when both are given),
    else `takes` seeds from the request's seed upward."""
    if seeds is None:
        return take_seeds(request.seed, 1 if takes is None else takes)
    chosen = list(seeds)
    check_takes(len(chosen) or 0)
    if takes is not None and check_takes(takes) != len(chosen):
        raise RequestError(f"takes={takes} but {len(chosen)} seeds were given ({', '.join(map(str, chosen))})",
                           field="takes", hint=f"give {takes} seeds, or takes={len(chosen)} (or leave takes out: "
                                               "one take per seed)")
    if len(set(chosen)) != len(chosen):
        raise RequestError(f"the seeds {', '.join(map(str, chosen))} repeat one: the same seed renders the same take",
                           field="seed", hint="give each take its own seed")
    for seed in chosen:      # the request's own rule (a uint64), said per seed
        replace(request, seed=seed).validate(check_files=False)
    return chosen


def take_output(output: str | os.PathLike[str], take: int) -> Path:
    """Take `take`'s MP4, named from the output: clip.mp4 -> clip.take2.mp4."""
    path = Path(output)
    return path.with_name(f"{path.stem}{TAKE_INFIX}{take}{path.suffix or '.mp4'}")


def sheet_output(output: str | os.PathLike[str]) -> Path:
    """The contact sheet, named from the output: clip.mp4 -> clip.takes.png."""
    path = Path(output)
    return path.with_name(path.stem + SHEET_SUFFIX)


def check_parallel_takes(parallel: object, engine: Engine) -> int:
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= MAX_PARALLEL_TAKES:
        raise RequestError(f"parallel={parallel!r}: takes rendered at once must be a whole number from 1 to "
                           f"{MAX_PARALLEL_TAKES}", field="parallel",
                           hint=f"give parallel a number from 1 to {MAX_PARALLEL_TAKES} (1 renders take after take)")
    if parallel > 1 and not engine.capabilities.remote:
        raise RequestError(f"parallel={parallel} needs a remote engine: one local engine renders one clip at a time "
                           "(a warm one renders take after take without loading the model again)", field="parallel",
                           hint="give engine=RemoteEngine(URL) (a server, or a proxy in front of several), or parallel=1")
    return parallel


def check_take_outputs(output: str | os.PathLike[str], count: int, *, overwrite: bool) -> tuple[list[Path], Path]:
    """Every take's MP4 and the contact sheet, checked before anything renders (safeio.outputs)."""
    from .engines.output import resolve_output
    from .safeio.outputs import check_output
    paths = [resolve_output(take_output(output, take), overwrite=overwrite) for take in range(1, count + 1)]
    sheet = check_output(sheet_output(output), overwrite=overwrite, field="output", label="the contact sheet",
                         allow_overwrite=ALLOW_OVERWRITE)
    return [path for path in paths if path is not None], sheet


def sheet_frames(result: GenerationResult) -> tuple[np.ndarray, ...]:
    """The few frames of a take the contact sheet shows: from its frames in memory, else its MP4."""
    from .media.decode import decode_frames_at
    from .media.sheet import frame_indices
    indices = frame_indices(result.frame_count)
    if result.frames is not None:
        return tuple(result.frames[index] for index in indices)
    if result.video_path is None:
        return ()
    return tuple(decode_frames_at(result.video_path, indices))


def write_sheet(path: Path, rows: list, *, overwrite: bool, field: str = "output") -> np.ndarray:
    """Draw the contact sheet of `rows` (media.sheet.SheetRow) and publish it as a PNG at `path`
    (a clip's takes here, a storyboard's in story/sheet.py); `field` names the output in a refusal."""
    from .media.png import png_bytes
    from .media.sheet import contact_sheet
    from .safeio.outputs import write_output
    picture = contact_sheet(rows)
    write_output(path, png_bytes(picture), overwrite=overwrite, field=field, allow_overwrite=ALLOW_OVERWRITE)
    return picture


def generate_takes(engine: Engine, request: GenerationRequest, output: str | os.PathLike[str] | None, *,
                   takes: int | None = None, seeds: Sequence[int] | None = None, overwrite: bool = False,
                   want_frames: bool = False, want_audio: bool = True, on_progress: ProgressCallback | None = None,
                   on_preview: PreviewCallback | None = None, on_take: TakeCallback | None = None,
                   cancel: CancelToken | None = None, parallel: int = 1,
                   pause: PauseControl | None = None) -> TakesResult:
    """Render `takes` takes of `request` (seeds from request.seed upward), or one per seed in `seeds`.

    output: the clip's name; take t is written to take_output(output, t) and the contact sheet to
      sheet_output(output). None keeps no files (the results carry frames when `want_frames`).
    on_take(take, seed): called as each take starts (from the rendering threads with `parallel`).
    parallel: takes rendered at once, above 1 only on a remote engine (each take is one server job).
    pause: pausing it stops the engine where it is (every take in flight); resume goes on.
    A take that fails stops the rest (the takes finished by then stay on disk) and is raised.
    """
    request = request.validate(check_files=False)
    chosen = seeds_for(request, takes, seeds)
    check_parallel_takes(parallel, engine)
    paths: list[Path | None] = [None] * len(chosen)
    sheet_path = None
    if output is not None and os.fspath(output):
        found, sheet_path = check_take_outputs(output, len(chosen), overwrite=overwrite)
        paths = list(found)
    requests = [replace(request, seed=seed) for seed in chosen]
    report_lock = threading.Lock()

    def progress(event) -> None:        # one caller's callback at a time, whichever thread reports
        if on_progress is not None:
            with report_lock:
                on_progress(event)

    def render(index: int, stop: CancelToken | None) -> GenerationResult:
        if stop is not None and stop.cancelled:
            raise GenerationCancelled("the takes were cancelled")
        if on_take is not None:
            with report_lock:
                on_take(index + 1, chosen[index])
        return engine.generate(requests[index], paths[index], overwrite=overwrite,
                               want_frames=want_frames,
                               want_audio=want_audio, on_progress=progress,
                               on_preview=on_preview if parallel == 1 else None, cancel=stop,
                               **({} if pause is None else {"pause": pause}))

    if parallel == 1:
        results = [render(index, cancel) for index in range(len(chosen))]
    else:
        results = render_at_once(render, len(chosen), parallel, cancel)
    sheet = None
    if sheet_path is not None:
        from .media.sheet import SheetRow
        rows = [SheetRow(number, seed, sheet_frames(result))
                for number, (seed, result) in enumerate(zip(chosen, results), 1)]
        sheet = write_sheet(sheet_path, rows, overwrite=overwrite)
    return TakesResult(results, chosen, sheet_path, sheet)


T = TypeVar("T")


def render_at_once(render: "Callable[[int, CancelToken], T]", count: int, parallel: int,
                   cancel: CancelToken | None, *, thread_name: str = "h3bridge-take",
                   cancelled: str = "the takes were cancelled") -> "list[T]":
    """`render(index, stop)` for index 0..count-1, up to `parallel` at once (the takes of a request
    here, a storyboard shot's takes in story.runner): the first failure cancels the others and is
    raised once every thread has let go; a cancel is GenerationCancelled(`cancelled`)."""
    stop = CancelToken(check=(lambda: cancel.cancelled) if cancel is not None else None)
    results: dict[int, T] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def one(index: int) -> None:
        try:
            results[index] = render(index, stop)
        except BaseException as error:      # noqa: BLE001 - raised below, in the caller's thread
            with lock:
                failures.append(error)
            stop.cancel()

    with ThreadPoolExecutor(max_workers=min(parallel, count), thread_name_prefix=thread_name) as pool:
        try:
            for future in [pool.submit(one, index) for index in range(count)]:
                future.result()
        except BaseException:
            stop.cancel()
            raise
    if failures:
        raise next((error for error in failures if not isinstance(error, GenerationCancelled)), failures[0])
    if stop.cancelled:
        raise GenerationCancelled(cancelled)
    return [results[index] for index in range(count)]


__all__ = ["MAX_TAKES", "TakesResult", "check_takes", "generate_takes", "render_at_once", "seeds_for", "sheet_output",
           "take_output", "take_seeds"]
