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
no), `overwrite` (replace an existing output), `model_dir`, `engine_path`, `library_path`, `preset`
(a named set of quality settings, request.PRESETS), `engine` (a vocabulary.EngineKind: which engine
runs). A few commands' own settings are named the same way (`rounding` of a LoRA fold, `verbose`
of a model check).
A value of None means "leave the setting out" (the default). A `Given` names a setting as the
request gave it (the subject of a message, not a suggestion). A `references` change whose value
is a ReferenceKind stands for "a reference of that kind" (each interface has its own way to add one).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Sequence

# The settings beside a request that a fix may name (every interface has each of them).
SETTINGS_BESIDE_A_REQUEST: tuple[str, ...] = ("preview", "force", "overwrite", "model_dir", "engine_path",
                                              "library_path", "preset", "engine")

# An `engine` change's value (a vocabulary.EngineKind) as Python builds that engine.
_PYTHON_ENGINE = {"one-shot": "OneShotEngine", "session": "SessionEngine", "library": "LibraryEngine",
                  "remote": "RemoteEngine(URL)"}


@dataclass(frozen=True)
class Change:
    """Set `field` to `value` (None: leave it out)."""

    field: str
    value: object


@dataclass(frozen=True)
class Given(Change):
    """A setting as the request gave it, named in a message rather than suggested
    (`frames=23 is not a legal H3 length`): `value` is the value as the message shows it (text, so
    `1.5` stays `1.5`), or None to name the setting alone (`ssd_streaming cannot be combined with
    ...`). Each interface names it its own way: `--frames 23`, `frames = 23`, `frames=23`."""

    value: str | None = None


def given(field: str, shown: object = None) -> tuple[Given, ...]:
    """A group of one Given: the setting `field`, as the message shows it (`shown`, made text)."""
    return (Given(field, None if shown is None else str(shown)),)


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


def joined(*parts: "str | Fix") -> "str | Fix":
    """Text and fixes one after another, as one Fix (plain text when no part is a Fix): a warning
    that ends with a problem's fix, a message with words put before it."""
    if not any(isinstance(part, Fix) for part in parts):
        return "".join(parts)      # type: ignore[arg-type]
    text, groups = "", ()      # type: tuple[str, tuple[tuple[Change, ...], ...]]
    for part in parts:
        if isinstance(part, Fix):
            text, groups = text + part.text, groups + part.groups
        else:
            text += literal(part)
    return Fix(text, groups)


def said(text: "str | Fix | None", words: Words) -> str | None:
    """`text` in one interface's words: a Fix said with `words`, plain text as it is."""
    return text.say(words) if isinstance(text, Fix) else text


def changes(**settings: object) -> tuple[Change, ...]:
    """`changes(width=640, force=True)`: a group, in the order given."""
    return tuple(Change(name, value) for name, value in settings.items())


def python_word(change: Change) -> str:
    """One change as Python takes it: `width=640`, `force=True`; a `references` change names a
    reference of one kind (a ReferenceKind): `a silent_video reference`."""
    value = change.value
    if isinstance(change, Given):
        return change.field if value is None else f"{change.field}={value}"
    if change.field == "engine":      # an engine is an object in Python: its class
        return _PYTHON_ENGINE.get(str(getattr(value, "value", value)), str(value))
    if change.field == "preset":      # a preset is a way to build the request, not one of its fields
        return f"GenerationRequest.from_preset({value!r}, prompt)"
    if change.field == "references" and isinstance(value, enum.Enum):
        return f"{'an' if str(value.value)[0] in 'aeiou' else 'a'} {value.value} reference"
    if isinstance(value, enum.Enum):
        return f"{change.field}={type(value).__name__}.{value.name}"
    return f"{change.field}={value!r}"


def python_words(group: Sequence[Change]) -> str:
    """Keyword arguments, as GenerationRequest / plan_memory / preflight take them: `width=640, force=True`."""
    return ", ".join(python_word(change) for change in group)


__all__ = ["Blank", "Change", "Fix", "Given", "given", "joined", "literal", "said", "SETTINGS_BESIDE_A_REQUEST", "Words",
           "changes", "python_word", "python_words"]
