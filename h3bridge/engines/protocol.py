"""The one interface every engine implements, so callers never ask which engine they hold.

An engine turns a validated `GenerationRequest` into a `GenerationResult` (an MP4 published
atomically, frames, audio), reporting `ProgressEvent`s and, where it can, `PreviewFrame`s,
and honouring a `CancelToken`. The CLI, the ComfyUI nodes and long-form jobs use only this:
what differs between engines is said by `capabilities`, and a request an engine cannot take
is refused by `check_supported` before anything starts, so the caller can fall back.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..cancel import CancelToken, PauseControl
from ..progress import PreviewCallback, ProgressCallback
from ..request import GenerationRequest
from ..result import GenerationResult


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do beyond the common contract."""

    warm_model: bool        # the model stays loaded between jobs (repeat jobs skip the loads)
    previews: bool          # `on_preview` receives a denoise preview after every step
    exact_frames: bool      # `result.frames` are the engine's own RGB frames, not decoded from the H.264 MP4
    remote: bool            # the engine runs on another machine (inputs are uploaded, the MP4 downloaded)
    multiline_prompts: bool  # prompts may contain line breaks (h3's interactive session reads one line)


@runtime_checkable
class Engine(Protocol):
    """A MiniMax-H3 engine. Use it as a context manager, or call `close()` when done."""

    @property
    def capabilities(self) -> EngineCapabilities: ...

    def check_supported(self, request: GenerationRequest) -> None:
        """Raise `UnsupportedRequestError` if this engine cannot run `request` (another engine
        may: the one-shot engine takes every valid request); cheap, starts nothing."""

    def generate(self, request: GenerationRequest, output: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, want_frames: bool = True, want_audio: bool = True,
                 on_progress: ProgressCallback | None = None, on_preview: PreviewCallback | None = None,
                 cancel: CancelToken | None = None, pause: PauseControl | None = None) -> GenerationResult:
        """Render one clip.

        output: where the MP4 goes (None: none is kept); it appears only when complete, and an
          existing file is kept unless `overwrite` (OutputExistsError before anything starts).
        want_frames / want_audio: fill `result.frames` (uint8 [F, H, W, 3]) / `result.audio`
          (float32 [2, samples] at 32 kHz).
        on_progress: ProgressEvents, from the calling thread.
        on_preview: PreviewFrames while sampling; engines without previews accept it and never call it.
        cancel: cancelling from any thread stops the engine and raises GenerationCancelled;
          nothing is left behind.
        pause: pausing (from any thread) stops the engine where it is (its process group gets
          SIGSTOP, memory stays resident) until resumed; on_progress hears PAUSED_PHASE; stall
          watchdogs, timeouts and `result.timings` leave the paused time out; the clip is the one
          an unpaused run makes. A cancel while paused ends everything and leaves nothing.
        """

    def close(self) -> None:
        """Release what the engine holds (a warm model, the machine-wide engine lock). The engine
        stays usable: a later `generate` starts again."""

    def __enter__(self) -> "Engine": ...

    def __exit__(self, *exc: object) -> None: ...


__all__ = ["Engine", "EngineCapabilities"]
