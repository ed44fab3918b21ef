"""Shots as plain text, one shot per block (for hosts with a text box, the ComfyUI node):

    [5s]
    A lighthouse at dusk, waves breaking below

    [5s anchor]
    The camera climbs the lighthouse's spiral stairs

    [8s tail seed=12]
    The lamp turns over a stormy sea

Blocks are separated by blank lines. A block may start with a bracketed line of settings:
`5s` / `2.5s` (seconds), `56f` (frames), `anchor` / `tail` / `cut`, and `key=value` for any
storyboard shot key (`seed=12`, `tail_seconds=3`, `steps=8`). The other lines are the prompt,
joined with spaces into one line (h3's warm session reads one line per prompt).
"""
from __future__ import annotations

import re
import tomllib
from typing import Any, Mapping

from ..errors import RequestError
from .storyboard import Continuation, Storyboard

_LENGTH = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>s|f)$")


def _value(text: str) -> Any:
    """A `key=value` value as TOML reads it (numbers, true/false, "text"), else the bare text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _settings(block: int, line: str) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for token in line.split():
        length = _LENGTH.match(token)
        if length:
            number = float(length["number"])
            if length["unit"] == "s":
                settings["seconds"] = number
            elif number.is_integer():
                settings["frames"] = int(number)
            else:
                raise RequestError(f"shot {block}: {token!r}: frames must be a whole number", field="shots",
                                   hint="e.g. [56f], or seconds as [2.5s]")
        elif token in {c.value for c in Continuation}:
            settings["continue"] = token
        elif "=" in token:
            key, _, value = token.partition("=")
            settings[key] = _value(value)
        else:
            raise RequestError(f"shot {block}: {token!r} in [{line}] is not a length, a continuation or key=value",
                               field="shots", hint="e.g. [5s anchor seed=3]: 5s or 56f, anchor/tail/cut, key=value")
    return settings


def storyboard_from_text(text: str, defaults: Mapping[str, Any] | None = None) -> Storyboard:
    """The shots in `text` (see the module docstring) over the story's `defaults`."""
    blocks = [block.strip() for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if block.strip()]
    shots = []
    for number, block in enumerate(blocks, 1):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        settings: dict[str, Any] = {}
        if lines[0].startswith("[") and lines[0].endswith("]"):
            settings = _settings(number, lines[0][1:-1])
            lines = lines[1:]
        if not lines:
            raise RequestError(f"shot {number} has settings but no prompt", field="shots",
                               hint="write the prompt on the lines after [...]")
        shots.append({**settings, "prompt": " ".join(lines)})
    data = dict(defaults or {})
    data["shot"] = shots
    return Storyboard.from_dict(data)


__all__ = ["storyboard_from_text"]
