"""A storyboard: chained shots, read from a human-written TOML file or built in Python.

The TOML file's top-level keys are the story's defaults, named as `GenerationRequest`'s own
fields (`width`, `height`, `steps`, `preset`, `seed`, ...), plus the story's own settings
(`tail_seconds`, `crossfade_frames`, `crossfade_cuts`); every `[[shot]]` table is one shot and
may set any of the same keys for itself:

    width = 512
    height = 288
    preset = "preview"
    seed = 7

    [[shot]]
    prompt = "A lighthouse at dusk, waves breaking"
    seconds = 5

    [[shot]]
    prompt = "The camera climbs the lighthouse stairs"
    seconds = 5
    continue = "anchor"        # the last frame of shot 1 is this shot's first frame

Nothing here runs an engine: `story.plan` checks every shot before the first one starts.
"""
from __future__ import annotations

import enum
import hashlib
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from ..errors import RequestError
from ..request import DEFAULT_SEED, GenerationRequest, Reference, ReferenceImageSize, ReferenceKind, SlowerPath
from ..vocabulary import with_current_keys

DEFAULT_TAIL_SECONDS = 2.0        # the default; see plan.tail_frames for the frames it becomes
MIN_TAIL_SECONDS, MAX_TAIL_SECONDS = 2.0, 15.0   # upstream's reference audio limits (h3_ffmpeg.c, h3.c)
DEFAULT_CROSSFADE_FRAMES = 4


class Continuation(str, enum.Enum):
    """How a shot follows the one before it."""

    ANCHOR = "anchor"   # the previous shot's exact last frame is this shot's first frame (FL2VA)
    TAIL = "tail"       # the previous shot's last seconds, with audio, are a Ref2VA reference video
    CUT = "cut"         # independent


# Request fields a story or a shot may set (the continuation inputs are the runner's).
REQUEST_KEYS = tuple(f.name for f in fields(GenerationRequest) if f.name not in ("prompt", "references"))
PATH_KEYS = ("first_frame", "last_frame")
STORY_KEYS = ("tail_seconds", "crossfade_frames", "crossfade_cuts", "title")
SHOT_KEYS = ("prompt", "continue", "tail_seconds", "references", "preset", *REQUEST_KEYS)


@dataclass(frozen=True)
class Shot:
    """One shot. `settings` are request fields for this shot only (over the story's defaults)."""

    prompt: str
    continuation: Continuation = Continuation.CUT
    settings: Mapping[str, Any] = field(default_factory=dict)
    references: tuple[Reference, ...] = ()
    tail_seconds: float | None = None        # None: the story's


@dataclass(frozen=True)
class Storyboard:
    shots: tuple[Shot, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)   # request fields (and `preset`) for every shot
    tail_seconds: float = DEFAULT_TAIL_SECONDS
    crossfade_frames: int = DEFAULT_CROSSFADE_FRAMES   # audio crossfade at each join, in frames' worth
    crossfade_cuts: bool = True                        # False: hard audio joins at `cut`s
    title: str = ""

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_toml(cls, path: str | Path) -> "Storyboard":
        """Read a storyboard file; relative media paths are relative to the file's folder."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise RequestError(f"cannot read the storyboard {str(path)!r}: {error.strerror or error}",
                               field="storyboard", hint="check the path") from None
        except UnicodeDecodeError:
            raise RequestError(f"the storyboard {str(path)!r} is not UTF-8 text", field="storyboard",
                               hint="save it as UTF-8") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise RequestError(f"the storyboard {str(path)!r} is not valid TOML: {error}", field="storyboard",
                               hint="fix the TOML syntax at the place named") from None
        return cls.from_dict(data, base_dir=path.parent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: str | Path = ".") -> "Storyboard":
        """The TOML structure as Python values: top-level defaults and a `shot` list of tables."""
        base = Path(base_dir)
        shots_data = data.get("shot")
        if not isinstance(shots_data, list) or not shots_data or not all(isinstance(s, dict) for s in shots_data):
            raise RequestError("the storyboard has no shots", field="shot",
                               hint='add one [[shot]] table per shot, each with a prompt = "..."')
        defaults = {}
        data = with_current_keys(data, "the storyboard's top level")     # use_int8_row_fc2 -> int8_row_fc2
        for key, value in data.items():
            if key == "shot" or key in STORY_KEYS:
                continue
            if key not in REQUEST_KEYS and key != "preset":
                raise _unknown_key(key, "the storyboard's top level", (*STORY_KEYS, "preset", *REQUEST_KEYS))
            defaults[key] = _resolve(key, value, base)
        shots = tuple(_shot_from_dict(index, table, base) for index, table in enumerate(shots_data, 1))
        story = cls(shots=shots, defaults=defaults,
                    tail_seconds=data.get("tail_seconds", DEFAULT_TAIL_SECONDS),
                    crossfade_frames=data.get("crossfade_frames", DEFAULT_CROSSFADE_FRAMES),
                    crossfade_cuts=data.get("crossfade_cuts", True), title=data.get("title", ""))
        story.check_story_settings()
        return story

    def check_story_settings(self) -> None:
        """The story's own settings (the shots are checked by story.plan)."""
        if not self.shots:
            raise RequestError("the storyboard has no shots", field="shot", hint="add at least one shot")
        crossfade = self.crossfade_frames
        if isinstance(crossfade, bool) or not isinstance(crossfade, int) or crossfade < 0:
            raise RequestError(f"crossfade_frames={crossfade!r} must be a whole number of frames, 0 or more",
                               field="crossfade_frames", hint="e.g. crossfade_frames=4 (0: hard audio joins)")
        if not isinstance(self.crossfade_cuts, bool):
            raise RequestError(f"crossfade_cuts={self.crossfade_cuts!r} must be true or false",
                               field="crossfade_cuts", hint="use crossfade_cuts=false for hard joins at cuts")
        _check_tail_seconds(self.tail_seconds, "the story")

    # ------------------------------------------------------------------ per shot

    def story_seed(self) -> int:
        seed = self.defaults.get("seed", DEFAULT_SEED)
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else DEFAULT_SEED

    def seed_for(self, index: int) -> int:
        """Shot `index`'s seed (1-based): its own `seed`, else derived from the story's seed and the
        shot's position, so it stays the same when other shots change."""
        own = self.shots[index - 1].settings.get("seed")
        if own is not None:
            return own
        digest = hashlib.sha256(f"h3bridge-story:{self.story_seed()}:{index}".encode()).digest()
        return int.from_bytes(digest[:4], "little")      # 32 bits: short enough to read and retype

    def tail_seconds_for(self, index: int) -> float:
        own = self.shots[index - 1].tail_seconds
        return self.tail_seconds if own is None else own

    def base_request(self, index: int, seed: int | None = None) -> GenerationRequest:
        """Shot `index`'s request without what the previous shot will supply (anchor, tail):
        the story's defaults, then the shot's settings; `preset` first, explicit fields win."""
        shot = self.shots[index - 1]
        values: dict[str, Any] = {**self.defaults, **shot.settings}
        if "frames" in shot.settings and "seconds" not in shot.settings:
            values.pop("seconds", None)        # a shot's own length replaces the story's
        if "seconds" in shot.settings and "frames" not in shot.settings:
            values.pop("frames", None)
        values["seed"] = self.seed_for(index) if seed is None else seed
        preset = values.pop("preset", None)
        try:
            if preset is not None:
                return GenerationRequest.from_preset(preset, shot.prompt, references=shot.references, **values)
            return GenerationRequest(prompt=shot.prompt, references=shot.references, **values)
        except TypeError as error:       # a key the dataclass does not take (checked above; kept safe)
            raise RequestError(f"shot {index}: {error}", field="shot") from None


# ----------------------------------------------------------------------------- parsing helpers

def _unknown_key(key: str, where: str, valid: tuple[str, ...]) -> RequestError:
    import difflib
    close = difflib.get_close_matches(key, valid, n=1)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    return RequestError(f"{where}: unknown key {key!r}", field=key,
                        hint=f"{suggestion}valid keys: {', '.join(valid)}")


def _resolve(key: str, value: Any, base: Path) -> Any:
    """TOML values to request values: paths relative to the storyboard, enums by their names."""
    if key in PATH_KEYS and isinstance(value, str):
        return base / value
    if key == "reference_image_size" and isinstance(value, str):
        try:
            return ReferenceImageSize(value)
        except ValueError:
            raise RequestError(f"reference_image_size={value!r} is not one of "
                               f"{', '.join(s.value for s in ReferenceImageSize)}", field=key,
                               hint='use "match" or "max"') from None
    if key == "slower_paths" and isinstance(value, list):
        try:
            return frozenset(SlowerPath(item) for item in value)
        except ValueError:
            raise RequestError(f"slower_paths={value!r}: use names of h3's --use-slower-* flags", field=key,
                               hint=f"one or more of: {', '.join(s.value for s in SlowerPath)}") from None
    return value


def _check_tail_seconds(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not \
            MIN_TAIL_SECONDS <= value <= MAX_TAIL_SECONDS:
        raise RequestError(f"{where}: tail_seconds={value!r} must be a number of seconds from "
                           f"{MIN_TAIL_SECONDS:g} to {MAX_TAIL_SECONDS:g} (upstream's reference audio limits)",
                           field="tail_seconds", hint=f"e.g. tail_seconds={DEFAULT_TAIL_SECONDS:g}")


def _references(index: int, value: Any, base: Path) -> tuple[Reference, ...]:
    kinds = ", ".join(k.value for k in ReferenceKind)
    if not isinstance(value, list):
        raise RequestError(f"shot {index}: references must be a list of tables", field="references",
                           hint='e.g. references = [{ kind = "image", path = "hero.png" }]')
    references = []
    for number, item in enumerate(value, 1):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise RequestError(f"shot {index}: reference {number} needs a kind and a path", field="references",
                               hint='e.g. { kind = "image", path = "hero.png" }')
        try:
            kind = ReferenceKind(item.get("kind"))
        except ValueError:
            raise RequestError(f"shot {index}: reference {number}: kind={item.get('kind')!r} is not one of {kinds}",
                               field="references", hint=f"use one of: {kinds}") from None
        audio = item.get("audio")
        references.append(Reference(kind, base / item["path"], None if audio is None else base / str(audio)))
    return tuple(references)


def _shot_from_dict(index: int, table: Mapping[str, Any], base: Path) -> Shot:
    table = with_current_keys(table, f"shot {index}")
    for key in table:
        if key not in SHOT_KEYS:
            raise _unknown_key(key, f"shot {index}", SHOT_KEYS)
    prompt = table.get("prompt")
    if not isinstance(prompt, str):
        raise RequestError(f"shot {index} has no prompt", field="prompt", hint='add prompt = "..." to the shot')
    try:
        continuation = Continuation(table.get("continue", Continuation.CUT.value))
    except ValueError:
        raise RequestError(f"shot {index}: continue={table.get('continue')!r} is not one of "
                           f"{', '.join(c.value for c in Continuation)}", field="continue",
                           hint='use continue = "anchor", "tail" or "cut"') from None
    settings = {key: _resolve(key, value, base) for key, value in table.items()
                if key in REQUEST_KEYS or key == "preset"}
    tail = table.get("tail_seconds")
    if tail is not None:
        _check_tail_seconds(tail, f"shot {index}")
    references = _references(index, table["references"], base) if "references" in table else ()
    return Shot(prompt=prompt, continuation=continuation, settings=settings, references=references,
                tail_seconds=tail)


__all__ = ["Continuation", "Shot", "Storyboard", "DEFAULT_TAIL_SECONDS", "DEFAULT_CROSSFADE_FRAMES"]
