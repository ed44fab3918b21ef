"""Takes for the H3 Generate node: the takes of one request rendered once, then any of them picked.

The takes a node rendered are kept (in memory, by the request's key: its fields with the input
files' contents, the engine and the number of takes), so choosing another `pick` runs nothing
but the pick: the chosen take's MP4 is read back as the node's video, frames and audio. No
ComfyUI import here (plain values; nodes.py converts them).
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import RequestError
from ..progress import ProgressEvent
from ..request import GenerationRequest, request_fields
from ..safeio.paths import not_regular, sha256_regular
from ..takes import MAX_TAKES

KEPT_REQUESTS = 8        # the takes of this many requests stay known (their files are ComfyUI's outputs)


@dataclass(frozen=True)
class RenderedTakes:
    """Every take of one request as a node rendered them."""

    videos: tuple[Path, ...]
    seeds: tuple[int, ...]
    sheet_path: Path
    sheet: np.ndarray            # uint8 [H, W, 3], the contact sheet
    frame_count: int
    width: int
    height: int
    fps: int
    sample_rate: int

    def present(self) -> bool:
        return self.sheet_path.is_file() and all(path.is_file() for path in self.videos)


class TakesCache:
    """The last KEPT_REQUESTS requests' takes, by takes_key (thread-safe)."""

    def __init__(self, size: int = KEPT_REQUESTS) -> None:
        self._size = size
        self._entries: OrderedDict[str, RenderedTakes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> RenderedTakes | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if not entry.present():      # a take's file was removed: render them again
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry

    def put(self, key: str, entry: RenderedTakes) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)


NODE_TAKES = TakesCache()     # the H3 Generate nodes' takes, for as long as ComfyUI runs


def check_take_inputs(takes: object, pick: object) -> tuple[int, int]:
    """The node's `takes` and `pick`, in its words (ComfyUI holds each widget to its range; the pick
    must also be one of the takes)."""
    if isinstance(takes, bool) or not isinstance(takes, int) or not 1 <= takes <= MAX_TAKES:
        raise RequestError(f"takes {takes!r} must be from 1 to {MAX_TAKES}", field="takes",
                           hint="set takes to the number of seeds to try, e.g. 3")
    if isinstance(pick, bool) or not isinstance(pick, int) or not 1 <= pick <= takes:
        raise RequestError(f"pick {pick!r}: there {'is one take' if takes == 1 else f'are takes 1 to {takes}'}",
                           field="pick", hint=f"set pick from 1 to {takes} (the take the video, frames and audio "
                                              "outputs carry)")
    return takes, pick


def takes_key(request: GenerationRequest, engine: str, takes: int) -> str:
    """What the takes are made of: the request (input files by content: a node writes them under new
    names each run), the engine that renders them, and how many."""
    def content(path: Path) -> object:
        try:
            return sha256_regular(path, not_regular)
        except OSError:
            return str(path)
    description = {"request": request_fields(request, path_value=content), "engine": engine, "takes": takes}
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()


class TakesProgress:
    """The node's progress over all takes: take t's fraction reported as part of the whole (the node's
    bar never moves backwards, and each take starts from 0). `start` is generate_takes' on_take."""

    def __init__(self, forward: Callable[[ProgressEvent], None] | None, takes: int,
                 on_take: Callable[[str], None] | None = None) -> None:
        self._forward, self._takes, self._on_take = forward, takes, on_take
        self._take = 1

    def start(self, take: int, seed: int) -> None:
        self._take = take
        if self._on_take is not None:
            self._on_take(f"take {take}/{self._takes} (seed {seed})")

    def __call__(self, event: ProgressEvent) -> None:
        if self._forward is not None:
            self._forward(replace(event, fraction=(self._take - 1 + event.fraction) / self._takes, eta=None))


def sheet_rows(sheet: np.ndarray, takes: int) -> np.ndarray:
    """uint8 [takes, row_h, W, 3]: the contact sheet cut into one picture per take (its label and frames)."""
    from ..media.sheet import GAP
    row_h = (sheet.shape[0] - GAP) // takes
    return np.stack([sheet[GAP + number * row_h:GAP + (number + 1) * row_h] for number in range(takes)])


__all__ = ["NODE_TAKES", "RenderedTakes", "TakesCache", "TakesProgress", "check_take_inputs", "sheet_rows",
           "takes_key"]
