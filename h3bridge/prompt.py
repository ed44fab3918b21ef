"""Prompt text for H3: the structured Context-IR-like layout and free-text cleaning.

Upstream README.md "6. Improve the prompt" (8974cc0): "the released system
expects a Context-IR-like description. State the subject, action, setting,
camera, lighting/style, and desired sound", with the example layout

    Scene: ...
    Action: ...
    Camera: ...
    Look: ...
    Audio: ...

`StructuredPrompt` renders exactly those five labelled lines, in that order.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, fields

from .errors import RequestError

# The labels and their order, as in upstream README.md section 6.
SECTION_LABELS: tuple[str, ...] = ("Scene", "Action", "Camera", "Look", "Audio")

_HORIZONTAL_SPACE = re.compile(r"[^\S\n]+")   # any whitespace except newline
_BLANK_RUN = re.compile(r"\n{3,}")


def clean_prompt_text(text: str, *, max_bytes: int | None = None) -> str:
    """Tidy free text without changing its words.

    - Unicode line separators and CRLF become ``\\n``; NFC normalisation so the same
      visible text always tokenises the same way.
    - Tabs, non-breaking and other horizontal spaces collapse to one space; each line
      is stripped at both ends (trailing spaces carry no meaning to the tokenizer).
    - Runs of blank lines collapse to a single blank line; leading/trailing blank
      lines go.
    - `max_bytes` caps the UTF-8 size, cutting only between characters (never inside
      a multi-byte sequence) and preferring the last word boundary.
    """
    if max_bytes is not None and max_bytes < 1:
        raise RequestError(f"prompt length cap must be at least 1 byte, got {max_bytes}",
                           field="max_bytes", hint="use 0/None for no cap, or a positive byte count")
    normalised = unicodedata.normalize("NFC", text)
    normalised = normalised.replace("\r\n", "\n").replace("\r", "\n")
    normalised = normalised.replace("\u2028", "\n").replace("\u2029", "\n\n")
    lines = [_HORIZONTAL_SPACE.sub(" ", line).strip() for line in normalised.split("\n")]
    cleaned = _BLANK_RUN.sub("\n\n", "\n".join(lines)).strip("\n")
    if max_bytes is not None:
        cleaned = truncate_utf8(cleaned, max_bytes)
    return cleaned


def truncate_utf8(text: str, max_bytes: int) -> str:
    """Longest prefix of `text` whose UTF-8 encoding fits `max_bytes`, ending on a word
    boundary when one exists in the kept part; never splits a character."""
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    # errors="ignore" drops the partial trailing sequence left by a byte cut.
    prefix = encoded[:max_bytes].decode("utf-8", errors="ignore")
    cut_inside_word = not text[len(prefix)].isspace()
    if cut_inside_word:
        boundary = max(prefix.rfind(" "), prefix.rfind("\n"))
        if boundary > 0:
            prefix = prefix[:boundary]
    return prefix.rstrip()


@dataclass(frozen=True)
class StructuredPrompt:
    """The five sections upstream's README recommends; empty ones are left out."""

    scene: str = ""
    action: str = ""
    camera: str = ""
    look: str = ""
    audio: str = ""

    def render(self, *, max_bytes: int | None = None) -> str:
        lines = []
        for label, section in zip(SECTION_LABELS, fields(self)):
            # One line per section: the layout is line-oriented, so inner newlines
            # would read as a new unlabeled section.
            value = " ".join(clean_prompt_text(getattr(self, section.name)).split())
            if value:
                lines.append(f"{label}: {value}")
        if not lines:
            raise RequestError("the structured prompt is empty",
                               field="prompt", hint="fill in at least the Scene or Action field")
        return clean_prompt_text("\n".join(lines), max_bytes=max_bytes)
