"""Shared helpers for tests against the libh3 double (h3bridge/sim/double): the built library,
a fixture model, and a C compiler for the ABI checks."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from h3bridge import libh3
from h3bridge.errors import LibraryBuildError
from h3bridge.sim.library import build_double, find_compiler



def double_library_path() -> Path:
    """Build (once per source version) and return the double; skip when nothing can compile it."""
    try:
        return build_double()
    except LibraryBuildError as error:
        pytest.skip(f"the libh3 double cannot be built here: {error}")


def compiler_or_skip() -> list[str]:
    try:
        return find_compiler()
    except LibraryBuildError as error:
        pytest.skip(str(error))


def upstream_header(destination: Path) -> Path | None:
    """upstream's h3.h from $H3_UPSTREAM_SOURCE, written to `destination`, or None without it."""
    from upstream_helpers import upstream_source_file
    data = upstream_source_file("h3.h")
    if data is None:
        return None
    destination.write_bytes(data)
    return destination


@dataclass
class Recorder:
    """ctypes callbacks for h3_params that record what the library reports, and cancel on cue.

    cancel_at: (phase, completed) whose report returns 1; cancel_frame: (denoise_step,
    frame_index) whose frame returns 1. Frames are copied out while the callback runs: `rgb`
    is valid only then."""

    cancel_at: tuple[str, int] | None = None
    cancel_frame: tuple[int, int] | None = None
    progress: list[tuple[str, int, int]] = field(default_factory=list)
    frames: list[dict[str, object]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.on_progress = libh3.h3_progress_callback(self._progress)
        self.on_frame = libh3.h3_frame_callback(self._frame)

    def _progress(self, phase: bytes, completed: int, total: int, _opaque: int) -> int:
        self.progress.append((phase.decode(), completed, total))
        return int(self.cancel_at == (phase.decode(), completed))

    def _frame(self, pointer: "ctypes._Pointer[libh3.h3_frame]", _opaque: int) -> int:
        frame = pointer.contents
        data = ctypes.string_at(frame.rgb, frame.stride * frame.height)
        self.frames.append({"width": frame.width, "height": frame.height, "stride": frame.stride,
                            "frame_index": frame.frame_index, "frame_count": frame.frame_count,
                            "denoise_step": frame.denoise_step, "denoise_steps": frame.denoise_steps,
                            "rgb": np.frombuffer(data, np.uint8).reshape(frame.height, frame.width, 3)})
        return int(self.cancel_frame == (frame.denoise_step, frame.frame_index))

    def attach(self, params: libh3.h3_params, *, frames: bool = True) -> libh3.h3_params:
        params.on_progress = self.on_progress
        if frames:
            params.on_frame = self.on_frame
        return params

    @property
    def previews(self) -> list[dict[str, object]]:
        return [frame for frame in self.frames if frame["denoise_step"] >= 0]   # type: ignore[operator]

    @property
    def finals(self) -> list[dict[str, object]]:
        return [frame for frame in self.frames if frame["denoise_step"] == -1]


def small_params(**fields: object) -> libh3.h3_params:
    """A quick request: 64x64, 22 frames, 3 steps, seed 7, then `fields`."""
    params = libh3.default_params()
    params.width, params.height, params.frames, params.steps, params.seed = 64, 64, 22, 3, 7
    for name, value in fields.items():
        setattr(params, name, value)
    return params


def generate(lib: ctypes.CDLL, ctx: object, prompt: bytes | None,
             params: libh3.h3_params | None) -> tuple[dict[str, int] | None, str]:
    """h3_generate; (result fields or None, h3_last_error text). The result is freed here."""
    pointer = lib.h3_generate(ctx, prompt, ctypes.byref(params) if params is not None else None)
    error = lib.h3_last_error(ctx).decode("utf-8", "surrogateescape")
    if not pointer:
        return None, error
    result = pointer.contents
    fields_ = {name: getattr(result, name) for name, _ in libh3.h3_result._fields_}
    lib.h3_result_free(pointer)
    return fields_, error


def local_previews(request, model_dir: Path, library=None) -> list:
    """The previews the library engine over the double makes for `request` here (what a server's
    event stream must carry for the same request): `library` when given, else a LibraryEngine of its own."""
    from h3bridge import LibraryEngine
    previews: list = []
    if library is not None:
        library.generate(request, None, want_frames=False, want_audio=False, on_preview=previews.append)
    else:
        with LibraryEngine(double_library_path(), model_dir, idle_timeout=120) as own:
            own.generate(request, None, want_frames=False, want_audio=False, on_preview=previews.append)
    assert previews, "the double made no previews"
    return previews


def assert_streamed_previews_match(local: list, streamed: list) -> None:
    """A server's event stream gives a client that falls behind the newest preview, not each one
    (progress_feed.py keeps one per job): which steps arrive depends on the machine's load; the last
    always does (it is published before the job's end), in order, each the local engine's own."""
    steps = [p.step for p in streamed]
    assert steps and steps == sorted(set(steps)) and steps[-1] == local[-1].step, (steps, [p.step for p in local])
    by_step = {p.step: p for p in local}
    for theirs in streamed:
        mine = by_step[theirs.step]
        assert (theirs.total_steps, theirs.frame_index) == (mine.total_steps, mine.frame_index)
        assert theirs.image.dtype == np.uint8 and np.array_equal(theirs.image, mine.image)   # PNG is lossless
