"""The one way a warm engine falls back to one-shot (issue 34).

h3's interactive session reads one line per prompt, so a warm SessionEngine refuses some valid
requests (`UnsupportedRequestError`, raised before anything starts); the one-shot engine takes
every valid request. `FallbackEngine` is an `Engine` that runs each request on its primary engine
and, when that refuses it, on the fallback, which it builds only then: a host with no local `h3`
(a remote or library setup) never needs one, so it must never be asked to find one.

What stays the same on either path: the options (`on_progress`, `on_preview`, `cancel`, ...) reach
whichever engine runs the request (an engine without previews accepts `on_preview` and never calls
it); the primary is not closed, so the next request it can take finds it warm (while the fallback
runs, the machine-wide engine lock makes an idle warm engine step aside, lock.py); `close()`
closes both. `on_fallback` receives the refusal, for each interface to say in its own words.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Callable

from ..cancel import CancelToken, PauseControl
from ..errors import UnsupportedRequestError
from ..progress import PreviewCallback, ProgressCallback
from ..request import GenerationRequest
from ..result import GenerationResult
from .protocol import Engine, EngineCapabilities


@dataclass(frozen=True)
class ChosenEngine:
    """The engine that runs a request, and why the primary did not (None: it does)."""

    engine: Engine
    refusal: UnsupportedRequestError | None = None


def choose_engine(engine: Engine, request: GenerationRequest) -> ChosenEngine:
    """Which engine runs `request`: a FallbackEngine's choice (its fallback built if needed), else
    `engine` itself. For a caller that must know before running (to plan memory for it, or to
    record it); nothing is reported: the caller says it in its own words."""
    return engine.choose(request) if isinstance(engine, FallbackEngine) else ChosenEngine(engine)


class FallbackEngine:
    """`primary`, and `make_fallback()` (built on first need) for the requests `primary` refuses."""

    def __init__(self, primary: Engine, make_fallback: Callable[[], Engine], *,
                 on_fallback: Callable[[UnsupportedRequestError], None] | None = None) -> None:
        self.primary = primary
        self._make_fallback = make_fallback
        self._fallback: Engine | None = None
        self._building = threading.Lock()
        self.on_fallback = on_fallback
        self.last_engine: Engine | None = None      # the engine that ran (or is running) the latest request
        self._background: bool | None = None        # set here: given to the fallback too, when it is built

    @property
    def capabilities(self) -> EngineCapabilities:
        # every valid request runs (the fallback takes what the primary cannot), as the primary says otherwise
        return dataclasses.replace(self.primary.capabilities, multiline_prompts=True)

    @property
    def fallback(self) -> Engine:
        """The fallback engine, built on first use (EngineNotFoundError from there if it cannot be)."""
        with self._building:
            if self._fallback is None:
                self._fallback = self._make_fallback()
                if self._background is not None:
                    self._fallback.background = self._background
            return self._fallback

    @property
    def background(self) -> bool:
        """The primary's priority (engines/priority.py)."""
        return bool(getattr(self.primary, "background", False))

    @background.setter
    def background(self, on: bool) -> None:
        """Background priority for both engines: the primary now, the fallback now or when it is built."""
        self.primary.background = on
        with self._building:
            self._background = on
            if self._fallback is not None:
                self._fallback.background = on

    def __getattr__(self, name: str) -> object:
        # engine_path, model_dir, machine_facts, ...: the primary's (the engine the user chose)
        if name.startswith("_") or name in ("primary", "on_fallback", "last_engine"):
            raise AttributeError(name)
        return getattr(self.primary, name)

    def check_supported(self, request: GenerationRequest) -> None:
        """Every valid request runs: the primary's refusals go to the fallback."""

    def choose(self, request: GenerationRequest) -> ChosenEngine:
        """The engine that will run `request`: the primary unless it refuses it (nothing reported)."""
        try:
            self.primary.check_supported(request)
            return ChosenEngine(self.primary)
        except UnsupportedRequestError as refusal:
            return ChosenEngine(self.fallback, refusal)

    def generate(self, request: GenerationRequest, output: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, want_frames: bool = True, want_audio: bool = True,
                 on_progress: ProgressCallback | None = None, on_preview: PreviewCallback | None = None,
                 cancel: CancelToken | None = None, pause: PauseControl | None = None) -> GenerationResult:
        options = dict(overwrite=overwrite, want_frames=want_frames, want_audio=want_audio,
                       on_progress=on_progress, cancel=cancel)
        if pause is not None:           # as with previews: only when there is one
            options["pause"] = pause
        if on_preview is not None:      # as the caller gave them: a preview callback only when there is one
            options["on_preview"] = on_preview
        chosen = self.choose(request)
        if chosen.refusal is not None:
            self._refused(chosen.refusal)
        engine = self.last_engine = chosen.engine
        try:
            return engine.generate(request, output, **options)
        except UnsupportedRequestError as refusal:
            # A refusal the primary could only make once it looked closer (still before anything
            # started): the same fallback.
            if engine is not self.primary:
                raise
            self._refused(refusal)
            self.last_engine = self.fallback
            return self.last_engine.generate(request, output, **options)

    def _refused(self, refusal: UnsupportedRequestError) -> None:
        if self.on_fallback is not None:
            self.on_fallback(refusal)

    def close(self) -> None:
        try:
            self.primary.close()
        finally:
            with self._building:
                fallback = self._fallback
            if fallback is not None:
                fallback.close()

    def __enter__(self) -> "FallbackEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ChosenEngine", "FallbackEngine", "choose_engine"]
