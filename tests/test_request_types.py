"""Wrong types in a GenerationRequest or a Reference (issue 9 item 5): every one is a
RequestError naming the field and the type it wants, never a plain TypeError from deep inside
validation."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3bridge import GenerationRequest, Reference, ReferenceImageSize, ReferenceKind, RequestError, SlowerPath

MISSING = Path("/nonexistent/h3bridge-fuzz/input.png")

# Values of every shape a caller (a host, a JSON body, a typo) may pass for any field.
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=True),
    st.text(max_size=8), st.binary(max_size=8), st.just(MISSING), st.just(str(MISSING)),
    st.sampled_from(list(ReferenceKind) + list(SlowerPath) + list(ReferenceImageSize)),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.frozensets(st.sampled_from(list(SlowerPath)), max_size=2), st.just(object()),
)
REFERENCE = st.builds(Reference, kind=st.one_of(st.sampled_from(list(ReferenceKind)), ANY_VALUE),
                      path=st.one_of(st.just(MISSING), ANY_VALUE),
                      audio_path=st.one_of(st.none(), st.just(MISSING), ANY_VALUE))
REQUEST_FIELDS = [f.name for f in dataclasses.fields(GenerationRequest)]


@st.composite
def fuzzed_requests(draw: st.DrawFn) -> GenerationRequest:
    changed = draw(st.lists(st.sampled_from(REQUEST_FIELDS), min_size=1, max_size=3, unique=True))
    values: dict[str, object] = {"prompt": "a fox"}
    for name in changed:
        if name == "references":
            values[name] = draw(st.one_of(ANY_VALUE, st.tuples(REFERENCE), st.lists(REFERENCE, max_size=2)))
        else:
            values[name] = draw(ANY_VALUE)
    return GenerationRequest(**values)  # type: ignore[arg-type]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzzed_requests(), st.booleans())
def test_a_request_of_any_types_validates_or_raises_request_error(request: GenerationRequest,
                                                                  check_files: bool) -> None:
    try:
        request.validate(check_files=check_files)
    except RequestError as error:
        assert error.field is not None, str(error)


@pytest.mark.parametrize(("changes", "field", "wanted"), [
    ({"prompt": 5}, "prompt", "must be text (a str)"),
    ({"first_frame": 5}, "first_frame", "file path"),
    ({"last_frame": b"x.png"}, "last_frame", "file path"),
    ({"references": None}, "references", "tuple of Reference"),
    ({"slower_paths": None}, "slower_paths", "set of SlowerPath"),
    ({"references": (Reference(ReferenceKind.IMAGE, 5),)}, "references", "file path"),  # type: ignore[arg-type]
    ({"references": (Reference(ReferenceKind.VIDEO_AUDIO, MISSING, 7),)}, "references", "file path"),  # type: ignore[arg-type]
    ({"ssd_streaming": "no"}, "ssd_streaming", "True or False"),
    ({"render_width": 3.5, "render_height": 32}, "render_width", "whole number"),
    ({"reference_image_size": 1}, "reference_image_size", "match or max"),
])
def test_each_wrong_type_names_its_field_and_the_type_it_wants(changes: dict[str, object], field: str,
                                                               wanted: str) -> None:
    request = GenerationRequest(**{"prompt": "a fox", **changes})  # type: ignore[arg-type]
    for check_files in (False, True):
        with pytest.raises(RequestError) as caught:
            request.validate(check_files=check_files)
        assert caught.value.field == field and wanted in str(caught.value), str(caught.value)
