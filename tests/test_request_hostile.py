"""Hostile values in a GenerationRequest (issue 19 item 7, the request half): numbers too big to
print or to turn into a float, values whose repr raises, a preset that is not text, settings that
do not exist. Every one is a RequestError naming the field, never a TypeError, ValueError or
OverflowError from inside validation; and a prompt longer than h3 can take is refused up front."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3bridge import GenerationRequest, RequestError
from h3bridge.errors import shown_value
from h3bridge.request import MAX_PROMPT_BYTES, PRESETS



class Unprintable:
    """A caller's object whose repr raises (2.9 % of the campaign's fuzzed requests had one)."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class UnprintablePath:
    """A PathLike whose __fspath__ and repr raise."""

    def __fspath__(self) -> str:
        raise RuntimeError("no path for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


HUGE = 10**5000                       # str() refuses it: "Exceeds the limit (4300 digits)"
NUMBER_FIELDS = ["width", "height", "frames", "seconds", "steps", "seed", "reuse", "layers", "core_reuse"]


def refused(call) -> RequestError:
    with pytest.raises(RequestError) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("name", NUMBER_FIELDS)
@pytest.mark.parametrize("value", [HUGE, -HUGE, 32 * 10**310, 10**400 + 1], ids=["5001 digits", "negative",
                                                                               "32e310", "401 digits"])
def test_numbers_of_any_size_are_refused_naming_the_field(name: str, value: int) -> None:
    error = refused(lambda: GenerationRequest("a fox", **{name: value}).validate(check_files=False))
    # An over-cap canvas is one rule about both sides, named by width; its hint sets both.
    over_cap = name == "height" and value > 0 and value % 32 == 0
    assert error.field == ("width" if over_cap else name), str(error)
    assert "digit number" in error.message, error.message


@pytest.mark.parametrize(("changes", "field"), [pytest.param(*case, id=f"case{i}") for i, case in enumerate([
    ({"width": 32 * 10**310}, "width"),                   # OverflowError in largest_canvas_like
    ({"height": 10**400 * 32}, "width"),                  # the canvas rule names width (its hint sets both)
    ({"width": 10**400 * 32, "height": 10**400 * 32}, "width"),
    ({"render_width": 10**5000, "render_height": 32}, "render_width"),
    ({"token_reduction": HUGE}, "token_reduction"),       # ValueError "Exceeds the limit (4300 digits)"
    ({"slower_paths": [HUGE]}, "slower_paths"),
    ({"references": [HUGE]}, "references"),
    ({"first_frame": HUGE}, "first_frame"),
])])
def test_the_campaigns_numbers_name_their_field(changes: dict[str, object], field: str) -> None:
    for check_files in (False, True):
        error = refused(lambda: GenerationRequest("a fox", **changes).validate(check_files=check_files))
        assert error.field == field, str(error)


def test_a_canvas_too_large_for_a_float_gets_a_valid_suggestion() -> None:
    error = refused(lambda: GenerationRequest("a fox", width=32 * 10**310, height=480).validate(check_files=False))
    suggested = dict(re.findall(r"(width|height)=(\d+)", error.hint or ""))
    GenerationRequest("a fox", width=int(suggested["width"]), height=int(suggested["height"])).validate(
        check_files=False)


@pytest.mark.parametrize("name", ["prompt", "width", "seconds", "token_reduction", "first_frame", "references",
                                  "slower_paths", "reference_image_size", "render_width"])
@pytest.mark.parametrize("value", [Unprintable(), [Unprintable()], UnprintablePath()],
                         ids=["repr raises", "in a list", "fspath raises"])
def test_a_value_whose_repr_raises_is_named_not_printed(name: str, value: object) -> None:
    changes = {name: value} | ({"render_height": 32} if name == "render_width" else {})
    for check_files in (False, True):
        error = refused(lambda: GenerationRequest(**{"prompt": "a fox", **changes}).validate(check_files=check_files))
        assert error.field == name, str(error)


@pytest.mark.parametrize("preset", [["balanced"], {"balanced": 1}, None, 5, HUGE, Unprintable(), "Balanced"],
                         ids=["list", "dict", "None", "int", "huge", "unprintable", "capitalised"])
def test_a_preset_that_is_not_a_presets_name_is_refused(preset: object) -> None:
    error = refused(lambda: GenerationRequest.from_preset(preset, "a fox"))  # type: ignore[arg-type]
    assert error.field == "preset" and "balanced" in (error.hint or "")


def test_settings_by_name_must_exist() -> None:
    error = refused(lambda: GenerationRequest.from_preset("balanced", "a fox", stepz=3))
    assert error.field == "stepz" and "steps" in (error.hint or "")
    error = refused(lambda: GenerationRequest("a fox").with_changes(widht=64))
    assert error.field == "widht" and "width" in (error.hint or "")
    assert GenerationRequest("a fox").with_changes(width=64).width == 64


def test_a_prompt_longer_than_h3_takes_is_refused_before_anything_runs() -> None:
    GenerationRequest("a" * MAX_PROMPT_BYTES).validate(check_files=False)
    error = refused(lambda: GenerationRequest("a" * (MAX_PROMPT_BYTES + 1)).validate(check_files=False))
    assert error.field == "prompt" and f"{MAX_PROMPT_BYTES:,}" in error.message
    # Bytes, not characters: 'é' is two bytes of UTF-8.
    error = refused(lambda: GenerationRequest("é" * (MAX_PROMPT_BYTES // 2 + 1)).validate(check_files=False))
    assert error.field == "prompt"


def test_the_prompt_cap_is_h3s_text_encoder_limit() -> None:
    """MAX_PROMPT_BYTES is (2**32-1) // TEXT_INTERMEDIATE, the token count h3's Qwen text encoder refuses
    past (h3_text_encoder.c at the pinned commit), read from upstream's own source."""
    from upstream_helpers import upstream_source_text_or_skip
    source = upstream_source_text_or_skip("h3_text_encoder.c")
    intermediate = int(re.search(r"TEXT_INTERMEDIATE\s*=\s*(\d+)", source)[1])  # type: ignore[index]
    assert "token_count > UINT32_MAX / TEXT_INTERMEDIATE" in source
    assert MAX_PROMPT_BYTES == (2**32 - 1) // intermediate


def test_shown_value_never_raises_and_stays_short() -> None:
    for value in (HUGE, -HUGE, Unprintable(), [Unprintable()], "x" * 10**6, b"y" * 10**6, [1] * 10**4):
        assert len(shown_value(value)) <= 80
    assert shown_value(HUGE) == "(a 5001-digit number)" and shown_value(-HUGE) == "(a negative 5001-digit number)"
    assert shown_value(2**64 - 1) == "18446744073709551615"


# ----------------------------------------------------------------------------- fuzzing

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=300, max_value=6000).map(lambda digits: 10**digits),
    st.integers(min_value=300, max_value=6000).map(lambda digits: -(10**digits) * 32),
    st.text(max_size=6), st.binary(max_size=4), st.builds(Unprintable), st.builds(UnprintablePath),
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.builds(Unprintable)), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=2), max_leaves=4),
)
FIELDS = [f.name for f in dataclasses.fields(GenerationRequest)]


@st.composite
def hostile_changes(draw: st.DrawFn) -> dict[str, object]:
    names = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True))
    return {name: draw(HOSTILE) for name in names}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=hostile_changes(), preset=st.one_of(st.sampled_from(list(PRESETS)), HOSTILE),
       check_files=st.booleans())
def test_only_request_error_escapes_the_constructors_and_validation(changes: dict[str, object], preset: object,
                                                                   check_files: bool) -> None:
    prompt = changes.pop("prompt", "a fox")
    for build in (lambda: GenerationRequest(prompt, **changes),            # type: ignore[arg-type]
                  lambda: GenerationRequest.from_preset(preset, prompt, **changes),  # type: ignore[arg-type]
                  lambda: GenerationRequest("a fox").with_changes(prompt=prompt, **changes)):
        try:
            build().validate(check_files=check_files)
        except RequestError as error:
            assert error.field is not None, str(error)
            str(error)      # the message itself formats


# ----------------------------------------------------------------------------- input pictures

PEAK_RSS_CHILD = """
import json, resource, sys
from pathlib import Path
from h3bridge import GenerationRequest, Reference, ReferenceKind, RequestError
import h3bridge.media.decode  # noqa: F401  (PyAV loaded before the baseline)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
path = Path(sys.argv[1])
request = (GenerationRequest("a fox", first_frame=path) if sys.argv[2] == "first_frame" else
           GenerationRequest("a fox", references=(Reference(ReferenceKind.IMAGE, path),)))
try:
    request.validate()
    refusal = None
except RequestError as error:
    refusal = {"field": error.field, "message": error.message, "hint": error.hint}
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"refusal": refusal, "grown_mib": grown / 1024}))
"""


def validate_in_child(path: Path, as_field: str) -> dict:
    """Validate a request naming `path` in a fresh Python; its refusal and how much its peak
    RSS grew while validating (Linux ru_maxrss is in KiB)."""
    import json
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_CHILD, str(path), as_field], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def oversized_picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    from core_helpers import make_image
    return make_image(tmp_path_factory.mktemp("big-picture") / "big.png", size="5000x4000")


@pytest.mark.parametrize("as_field", ["first_frame", "references"])
def test_a_picture_over_the_input_limit_is_refused_from_its_header(oversized_picture: Path, as_field: str) -> None:
    """5000x4000 is 20 megapixels, over the 16.8 (4096x4096) an input may hold. Checking it used to
    decode it twice (60 MB of RGB each); now FFmpeg refuses it from its header."""
    from h3bridge.media.decode import MAX_INPUT_PIXELS
    result = validate_in_child(oversized_picture, as_field)
    refusal = result["refusal"]
    assert refusal is not None and refusal["field"] == as_field, result
    assert "5000x4000" in refusal["message"] and f"{MAX_INPUT_PIXELS / 1e6:.1f} megapixels" in refusal["message"]
    assert "scale=4096:4096" in refusal["hint"]
    assert result["grown_mib"] < 40, result        # was 120+ MiB


def test_a_picture_at_the_input_limit_is_accepted(tmp_path: Path) -> None:
    import shutil
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    from core_helpers import make_image
    picture = make_image(tmp_path / "limit.png", size="4096x4096")
    assert validate_in_child(picture, "first_frame")["refusal"] is None


def test_the_same_oversized_picture_twice_is_refused_the_same_way_twice(oversized_picture: Path) -> None:
    """The declared size comes from FFmpeg's message, which PyAV drops when it repeats the last one."""
    for _ in range(3):
        error = refused(lambda: GenerationRequest("a fox", first_frame=oversized_picture).validate())
        assert error.field == "first_frame" and "5000x4000" in error.message, error.message
