from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from h3bridge.errors import RequestError
from h3bridge.prompt import SECTION_LABELS, StructuredPrompt, clean_prompt_text, truncate_utf8


def test_structured_prompt_matches_upstream_readme_layout() -> None:
    # The example from upstream README.md section 6, field by field.
    prompt = StructuredPrompt(
        scene="a single red fox in a snow-covered pine forest at dawn.",
        action="the fox walks steadily left to right and looks toward the camera once.",
        camera="medium-height lateral tracking shot, 50 mm lens, stable framing.",
        look="photorealistic fur, cold blue ambient light, warm sunrise rim light.",
        audio="soft footsteps in snow, light wind through pine branches, no music.",
    )
    assert prompt.render() == (
        "Scene: a single red fox in a snow-covered pine forest at dawn.\n"
        "Action: the fox walks steadily left to right and looks toward the camera once.\n"
        "Camera: medium-height lateral tracking shot, 50 mm lens, stable framing.\n"
        "Look: photorealistic fur, cold blue ambient light, warm sunrise rim light.\n"
        "Audio: soft footsteps in snow, light wind through pine branches, no music."
    )
    assert SECTION_LABELS == ("Scene", "Action", "Camera", "Look", "Audio")


def test_structured_prompt_skips_empty_sections_and_flattens_newlines() -> None:
    prompt = StructuredPrompt(scene="  a fox \n\n in snow  ", audio="\twind ")
    assert prompt.render() == "Scene: a fox in snow\nAudio: wind"


def test_structured_prompt_all_empty_is_a_request_error() -> None:
    with pytest.raises(RequestError) as info:
        StructuredPrompt(scene="  ", action="\n").render()
    assert info.value.field == "prompt"
    assert "Scene" in (info.value.hint or "")


def test_clean_prompt_trims_collapses_and_normalises() -> None:
    raw = "\n\n  A fox\u00a0\u00a0runs.   \r\n\r\n\r\n\tSnow falls.\t \n\n\n"
    assert clean_prompt_text(raw) == "A fox runs.\n\nSnow falls."


def test_clean_prompt_nfc_normalises_combining_marks() -> None:
    assert clean_prompt_text("cafe\u0301") == "caf\u00e9"


def test_length_cap_never_splits_a_character_and_prefers_word_boundary() -> None:
    text = "snow snow \u00e9\u00e9\u00e9"       # each é is 2 bytes
    assert truncate_utf8(text, 12) == "snow snow"  # 12 bytes ends inside the é-word
    assert truncate_utf8("\u00e9\u00e9\u00e9", 3) == "\u00e9"
    assert clean_prompt_text("a fox runs", max_bytes=100) == "a fox runs"


def test_length_cap_must_be_positive() -> None:
    with pytest.raises(RequestError):
        clean_prompt_text("x", max_bytes=0)


@given(st.text(max_size=200), st.integers(min_value=1, max_value=120))
def test_clean_prompt_properties(text: str, cap: int) -> None:
    cleaned = clean_prompt_text(text, max_bytes=cap)
    assert len(cleaned.encode("utf-8")) <= cap
    assert "\n\n\n" not in cleaned
    assert all(line == line.strip() for line in cleaned.split("\n"))
    # Cleaning is idempotent: a cleaned prompt is already clean.
    assert clean_prompt_text(cleaned, max_bytes=cap) == cleaned
