"""Checking a whole storyboard before its first shot starts.

Every shot is validated as the request it will really be: an `anchor` shot with a first frame,
a `tail` shot with a reference video carrying audio. Those inputs do not exist yet (the
previous shot makes them), so stand-ins of the same shape are written to a temporary folder and
the request's own validation (`GenerationRequest.validate`, which holds upstream's rules) checks
them. Then the model is checked (a `tail` needs the Ref2VA checkpoint) and the memory plan of the
most demanding shot must fit. Each shot also gets its key: what it is made of, including the
shot it continues from, so an edit invalidates that shot and whatever continues from it.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import H3BridgeError, MemoryPlanError, ModelError, RequestError
from ..fixes import Change, Fix, changes, given, joined, literal
from ..safeio.paths import not_regular, sha256_regular
from ..geometry import FPS, SAMPLE_RATE, align_frame_count, frames_from_seconds
from ..request import GenerationRequest, Reference, ReferenceKind, request_fields
from .storyboard import Continuation, Storyboard


def tail_frames(seconds: float) -> int:
    """The frames of a `tail` reference: the last `seconds`, rounded up to a legal 5 + 17n length.

    Upstream trims a reference video to 5 + 17n frames and needs at least 2 s of its soundtrack
    (h3.c h3_generate), so a 48-frame (2 s) tail would be trimmed to 39 frames and refused;
    2 s becomes 56 frames (2.33 s)."""
    return align_frame_count(frames_from_seconds(seconds))


@dataclass(frozen=True)
class PlannedShot:
    index: int                      # 1-based
    continuation: Continuation
    request: GenerationRequest      # without the previous shot's inputs (the runner adds them)
    key: str                        # changes when this shot or the shot it continues from changes
    tail_frames: int | None = None  # for `tail`: frames of the previous shot it conditions on
    # Takes: the shot rendered with `takes` seeds (request.seed of take 1 upward); `request` and
    # `key` are the picked take's (the one the film uses), `take_keys` every take's.
    takes: int = 1
    pick: int = 1
    take_seeds: tuple[int, ...] = ()
    take_keys: tuple[str, ...] = ()

    def take(self, number: int) -> "PlannedShot":
        """This shot as take `number` (1-based) renders it: that take's seed and key."""
        seeds = self.take_seeds or (self.request.seed,)
        keys = self.take_keys or (self.key,)
        return replace(self, request=replace(self.request, seed=seeds[number - 1]), key=keys[number - 1], pick=number)

    @property
    def continues(self) -> bool:
        return self.continuation is not Continuation.CUT

    @property
    def dropped_frames(self) -> int:
        """Frames the assembly drops at the join: an anchor's first frame repeats the last one."""
        return 1 if self.continuation is Continuation.ANCHOR else 0


@dataclass
class StoryPlan:
    storyboard: Storyboard
    shots: list[PlannedShot]
    most_demanding: int = 0                     # index of the shot whose memory plan was checked
    memory_plan: object | None = None           # model.memory.MemoryPlan (None when not checked)
    model_warnings: "list[str | Fix]" = field(default_factory=list)   # a Fix names settings (h3bridge.fixes)

    @property
    def film_frames(self) -> int:
        return sum(shot.request.frame_count - shot.dropped_frames for shot in self.shots)

    def shot(self, index: int) -> PlannedShot:
        return self.shots[index - 1]


def continued_request(shot: PlannedShot, anchor_image: Path | None, tail_video: Path | None) -> GenerationRequest:
    """The shot's request with what the previous shot supplies: its last frame, or its tail."""
    if shot.continuation is Continuation.ANCHOR:
        assert anchor_image is not None
        return replace(shot.request, first_frame=anchor_image)
    if shot.continuation is Continuation.TAIL:
        assert tail_video is not None
        return replace(shot.request, references=(Reference(ReferenceKind.VIDEO, tail_video), *shot.request.references))
    return shot.request


def plan_story(storyboard: Storyboard, model_dir: str | Path | None = None, *,
               seed_overrides: Mapping[int, int] | None = None, session: bool = False,
               force: bool = False, check_files: bool = True, machine: object | None = None,
               picks: Mapping[int, int] | None = None) -> StoryPlan:
    """Validate every shot, check the model and the memory plan of the most demanding shot.

    Raises RequestError naming the shot (`shot 3: ...`) with the request's own fix, ModelError
    when a `tail` (or any reference) needs the Ref2VA checkpoint that `model_dir` lacks, and
    MemoryPlanError when the most demanding shot will not fit (unless `force`). `model_dir`
    None skips the model and memory checks (for callers that only want the keys). `machine`: a
    model.memory.MachineFacts to plan for (default: this machine). `picks`: shot -> the take the
    film uses (default the first); a shot that continues from a shot follows its pick."""
    storyboard.check_story_settings()
    overrides = dict(seed_overrides or {})
    chosen = check_picks(storyboard, picks)
    shots: list[PlannedShot] = []
    for index, shot in enumerate(storyboard.shots, 1):
        request = _shot_error(index, lambda: storyboard.base_request(index, overrides.get(index)))
        continuation = shot.continuation
        tail = tail_frames(storyboard.tail_seconds_for(index)) if continuation is Continuation.TAIL else None
        takes = storyboard.takes_for(index)
        seeds = _shot_error(index, lambda: _take_seeds(request.seed, takes))
        planned = PlannedShot(index, continuation, request, "", tail, takes=takes, take_seeds=tuple(seeds))
        # Every value first (frame counts, canvas, ...), as the request it will be: nothing below
        # computes with a value that was not checked (`seconds = nan` was a traceback).
        _check_values(planned)
        first = shots[0].request if shots else request
        if (request.width, request.height) != (first.width, first.height):
            raise RequestError(f"shot {index} is {request.width}x{request.height}, but the film is "
                               f"{first.width}x{first.height} (shot 1's canvas): the shots of one film share a canvas",
                               field="width", hint=Fix(f"give shot {index} {{}} and {{}}, or set width and height once "
                                                       "at the storyboard's top level",
                                                       (changes(width=first.width), changes(height=first.height))))
        if continuation is not Continuation.CUT:
            _check_continuation(index, continuation, request, shots[-1] if shots else None, tail)
        shots.append(planned)
    plan = StoryPlan(storyboard, shots)
    with tempfile.TemporaryDirectory(prefix="h3bridge-story-plan-") as scratch:
        probes = [_probe_request(shot, plan, Path(scratch)) for shot in shots]
        for shot, probe in zip(shots, probes):
            try:
                probe.validate(check_files=check_files, reference_names=_story_reference_names(shot, probe))
            except RequestError as error:
                raise _in_story_words(error, shot) from None
        # Keys last: they hash the shots' input files, which validation has just found to be
        # regular, readable media (a FIFO or /dev/zero as first_frame was hashed first, and hung).
        for position, shot in enumerate(shots):
            # a shot continues from the take the film uses of the shot before it (its pick)
            after = shots[position - 1].key if position and shot.continues else None
            keys = tuple(_shot_key(replace(shot.request, seed=seed), shot.continuation, shot.tail_frames,
                                   after, check_files) for seed in shot.take_seeds)
            pick = chosen.get(shot.index, 1)
            shots[position] = replace(shot, request=replace(shot.request, seed=shot.take_seeds[pick - 1]),
                                      key=keys[pick - 1], pick=pick, take_keys=keys)
        if model_dir is not None:
            _check_model_and_memory(plan, probes, Path(model_dir), session=session, force=force, machine=machine)
    return plan


# ----------------------------------------------------------------------------- checks

def _take_seeds(first: int, takes: int) -> list[int]:
    from ..takes import take_seeds
    if takes == 1 or isinstance(first, bool) or not isinstance(first, int):
        return [first]          # (a seed that is not a number is refused by the request's own check)
    return take_seeds(first, takes)


def check_picks(storyboard: Storyboard, picks: Mapping[int, int] | None) -> dict[int, int]:
    """shot -> take, every shot and take in the storyboard (RequestError naming `pick` otherwise)."""
    count = len(storyboard.shots)
    chosen: dict[int, int] = {}
    for shot, take in (picks or {}).items():
        if isinstance(shot, bool) or not isinstance(shot, int) or not 1 <= shot <= count:
            raise RequestError(f"pick {shot!r}={take!r}: the story has shots 1 to {count}", field="pick",
                               hint=f"pick a take of a shot from 1 to {count}, e.g. pick {{1: 2}}")
        takes = storyboard.takes_for(shot)
        if isinstance(take, bool) or not isinstance(take, int) or not 1 <= take <= takes:
            raise RequestError(f"pick {shot}={take!r}: shot {shot} has {'only one take' if takes == 1 else f'takes 1 to {takes}'}",
                               field="pick", hint=(f"pick a take from 1 to {takes}" if takes > 1 else
                                                   f"give shot {shot} takes = 2 or more in the storyboard first"))
        chosen[shot] = take
    return chosen


def _shot_error(index: int, action):
    try:
        return action()
    except RequestError as error:
        raise RequestError(error.message_with(f"shot {index}: "), field=error.field, hint=error.hint_data) from None


def _check_values(shot: PlannedShot) -> None:
    """The shot's values as the request it will be, with placeholders (never read) for what the
    previous shot supplies: no file is touched here (the stand-ins are checked later)."""
    placeholder = Path("(the previous shot's output)")
    try:
        request = continued_request(shot, placeholder, placeholder)
        request.validate(check_files=False, reference_names=_story_reference_names(shot, request))
    except RequestError as error:
        raise _in_story_words(error, shot) from None


def _story_reference_names(shot: PlannedShot, request: GenerationRequest) -> list[str] | None:
    """What the storyboard calls each of the request's references: for a `tail` shot the first is
    the previous shot's tail, and the user's own are numbered as written."""
    if shot.continuation is not Continuation.TAIL:
        return None
    tail = f'the tail of shot {shot.index - 1} (continue = "tail")'
    return [tail, *(f"reference {index} ({reference.kind.value})"
                    for index, reference in enumerate(request.references[1:], 1))]


def _in_story_words(error: RequestError, shot: PlannedShot) -> RequestError:
    """A request's refusal as the storyboard says it: the shot's number (its references are named
    by `_story_reference_names` as the request is validated); a tail too short for a soundtrack
    gets the storyboard's own fix."""
    hint: "str | Fix | None" = error.hint_data
    if shot.continuation is Continuation.TAIL and error.fix is not None and \
            Change("references", ReferenceKind.SILENT_VIDEO) in error.fix.changes:
        # the fix would make the tail a silent video, which a storyboard cannot ask for
        hint = 'a tail shot needs at least 56 frames; or use continue = "anchor" or "cut"'
    return RequestError(error.message_with(f"shot {shot.index}: "), field=error.field, hint=hint)


def _check_continuation(index: int, continuation: Continuation, request: GenerationRequest,
                        previous: PlannedShot | None, tail: int | None) -> None:
    how = f'continue = "{continuation.value}"'
    if previous is None:
        raise RequestError(f"shot {index}: {how}, but there is no shot before it to continue from",
                           field="continue", hint='start the story with continue = "cut" (the default)')
    if continuation is Continuation.ANCHOR:
        if request.first_frame is not None:
            raise RequestError(Fix(literal(f"shot {index}: {how} makes the previous shot's last frame this shot's "
                                           "first frame, ") + "and the shot also sets {}", (given("first_frame"),)),
                               field="first_frame",
                               hint=Fix('drop {}, or use continue = "cut"', (given("first_frame"),)))
        if request.references:
            raise RequestError(f"shot {index}: {how} anchors the first frame (FL2VA), which cannot be combined with "
                               f"references (Ref2VA)", field="references",
                               hint='drop the references, or use continue = "tail" or "cut"')
    if continuation is Continuation.TAIL:
        assert tail is not None
        if request.first_frame is not None or request.last_frame is not None:
            raise RequestError(f"shot {index}: {how} conditions on a reference video (Ref2VA), which cannot be "
                               f"combined with first_frame/last_frame anchors", field="first_frame",
                               hint='drop the anchors, or use continue = "anchor"')
        before_frames = previous.request.frame_count
        if before_frames < tail:
            raise RequestError(f"shot {index}: {how} takes the last {tail} frames ({tail / FPS:.2f} s) of shot "
                               f"{previous.index}, which has only {before_frames} frames",
                               field="tail_seconds", hint=f"make shot {previous.index} at least {tail} frames "
                                                          f"long, or shorten tail_seconds")


def _probe_request(shot: PlannedShot, plan: StoryPlan, scratch: Path) -> GenerationRequest:
    """The shot's request with stand-ins of what the previous shot will supply."""
    from ..media.references import write_png
    from .mp4 import write_clip
    if not shot.continues:
        return shot.request
    before = plan.shot(shot.index - 1).request
    if shot.continuation is Continuation.ANCHOR:
        image = write_png(np.zeros((before.height, before.width, 3), np.uint8), scratch / f"anchor-{shot.index}.png")
        return continued_request(shot, image, None)
    assert shot.tail_frames is not None
    samples = round(shot.tail_frames * SAMPLE_RATE / FPS)
    blank = np.zeros((before.height, before.width, 3), np.uint8)
    video = write_clip(scratch / f"tail-{shot.index}.mp4", (blank for _ in range(shot.tail_frames)),
                       before.width, before.height, np.zeros((2, samples), np.float32), crf=30)
    return continued_request(shot, None, video)


def _check_model_and_memory(plan: StoryPlan, probes: list[GenerationRequest], model_dir: Path, *,
                            session: bool, force: bool, machine: object | None) -> None:
    from ..model.inventory import inspect_model
    from ..model.memory import check_model_for, plan_memory, preflight
    inventory = inspect_model(model_dir)
    for shot, probe in zip(plan.shots, probes):
        try:
            check_model_for(probe, inventory)
        except ModelError as error:
            if shot.continuation is Continuation.TAIL:
                raise ModelError(error.message_with(f'shot {shot.index}: continue = "tail" conditions on the previous '
                                                    "shot's last seconds as a Ref2VA reference video, and "),
                                 hint=joined(error.hint_data or "", f'; or use continue = "anchor" for shot {shot.index}')) from None
            raise ModelError(error.message_with(f"shot {shot.index}: "), hint=error.hint_data) from None
    peaks = [plan_memory(probe, inventory, session=session, machine=machine).peak for probe in probes]  # type: ignore[arg-type]
    demanding = max(range(len(probes)), key=lambda i: peaks[i])
    plan.most_demanding = demanding + 1
    try:
        memory = preflight(probes[demanding], model_dir, force=force, session=session, machine=machine)  # type: ignore[arg-type]
    except MemoryPlanError as error:
        raise StoryMemoryError(error.message_with(f"shot {demanding + 1} (the story's most demanding): "),
                               plan=error.plan, hint=error.hint_data, shot=demanding + 1) from None
    except H3BridgeError as error:
        error.reword(f"shot {demanding + 1} (the story's most demanding): ")
        raise
    plan.memory_plan = memory
    plan.model_warnings = list(memory.model_warnings)


class StoryMemoryError(MemoryPlanError):
    """A story's most demanding shot does not fit: the plan's refusal, knowing which shot it is, so
    each host says the fix in its own words (`in_words`)."""

    def __init__(self, message: str, *, plan: object, hint: "str | Fix | None", shot: int) -> None:
        super().__init__(message, plan=plan, hint=hint)
        self.shot = shot

    def in_words(self, *, setting: "Callable[[str, object], str]", everywhere: str, in_shot: str,
                 force: str) -> "StoryMemoryError":
        """This refusal with its fix said by a host: `setting(name, value)` writes one setting
        (`ssd_streaming = true` in a storyboard; the host's renderer of h3bridge.fixes changes),
        `everywhere` / `in_shot` say where settings for every shot / for this shot go ({shot} is
        its number), `force` how to run anyway."""
        plan = self.plan
        suggestion = plan.suggestion if plan is not None else None      # type: ignore[attr-defined]
        message = (f"shot {self.shot} (the story's most demanding): {plan.verdict(None)}"  # type: ignore[attr-defined]
                   if plan is not None else self.message)
        # A story shows no live preview, and a shot's length given in frames replaces its seconds.
        settings = [change for change in (suggestion.settings if suggestion is not None else ())
                    if change.field not in ("preview", "seconds")]
        every_shot = [change for change in settings if change.field != "frames"]
        this_shot = [change for change in settings if change.field == "frames"]
        parts = []
        if every_shot:
            parts.append("set " + ", ".join(setting(change.field, change.value) for change in every_shot)
                         + " " + everywhere)
        if this_shot:
            parts.append("set " + ", ".join(setting(change.field, change.value) for change in this_shot)
                         + " " + in_shot.format(shot=self.shot))
        fix = "; ".join(parts) or "this machine has too little memory for MiniMax-H3 even at the smallest settings"
        return StoryMemoryError(message, plan=plan, hint=f"{fix}; or {force} to try anyway", shot=self.shot)


def _shot_key(request: GenerationRequest, continuation: Continuation, tail: int | None,
              previous_key: str | None, check_files: bool) -> str:
    """A digest of what the shot is made of: its request (and its input files' contents), how it
    continues, and the key of the shot it continues from."""
    def file(path: Path) -> object:
        return {"path": str(path), "sha256": _file_digest(path) if check_files else None}

    fields = request_fields(request, path_value=file)
    fields["frames"], fields["seconds"] = request.frame_count, None     # the same clip however it was said
    description = {"request": fields, "continue": continuation.value, "tail_frames": tail,
                   "after": previous_key}
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()


def _file_digest(path: Path) -> str | None:
    """A shot input's SHA-256; None for what is not a readable regular file (a FIFO or a device is
    never opened blocking nor read: validation says what is wrong with it)."""
    try:
        return sha256_regular(path, not_regular)
    except OSError:
        return None


__all__ = ["PlannedShot", "StoryMemoryError", "StoryPlan", "continued_request", "plan_story", "tail_frames"]
