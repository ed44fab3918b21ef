"""Fixes as data: what a message tells its user to change, as (field, value) pairs in the request
vocabulary, so that each interface says it in its own words without rewriting prose.

The library never spells a fix the way one interface does (`--ssd-streaming` is the CLI's,
`ssd_streaming = true` a storyboard's, the `ssd_streaming` input ComfyUI's). A message that
suggests a setting carries a `Fix`: prose with one `{}` per group of `Change`s. Each interface has
ONE renderer, a `Words` (a group of changes -> text), and says the fix with `fix.say(words)`:

  CLI          h3bridge.cli.engine.cli_words   --width 640 --force
  HTTP         h3bridge.wire.videos.http_words "width": 640
  ComfyUI      h3bridge.comfy.adapter.node_words
  storyboard   h3bridge.cli.story.storyboard_words  width = 640
  Python       python_words (here)             width=640, force=True

An error's `hint` is its fix in Python's words (`H3BridgeError(hint=Fix(...))`), and the error
keeps the `Fix` as `.fix` for the other interfaces.

Field names are GenerationRequest's (request.request_fields), plus the settings that live beside
a request in every interface: `preview` (the live preview), `force` (run although a check says
no), `overwrite` (replace an existing output), `model_dir`, `engine_path`, `library_path`.
A value of None means "leave the setting out" (the default). A `references` change whose value
is a ReferenceKind stands for "a reference of that kind" (each interface has its own way to add one).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Sequence

# The settings beside a request that a fix may name (every interface has each of them).
SETTINGS_BESIDE_A_REQUEST: tuple[str, ...] = ("preview", "force", "overwrite", "model_dir", "engine_path",
                                              "library_path")


@dataclass(frozen=True)
class Change:
    """Set `field` to `value` (None: leave it out)."""

    field: str
    value: object


@dataclass(frozen=True)
class Blank:
    """A value its user fills in (a path): said as its name in every interface (`--model-dir DIR`,
    `model_dir=DIR`)."""

    name: str

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


Words = Callable[[Sequence[Change]], str]
"""One interface's way to say a group of changes (one renderer per interface)."""


@dataclass(frozen=True)
class Fix:
    """A hint that names settings: `text` with one `{}` per group in `groups`, e.g.
    Fix("use {} (or pass {} to try anyway)", ((Change("ssd_streaming", True),), (Change("force", True),)))."""

    text: str
    groups: tuple[tuple[Change, ...], ...] = ()

    def say(self, words: Words) -> str:
        """The fix in one interface's words."""
        return self.text.format(*(words(group) for group in self.groups))

    @property
    def changes(self) -> tuple[Change, ...]:
        return tuple(change for group in self.groups for change in group)


def literal(text: str) -> str:
    """`text` as a part of a Fix's text, shown as it is (its braces are not placeholders)."""
    return text.replace("{", "{{").replace("}", "}}")


def changes(**settings: object) -> tuple[Change, ...]:
    """`changes(width=640, force=True)`: a group, in the order given."""
    return tuple(Change(name, value) for name, value in settings.items())


def python_word(change: Change) -> str:
    """One change as Python takes it: `width=640`, `force=True`; a `references` change names a
    reference of one kind (a ReferenceKind): `a silent_video reference`."""
    value = change.value
    if change.field == "references" and isinstance(value, enum.Enum):
        return f"{'an' if str(value.value)[0] in 'aeiou' else 'a'} {value.value} reference"
    if isinstance(value, enum.Enum):
        return f"{change.field}={type(value).__name__}.{value.name}"
    return f"{change.field}={value!r}"


def python_words(group: Sequence[Change]) -> str:
    """Keyword arguments, as GenerationRequest / plan_memory / preflight take them: `width=640, force=True`."""
    return ", ".join(python_word(change) for change in group)


__all__ = ["Blank", "Change", "Fix", "literal", "SETTINGS_BESIDE_A_REQUEST", "Words", "changes", "python_word", "python_words"]
