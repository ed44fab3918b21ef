"""One name for each concept in every interface.

The engine choice (issue 30): `one-shot`, `session`, `library` or `remote` (EngineKind), spelled so
in the CLI's `--engine`, `serve --engine`, ComfyUI's engine mode, the server's notes and the Python
API; the older spellings (`cli`, `oneshot`, `warm session`, the `--session` / `--one-shot` flags)
still work, with a one-line notice naming the current one.

h3's optional engine paths (issue 20): the library's GenerationRequest field is the name,
storyboards and the server's JSON use it as is, the CLI with dashes (`int8_row_fc2` /
`--int8-row-fc2`), ComfyUI nodes as their input's name.

The spellings used before (the server's `use_int8_row_fc2`, taken from h3's own
`--use-int8-row-fc2` flag) are still accepted for now, with a DeprecationWarning naming the new
one. h3's own flags and libh3's struct fields are upstream's and keep upstream's names.
"""
from __future__ import annotations

import warnings
from enum import Enum
from typing import Any, Mapping


class EngineKind(str, Enum):
    """How a clip is rendered. The value is the one spelling every interface shows."""

    ONE_SHOT = "one-shot"   # a fresh h3 process per clip: loads the model every time, takes every request
    SESSION = "session"     # h3's interactive mode kept warm between clips (a one-line prompt, no references)
    LIBRARY = "library"     # libh3 in a warm worker process: exact frames and denoise previews
    REMOTE = "remote"       # a Videos API server (`h3bridge serve`, or a peer's) renders it

    def __str__(self) -> str:
        return self.value


ENGINE_KINDS: tuple[str, ...] = tuple(kind.value for kind in EngineKind)

# What each engine kind is, in one line (CLI help, ComfyUI tooltips, docs).
ENGINE_KIND_MEANING: dict[EngineKind, str] = {
    EngineKind.ONE_SHOT: "start h3 afresh for every clip (loads the model each time; takes every request)",
    EngineKind.SESSION: "keep h3's interactive mode warm between clips (the model loads once)",
    EngineKind.LIBRARY: "libh3 in a warm worker (exact frames, a preview after every denoise step)",
    EngineKind.REMOTE: "send the job to a Videos API server (h3bridge serve, vLLM-Omni, SGLang)",
}

# Spellings the interfaces used before issue 30 -> the kind they mean now.
OLD_ENGINE_SPELLINGS: dict[str, EngineKind] = {
    "cli": EngineKind.ONE_SHOT,           # generate/story --engine cli (the h3 program, one-shot unless --session)
    "oneshot": EngineKind.ONE_SHOT,       # serve --engine oneshot
    "one_shot": EngineKind.ONE_SHOT,
    "warm session": EngineKind.SESSION,   # ComfyUI's engine mode
    "warm-session": EngineKind.SESSION,
    "warm_session": EngineKind.SESSION,
}


def read_engine_kind(value: object) -> tuple[EngineKind, str | None]:
    """`value` as an EngineKind, and the old spelling it was given in (None: the current one).
    ValueError naming every current spelling for anything else."""
    if isinstance(value, EngineKind):
        return value, None
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text is not None:
        if text in ENGINE_KINDS:
            return EngineKind(text), None
        if text in OLD_ENGINE_SPELLINGS:
            return OLD_ENGINE_SPELLINGS[text], str(value)
    raise ValueError(f"{value!r} is not an engine; the engines are {', '.join(ENGINE_KINDS)}")

# old key -> the key it is now (storyboards, the server's body fields)
RENAMED_KEYS: dict[str, str] = {
    "use_int8_row_fc2": "int8_row_fc2",
    "use_reference_rope": "reference_rope",
    "use_slower": "slower_paths",
}


def renamed_notice(old: str, new: str, where: str) -> str:
    return f"{where}: {old!r} is now {new!r} (the old spelling still works for now)"


def warn_renamed(old: str, new: str, where: str) -> None:
    """The DeprecationWarning for an old spelling (stacklevel: the caller's caller)."""
    warnings.warn(renamed_notice(old, new, where), DeprecationWarning, stacklevel=3)


def with_current_keys(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`table` with each old key renamed (a DeprecationWarning each); RequestError when a setting
    is given under both names."""
    from .errors import RequestError
    current: dict[str, Any] = {}
    for key, value in table.items():
        new = RENAMED_KEYS.get(key) if isinstance(key, str) else None
        if new is None:
            current[key] = value
            continue
        if new in table:
            raise RequestError(f"{where}: {key!r} and {new!r} are the same setting; give it once", field=new,
                               hint=f"keep {new} and remove {key}")
        warn_renamed(key, new, where)
        current[new] = value
    return current


__all__ = ["ENGINE_KINDS", "ENGINE_KIND_MEANING", "EngineKind", "OLD_ENGINE_SPELLINGS", "RENAMED_KEYS",
           "read_engine_kind", "renamed_notice", "warn_renamed", "with_current_keys"]
