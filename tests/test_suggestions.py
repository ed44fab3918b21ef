"""Every fix h3bridge suggests is itself valid: each suggested value is fed back through the same
checks (the request's rules, then the memory plan) over many canvases, including the ones users
hit (8192x8192, --height 2160 beside the default 864 width)."""
from __future__ import annotations

import re

import pytest

from h3bridge.errors import RequestError
from h3bridge.geometry import MAX_PIXELS
from h3bridge.model.memory import MachineFacts, plan_memory
from h3bridge.request import GenerationRequest

SIDES = (16, 31, 32, 100, 480, 500, 720, 768, 864, 1000, 1080, 1344, 1400, 2000, 2160, 3840, 8192)
CANVASES = sorted({(w, h) for w in SIDES for h in SIDES} | {(8192, 8192), (864, 2160), (3840, 2160)})
_USE = re.compile(r"(\w+)=(\d+)")


def suggested_values(error: RequestError) -> dict[str, int]:
    """The `use name=value [and name=value]` of a refusal's fix (its first alternative)."""
    first = re.split(r" or ", error.hint or "")[0]
    return {name: int(value) for name, value in _USE.findall(first)}


def refusal(request: GenerationRequest) -> RequestError | None:
    try:
        request.validate(check_files=False)
    except RequestError as error:
        return error
    return None


@pytest.mark.parametrize("width,height", CANVASES)
def test_canvas_suggestions_pass_every_check(width: int, height: int) -> None:
    """Following the fixes one at a time reaches a valid canvas, and no fix is refused again: the
    next refusal (if any) is about another field than the one just set."""
    request = GenerationRequest("fox", width=width, height=height)
    for _ in range(3):
        error = refusal(request)
        if error is None:
            assert request.width * request.height <= MAX_PIXELS
            return
        values = suggested_values(error)
        assert values, f"{error.message}: no value suggested ({error.hint})"
        request = request.with_changes(**values)
        again = refusal(request)
        assert again is None or again.field not in values, \
            f"{width}x{height}: {error.hint!r} is refused again: {again.message}"
    pytest.fail(f"{width}x{height}: the fixes never reach a valid canvas")


def test_height_2160_beside_864_suggests_a_canvas_of_its_aspect_that_fits_the_pixel_limit() -> None:
    """864x2160 is over the pixel limit: the advice keeps its aspect (issue 30: a height alone, 864x1184,
    changed a 0.40 canvas into a 0.73 one) and names the limit."""
    error = refusal(GenerationRequest("fox", height=2160))
    assert error is not None and suggested_values(error) == {"width": 640, "height": 1600}   # 0.40, 1,024,000 px
    assert "pixel limit" in error.message
    GenerationRequest("fox", width=640, height=1600).validate(check_files=False)


def test_the_pixel_limit_comes_before_the_memory_plan() -> None:
    """An 8192x8192 canvas was planned, and its memory error suggested a 3200x3200 render canvas,
    itself over the pixel limit."""
    with pytest.raises(RequestError, match="pixel limit") as caught:
        plan_memory(GenerationRequest("fox", width=8192, height=8192), machine=MachineFacts.mac(24))
    assert suggested_values(caught.value) == {"width": 992, "height": 992}


VALID = [(w, h) for w, h in CANVASES if refusal(GenerationRequest("fox", width=w, height=h)) is None]


@pytest.mark.parametrize("gigabytes", [16, 24, 32])
@pytest.mark.parametrize("width,height", VALID + [(1344, 768), (768, 1344), (992, 992)])
def test_memory_suggestions_pass_every_check_and_fit(width: int, height: int, gigabytes: int) -> None:
    machine = MachineFacts.mac(gigabytes)
    request = GenerationRequest("fox", width=width, height=height, frames=362)
    plan = plan_memory(request, machine=machine)
    if plan.fits or plan.suggestion is None:
        return
    suggested = plan.suggestion.request
    assert refusal(suggested) is None, plan.suggestion.flags
    assert suggested.render_width is None or suggested.render_width * suggested.render_height <= MAX_PIXELS
    again = plan_memory(suggested, machine=machine, preview=plan.suggestion.preview)
    assert again.fits, (plan.suggestion.flags, again.verdict())
