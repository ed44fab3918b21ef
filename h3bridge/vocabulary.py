"""One name for each of h3's optional engine paths in every interface (issue 20): the library's
GenerationRequest field is the name, storyboards and the server's JSON use it as is, the CLI
with dashes (`int8_row_fc2` / `--int8-row-fc2`), ComfyUI nodes as their input's name.

The spellings used before (the server's `use_int8_row_fc2`, taken from h3's own
`--use-int8-row-fc2` flag) are still accepted for now, with a DeprecationWarning naming the new
one. h3's own flags and libh3's struct fields are upstream's and keep upstream's names.
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping

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


__all__ = ["RENAMED_KEYS", "renamed_notice", "warn_renamed", "with_current_keys"]
