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
from ..fixes import Fix, given, literal
from ..safeio.paths import open_regular, symlink_note
from ..geometry import MAX_FRAMES
from ..request import DEFAULT_SEED, PRESETS, GenerationRequest, Reference, ReferenceImageSize, ReferenceKind, SlowerPath
from ..vocabulary import with_current_keys

DEFAULT_TAIL_SECONDS = 2.0        # the default; see plan.tail_frames for the frames it becomes
MIN_TAIL_SECONDS, MAX_TAIL_SECONDS = 2.0, 15.0   # upstream's reference audio limits (h3_ffmpeg.c, h3.c)
DEFAULT_CROSSFADE_FRAMES = 4
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1        # TOML's integers
MAX_STORYBOARD_BYTES = 8 << 20


class Continuation(str, enum.Enum):
    """How a shot follows the one before it."""

    ANCHOR = "anchor"   # the previous shot's exact last frame is this shot's first frame (FL2VA)
    TAIL = "tail"       # the previous shot's last seconds, with audio, are a Ref2VA reference video
    CUT = "cut"         # independent


# Request fields a story or a shot may set (the continuation inputs are the runner's).
REQUEST_KEYS = tuple(f.name for f in fields(GenerationRequest) if f.name not in ("prompt", "references"))
PATH_KEYS = ("first_frame", "last_frame")
STORY_KEYS = ("tail_seconds", "crossfade_frames", "crossfade_cuts", "title", "takes", "background")
SHOT_KEYS = ("prompt", "continue", "tail_seconds", "references", "preset", "takes", *REQUEST_KEYS)
DEFAULT_TAKES = 1


@dataclass(frozen=True)
class Shot:
    """One shot. `settings` are request fields for this shot only (over the story's defaults)."""

    prompt: str
    continuation: Continuation = Continuation.CUT
    settings: Mapping[str, Any] = field(default_factory=dict)
    references: tuple[Reference, ...] = ()
    tail_seconds: float | None = None        # None: the story's
    # Takes of this shot (seeds from the shot's seed upward; the film uses the picked one). None: the story's.
    takes: int | None = None


@dataclass(frozen=True)
class Storyboard:
    shots: tuple[Shot, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)   # request fields (and `preset`) for every shot
    tail_seconds: float = DEFAULT_TAIL_SECONDS
    crossfade_frames: int = DEFAULT_CROSSFADE_FRAMES   # audio crossfade at each join, in frames' worth
    crossfade_cuts: bool = True                        # False: hard audio joins at `cut`s
    title: str = ""
    takes: int = DEFAULT_TAKES                         # takes of every shot that does not say its own
    background: bool = False        # the engine at background priority (engines/priority.py; --background)

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_toml(cls, path: str | Path) -> "Storyboard":
        """Read a storyboard file; relative media paths are relative to the file's folder."""
        path = Path(path)

        def not_a_storyboard(where: Path, kind: str) -> RequestError:
            return RequestError(f"the storyboard {str(where)!r} is {kind}{symlink_note(where)}, not a file",
                                field="storyboard", hint="give the path of a storyboard .toml file")
        try:
            with open_regular(path, not_a_storyboard) as handle:     # a FIFO is never waited on
                raw = handle.read(MAX_STORYBOARD_BYTES + 1)
        except OSError as error:
            raise RequestError(f"cannot read the storyboard {str(path)!r}: {error.strerror or error}",
                               field="storyboard", hint="check the path") from None
        if len(raw) > MAX_STORYBOARD_BYTES:
            raise RequestError(f"the storyboard {str(path)!r} is larger than {MAX_STORYBOARD_BYTES >> 20} MiB; "
                               "a storyboard is a short text file", field="storyboard",
                               hint="give the storyboard's .toml file, not a media file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"the storyboard {str(path)!r} is not UTF-8 text", field="storyboard",
                               hint="save it as UTF-8") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise RequestError(f"the storyboard {str(path)!r} is not valid TOML: {error}", field="storyboard",
                               hint="fix the TOML syntax at the place named") from None
        except ValueError:      # tomllib's int(): more than 4300 digits (TOML integers are 64-bit)
            raise RequestError(f"the storyboard {str(path)!r} holds an integer of thousands of digits; TOML "
                               f"integers are 64-bit ({INT64_MIN} to {INT64_MAX})", field="storyboard",
                               hint="write the number with at most 19 digits") from None
        return cls.from_dict(data, base_dir=path.parent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: str | Path = ".") -> "Storyboard":
        """The TOML structure as Python values: top-level defaults and a `shot` list of tables."""
        base = Path(base_dir)
        if not isinstance(data, Mapping):
            raise RequestError("a storyboard is a table of settings with [[shot]] tables", field="shot",
                               hint='add one [[shot]] table per shot, each with a prompt = "..."')
        _check_integers(data, "")
        shots_data = data.get("shot")
        if not isinstance(shots_data, list) or not shots_data or not all(isinstance(s, dict) for s in shots_data):
            raise RequestError("the storyboard has no shots", field="shot",
                               hint='add one [[shot]] table per shot, each with a prompt = "..."')
        defaults = {}
        data = with_current_keys(data, "the storyboard's top level")     # use_int8_row_fc2 -> int8_row_fc2
        for key, value in data.items():
            if not isinstance(key, str):
                raise _unknown_key(key, "the storyboard's top level", (*STORY_KEYS, "preset", *REQUEST_KEYS))
            if key == "shot" or key in STORY_KEYS:
                continue
            if key not in REQUEST_KEYS and key != "preset":
                raise _unknown_key(key, "the storyboard's top level", (*STORY_KEYS, "preset", *REQUEST_KEYS))
            defaults[key] = _resolve(key, value, base)
        shots = tuple(_shot_from_dict(index, table, base) for index, table in enumerate(shots_data, 1))
        story = cls(shots=shots, defaults=defaults,
                    tail_seconds=data.get("tail_seconds", DEFAULT_TAIL_SECONDS),
                    crossfade_frames=data.get("crossfade_frames", DEFAULT_CROSSFADE_FRAMES),
                    crossfade_cuts=data.get("crossfade_cuts", True), title=data.get("title", ""),
                    takes=data.get("takes", DEFAULT_TAKES), background=data.get("background", False))
        story.check_story_settings()
        return story

    def check_story_settings(self) -> None:
        """The story's own settings (the shots are checked by story.plan)."""
        if not self.shots:
            raise RequestError("the storyboard has no shots", field="shot", hint="add at least one shot")
        crossfade = self.crossfade_frames
        if isinstance(crossfade, bool) or not isinstance(crossfade, int) or not 0 <= crossfade <= MAX_FRAMES:
            # a join's crossfade is centred on it and never longer than the shots it joins (h3's
            # longest shot is MAX_FRAMES frames)
            raise RequestError(f"crossfade_frames = {shown(crossfade)} must be a whole number of frames from 0 to "
                               f"{MAX_FRAMES} (h3's longest shot)", field="crossfade_frames",
                               hint=f"e.g. crossfade_frames = {DEFAULT_CROSSFADE_FRAMES} (0: hard audio joins)")
        if not isinstance(self.crossfade_cuts, bool):
            raise RequestError(f"crossfade_cuts = {shown(self.crossfade_cuts)} must be true or false",
                               field="crossfade_cuts", hint="use crossfade_cuts = false for hard joins at cuts")
        if not isinstance(self.background, bool):
            raise RequestError(f"background = {shown(self.background)} must be true or false", field="background",
                               hint="use background = true to render at background priority (or drop the line)")
        if not isinstance(self.title, str):
            raise RequestError(f"title = {shown(self.title)} must be text (the film's title)", field="title",
                               hint='e.g. title = "The lighthouse"')
        _check_tail_seconds(self.tail_seconds, "the story")
        _check_takes(self.takes, "the story")
        for index, shot in enumerate(self.shots, 1):
            if shot.takes is not None:
                _check_takes(shot.takes, f"shot {index}")
        seed = self.defaults.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            # Every shot's seed is derived from it (seed_for): one that is not a whole number was
            # silently replaced by the default, and the film was not the one asked for.
            raise RequestError(f"seed = {shown(seed)} must be a whole number (each shot's seed is derived from "
                               "the story's)", field="seed", hint="e.g. seed = 7")

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

    def takes_for(self, index: int) -> int:
        """How many takes shot `index` (1-based) renders: its own `takes`, else the story's."""
        own = self.shots[index - 1].takes
        return self.takes if own is None else own

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
            raise RequestError(str(error), field="shot") from None     # plan_story says which shot


# ----------------------------------------------------------------------------- parsing helpers

def shown(value: Any) -> str:
    """A user's value as a message quotes it: short, and never str() of a huge integer (which
    raises past 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"(a {int(value.bit_length() * 0.30103) + 1}-digit number)"
    try:
        text = repr(value)
    except ValueError:          # a huge integer inside a list or table
        return f"(a {type(value).__name__} holding a number of thousands of digits)"
    return text if len(text) <= 60 else text[:57] + "..."


def _check_integers(value: Any, key: str, where: str = "") -> None:
    """TOML integers are 64-bit; a bigger one (Python's tomllib reads any size) is refused here
    in the storyboard's words ("shot 2: seed = ..."), before anything computes with it."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            raise RequestError(f"{where}{key} = {shown(value)} is outside TOML's 64-bit integers "
                               f"({INT64_MIN} to {INT64_MAX})", field=key.split("[")[0].split(".")[0] or None,
                               hint=f"give {key} a value of at most 19 digits (see the storyboard keys in docs/storyboards.md)")
    elif isinstance(value, Mapping):
        for name, item in value.items():
            if key == "" and name == "shot" and isinstance(item, list):
                for number, table in enumerate(item, 1):
                    _check_integers(table, "", f"shot {number}: ")
            else:
                _check_integers(item, f"{key}.{name}" if key else str(name), where)
    elif isinstance(value, (list, tuple)):
        for number, item in enumerate(value, 1):
            _check_integers(item, f"{key}[{number}]", where)


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
    if key == "preset" and (not isinstance(value, str) or value not in PRESETS):
        raise RequestError(f"preset = {shown(value)} is not one of h3bridge's presets", field="preset",
                           hint=f'use one of: {", ".join(PRESETS)} (e.g. preset = "{next(iter(PRESETS))}")')
    if key == "reference_image_size" and isinstance(value, str):
        try:
            return ReferenceImageSize(value)
        except ValueError:
            raise RequestError(Fix(f"{{}} is not one of {', '.join(s.value for s in ReferenceImageSize)}",
                                   (given("reference_image_size", repr(value)),)), field=key,
                               hint='use "match" or "max"') from None
    if key == "slower_paths" and isinstance(value, list):
        try:
            return frozenset(SlowerPath(item) for item in value)
        except ValueError:
            raise RequestError(Fix("{}: use names of h3's --use-slower-* flags", (given("slower_paths", repr(value)),)),
                               field=key,
                               hint=f"one or more of: {', '.join(s.value for s in SlowerPath)}") from None
    return value


def _check_tail_seconds(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not \
            MIN_TAIL_SECONDS <= value <= MAX_TAIL_SECONDS:
        raise RequestError(Fix(literal(f"{where}: ") + f"{{}} must be a number of seconds from {MIN_TAIL_SECONDS:g} to "
                               f"{MAX_TAIL_SECONDS:g} (upstream's reference audio limits)",
                               (given("tail_seconds", repr(value)),)),
                           field="tail_seconds", hint=Fix("e.g. {}", (given("tail_seconds", f"{DEFAULT_TAIL_SECONDS:g}"),)))


def _check_takes(value: Any, where: str) -> None:
    from ..takes import MAX_TAKES
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TAKES:
        raise RequestError(f"{where}: takes = {shown(value)} must be a whole number from 1 to {MAX_TAKES} (each take "
                           "renders the shot with the next seed)", field="takes", hint="e.g. takes = 3")


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
    try:
        settings = {key: _resolve(key, value, base) for key, value in table.items()
                    if key in REQUEST_KEYS or key == "preset"}
    except RequestError as error:
        raise RequestError(error.message_with(f"shot {index}: "), field=error.field, hint=error.hint_data) from None
    tail = table.get("tail_seconds")
    if tail is not None:
        _check_tail_seconds(tail, f"shot {index}")
    references = _references(index, table["references"], base) if "references" in table else ()
    takes = table.get("takes")
    if takes is not None:
        _check_takes(takes, f"shot {index}")
    return Shot(prompt=prompt, continuation=continuation, settings=settings, references=references,
                tail_seconds=tail, takes=takes)


__all__ = ["Continuation", "Shot", "Storyboard", "DEFAULT_TAIL_SECONDS", "DEFAULT_CROSSFADE_FRAMES"]
