"""The cheapest change that makes a request fit: each knob's options in cost order, searched
forward then relaxed backward. A suggestion is request fields and values (h3bridge.fixes),
which each interface says in its own words."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import RequestError
from ...fixes import Change
from ...geometry import CANVAS_MULTIPLE, legal_frame_counts
from ...request import MIN_LAYERS, GenerationRequest
from .machine import MachineFacts
from .sizes import ModelSizes
from .phases import _build_phases


def _render_canvas_options(request: GenerationRequest) -> list[tuple[int, int]]:
    """Same-aspect multiples of 32 no larger than the output (h3.c h3_valid_params), smaller than now,
    largest first."""
    width, height = request.width, request.height
    current = (request.render_width or width) * (request.render_height or height)
    options = [(w, w * height // width) for w in range(CANVAS_MULTIPLE, width + 1, CANVAS_MULTIPLE)
               if (w * height) % width == 0 and (w * height // width) % CANVAS_MULTIPLE == 0]
    return sorted([o for o in options if o[0] * o[1] < current], key=lambda o: -o[0] * o[1])


@dataclass(frozen=True)
class Option:
    """One step of one knob: what it costs, said in prose (`change`), the fields it sets
    (`updates`, a request's), and whether the live preview goes."""

    change: str
    updates: tuple[tuple[str, object], ...] = ()
    preview_off: bool = False


@dataclass(frozen=True)
class Suggestion:
    """The cheapest change that fits: `changes` says it in prose ("SSD streaming", "40 layers"),
    `settings` as the fields to set (h3bridge.fixes.Change, in the request vocabulary, `preview`
    False when the live preview has to go), which each interface says in its own words."""

    changes: tuple[str, ...]               # human-readable, in the order applied
    settings: tuple[Change, ...]           # the fields that make the change, in the same order
    request: GenerationRequest
    preview: bool
    peak: int


def _stages(request: GenerationRequest, preview: bool) -> list[list[Option]]:
    """Each knob's options, mildest first, cheapest knob first: a display-only loss (preview),
    then speed (SSD streaming), then quality (layers, render canvas), then length (frames)."""
    stages: list[list[Option]] = []
    if preview:
        stages.append([Option("no live preview", preview_off=True)])
    if not request.ssd_streaming:
        # h3.c h3_valid_params: SSD streaming excludes the int8 row-wise FC2
        stages.append([Option("SSD streaming", (("ssd_streaming", True), ("int8_row_fc2", False)))])
    stages.append([Option(f"{n} layers", (("layers", n),))
                   for n in range(request.layers - 1, MIN_LAYERS - 1, -1)])
    stages.append([Option(f"render canvas {w}x{h}", (("render_width", w), ("render_height", h)))
                   for w, h in _render_canvas_options(request)])
    stages.append([Option(f"{n} frames", (("frames", n), ("seconds", None)))
                   for n in sorted(legal_frame_counts(), reverse=True) if n < request.frame_count])
    return [stage for stage in stages if stage]


def _settings(request: GenerationRequest, used: list[Option]) -> tuple[Change, ...]:
    """The fields the used options change, in their order: only those whose value differs from
    the request's (`int8_row_fc2` False is news only when it was on)."""
    settings: list[Change] = []
    for option in used:
        if option.preview_off:
            settings.append(Change("preview", False))
        settings.extend(Change(name, value) for name, value in option.updates if getattr(request, name) != value)
    return tuple(settings)


def _suggest(request: GenerationRequest, preview: bool, sizes: ModelSizes,
             machine: MachineFacts, session: bool = False) -> Suggestion | None:
    """The least costly combination that fits.

    Forward: for each knob in cost order, take its mildest option that fits; if none does, keep
    its strongest option when that lowers the peak (else leave the knob alone) and go on.
    Backward: with the later knobs fixed, relax each earlier knob to its mildest setting (or no
    change) that still fits, so no knob is pushed further than needed."""
    stages = _stages(request, preview)
    choice: list[int | None] = [None] * len(stages)

    def apply(picks: list[int | None]) -> tuple[GenerationRequest, bool, list[Option]]:
        changed, keep_preview, used = request, preview, []
        for stage, pick in zip(stages, picks):
            if pick is not None:
                option = stage[pick]
                changed = changed.with_changes(**dict(option.updates))
                keep_preview = keep_preview and not option.preview_off
                used.append(option)
        return changed, keep_preview, used

    def peak(picks: list[int | None]) -> int | float:
        changed, keep_preview, _ = apply(picks)
        try:
            changed.validate(check_files=False)    # a suggestion must itself pass every check
        except RequestError:
            return math.inf
        return max(p.total for p in _build_phases(changed, keep_preview, sizes, machine, session)[1])

    fitted_at: int | None = None
    for index, stage in enumerate(stages):
        for pick in range(len(stage)):
            choice[index] = pick
            if peak(choice) <= machine.budget:
                fitted_at = index
                break
        if fitted_at is not None:
            break
        strongest = peak(choice)            # choice[index] is the strongest option here
        choice[index] = None
        if strongest < peak(choice):
            choice[index] = len(stage) - 1
    if fitted_at is None:
        return None
    for index in range(fitted_at - 1, -1, -1):
        if choice[index] is None:
            continue
        for pick in [None, *range(len(stages[index]))]:
            trial = list(choice)
            trial[index] = pick
            if peak(trial) <= machine.budget:
                choice = trial
                break
    changed, keep_preview, used = apply(choice)
    return Suggestion(tuple(o.change for o in used), _settings(request, used), changed, keep_preview,
                      peak(choice))
