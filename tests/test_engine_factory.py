"""One factory and one fallback (issue 34): open_engine(kind) gives the engine of each kind of the
vocabulary, and a session hands what h3's interactive mode cannot take to a one-shot fallback
that is built only then, shares the session's program, model, watchdog and lock, and gets the
same options."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from h3bridge.cancel import PauseControl

from h3bridge import (EngineNotFoundError, GenerationRequest, OneShotEngine, RemoteEngine, SessionEngine,
                      UnsupportedRequestError)
from h3bridge.engines.factory import open_engine
from h3bridge.engines.fallback import FallbackEngine
from h3bridge.engines.protocol import EngineCapabilities
from h3bridge.vocabulary import EngineKind

from core_helpers import fast_request, model_dir, sim_engine_path, sim_invocations, sim_log  # noqa: F401


def test_each_kind_opens_its_engine(model_dir: Path, tmp_path: Path) -> None:
    engine = sim_engine_path()
    one_shot = open_engine("one-shot", engine_path=engine, model_dir=model_dir, stall_timeout=30.0)
    assert type(one_shot) is OneShotEngine and one_shot.stall_timeout == 30.0
    session = open_engine(EngineKind.SESSION, engine_path=engine, model_dir=model_dir, lock_path=tmp_path / "x.lock")
    assert isinstance(session, FallbackEngine) and isinstance(session.primary, SessionEngine)
    assert session.engine_path == session.primary.engine_path == one_shot.engine_path   # the primary's, seen through
    remote = open_engine("remote", remote_url="http://127.0.0.1:9")
    assert isinstance(remote, RemoteEngine)
    for engine_ in (one_shot, session, remote):
        engine_.close()


def test_old_spellings_open_the_same_kind_and_anything_else_names_the_kinds(model_dir: Path) -> None:
    assert type(open_engine("oneshot", engine_path=sim_engine_path(), model_dir=model_dir)) is OneShotEngine
    with pytest.raises(ValueError, match="one-shot, session, library, remote"):
        open_engine("warm", engine_path=sim_engine_path(), model_dir=model_dir)
    with pytest.raises(TypeError, match="api_key"):
        open_engine("one-shot", engine_path=sim_engine_path(), model_dir=model_dir, api_key="k")


def test_a_remote_engine_needs_no_local_h3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where remote mode is for: a machine with no h3 on PATH and no H3_BIN."""
    monkeypatch.delenv("H3_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))      # nothing there
    with pytest.raises(EngineNotFoundError):
        open_engine("one-shot")                    # the local engines do need one...
    assert isinstance(open_engine("remote", remote_url="http://127.0.0.1:9"), RemoteEngine)   # ...remote does not


class _Refusing:
    """A primary engine that refuses multi-line prompts, as h3's interactive mode does."""

    capabilities = EngineCapabilities(warm_model=True, previews=True, exact_frames=False, remote=False,
                                      multiline_prompts=False)

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.closed = 0

    def check_supported(self, request: GenerationRequest) -> None:
        if "\n" in request.prompt:
            raise UnsupportedRequestError("the prompt has several lines")

    def generate(self, request, output=None, **options):
        self.check_supported(request)
        self.ran.append(request.prompt)
        return options

    def close(self) -> None:
        self.closed += 1


def test_the_fallback_is_built_only_when_a_request_needs_it() -> None:
    primary, built = _Refusing(), []

    def make_fallback():
        built.append(_Refusing())
        raise EngineNotFoundError("no h3 here")     # what a machine without h3 would say

    engine = FallbackEngine(primary, make_fallback)
    engine.check_supported(GenerationRequest("two\nlines"))       # never refuses: the fallback takes it
    assert engine.generate(GenerationRequest("one line"), cancel=None, want_frames=False)["want_frames"] is False
    assert primary.ran == ["one line"] and built == []
    with pytest.raises(EngineNotFoundError):
        engine.generate(GenerationRequest("two\nlines"))
    assert len(built) == 1
    engine.close()
    assert primary.closed == 1


def test_every_option_reaches_the_fallback_and_close_closes_both() -> None:
    primary, fallback, refusals = _Refusing(), _Refusing(), []
    fallback.check_supported = lambda request: None     # the one-shot engine takes every request
    engine = FallbackEngine(primary, lambda: fallback, on_fallback=refusals.append)
    marker = object()
    pause = PauseControl()
    options = engine.generate(GenerationRequest("two\nlines"), on_preview=marker, overwrite=True, pause=pause)
    assert options["on_preview"] is marker and options["overwrite"] is True and options["pause"] is pause
    assert fallback.ran == ["two\nlines"] and primary.ran == []
    assert [refusal.message for refusal in refusals] == ["the prompt has several lines"]
    assert engine.last_engine is fallback and engine.capabilities.multiline_prompts
    engine.close()
    assert (primary.closed, fallback.closed) == (1, 1)


def test_a_session_runs_a_multiline_prompt_one_shot_on_its_own_lock(model_dir: Path, sim_log: Path,
                                                                   tmp_path: Path) -> None:
    refusals: list[UnsupportedRequestError] = []
    lock = tmp_path / "own.lock"
    engine = open_engine("session", engine_path=sim_engine_path(), model_dir=model_dir, stall_timeout=45.0,
                         lock_path=lock, on_fallback=refusals.append)
    try:
        result = engine.generate(fast_request("a fox\nruns"), tmp_path / "clip.mp4", want_frames=False)
    finally:
        engine.close()
    assert result.video_path is not None and Path(result.video_path).is_file()
    assert len(refusals) == 1
    fallback = engine.last_engine
    assert type(fallback) is OneShotEngine
    assert (fallback.lock_path, fallback.stall_timeout, fallback.model_dir) == (lock, 45.0, engine.primary.model_dir)
    runs = sim_invocations(sim_log)
    assert len(runs) == 1 and "-p" in runs[0]["argv"]       # one h3 process, one-shot; no session started
