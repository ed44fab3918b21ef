"""The Engine protocol (engines/protocol.py), the warm-engine lifecycle every warm engine shares
(engines/warm.py), and the public API that the layout change must keep."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from core_helpers import fast_request, model_dir, sim_engine_path  # noqa: F401  (fixture)
import h3bridge
from h3bridge import (Engine, EngineCapabilities, OneShotEngine, SessionEngine, SessionUnsupportedError,
                      UnsupportedRequestError)
from h3bridge.engines.lock import engine_lock
from h3bridge.engines.warm import WarmEngine

# Everything h3bridge exported before the layout change (h3bridge/__init__.py at 4a1a515).
PUBLIC_API_BEFORE = [
    "AudioClip", "CancelToken", "EngineCrashedError", "EngineError", "EngineNotFoundError", "EngineProcess",
    "EngineStalledError", "GenerationCancelled", "GenerationRequest", "GenerationResult", "H3BridgeError",
    "IntegrityError", "MachineFacts", "MediaError", "MemoryPlan", "MemoryPlanError", "ModelError", "ModelInventory",
    "OneShotEngine", "OutputExistsError", "PRESETS", "ProgressEvent", "Reference", "ReferenceImageSize",
    "ReferenceItem", "ReferenceKind", "ReferenceList", "RequestError", "SessionCommandError", "SessionEngine",
    "SessionError", "SessionUnsupportedError", "SlowerPath", "StructuredPrompt", "VerifyReport", "VideoSource",
    "align_frame_count", "clean_prompt_text", "engine_lock", "inspect_model", "locate_engine",
    "materialise_references", "plan_memory", "preflight", "shared_session", "verify_model",
]


def test_everything_exported_before_is_still_exported() -> None:
    missing = [name for name in PUBLIC_API_BEFORE if name not in h3bridge.__all__ or not hasattr(h3bridge, name)]
    assert missing == []
    assert {"Engine", "EngineCapabilities", "PreviewFrame", "UnsupportedRequestError"} <= set(h3bridge.__all__)


def test_both_engines_implement_the_protocol_and_say_what_they_can(model_dir: Path) -> None:  # noqa: F811
    one_shot = OneShotEngine(sim_engine_path(), model_dir)
    session = SessionEngine(sim_engine_path(), model_dir)
    joined = SessionEngine(sim_engine_path(), model_dir, join_prompt_lines=True)
    for engine in (one_shot, session, joined):
        assert isinstance(engine, Engine)
        assert isinstance(engine.capabilities, EngineCapabilities)
    assert one_shot.capabilities == EngineCapabilities(warm_model=False, previews=False, exact_frames=True,
                                                       remote=False, multiline_prompts=True)
    assert session.capabilities == EngineCapabilities(warm_model=True, previews=False, exact_frames=False,
                                                      remote=False, multiline_prompts=False)
    assert joined.capabilities.multiline_prompts
    assert not isinstance(object(), Engine)


def test_check_supported_refuses_before_anything_starts(model_dir: Path) -> None:  # noqa: F811
    multi_line = fast_request("a red fox\nruns through snow")
    OneShotEngine(sim_engine_path(), model_dir).check_supported(multi_line)        # one-shot takes every request
    session = SessionEngine(sim_engine_path(), model_dir)
    with pytest.raises(SessionUnsupportedError) as caught:
        session.check_supported(multi_line)
    assert isinstance(caught.value, UnsupportedRequestError) and caught.value.before_start
    with pytest.raises(UnsupportedRequestError, match="line break"):
        session.check_supported(fast_request(first_frame=Path("/tmp/a\nb.png")))
    assert not session.running and session.starts == 0
    SessionEngine(sim_engine_path(), model_dir, join_prompt_lines=True).check_supported(multi_line)


@pytest.mark.parametrize("kind", ["one-shot", "session"])
def test_on_preview_is_accepted_and_never_called_by_engines_without_previews(kind: str, model_dir: Path,  # noqa: F811
                                                                            tmp_path: Path) -> None:
    previews: list[object] = []
    engine: Engine = OneShotEngine(sim_engine_path(), model_dir) if kind == "one-shot" \
        else SessionEngine(sim_engine_path(), model_dir)
    with engine:
        result = engine.generate(fast_request(), tmp_path / "clip.mp4", want_frames=False, on_preview=previews.append)
    assert result.video_path is not None and result.video_path.is_file()
    assert previews == []


class _FakeWarm(WarmEngine):
    """A warm engine whose 'child' is a flag: the shared lifecycle, without any process."""

    def __init__(self, lock_path: Path, idle_timeout: float = 300.0) -> None:
        super().__init__(idle_timeout=idle_timeout, lock_path=lock_path)
        self.child = False
        self.stops: list[bool] = []
        self.stopped = threading.Event()

    def run_job(self) -> None:
        with self._job(on_progress=None, cancel=None):
            if not self.child:
                self._take_engine_lock(on_progress=None, cancel=None)
                self.child = True

    def _engine_running(self) -> bool:
        return self.child

    def _stop_engine(self, *, graceful: bool) -> None:
        if self.child:
            self.stops.append(graceful)
            self.stopped.set()
        self.child = False

    def _kill_engine_now(self) -> None:
        self._stop_engine(graceful=False)


def test_a_warm_engine_holds_the_lock_while_warm_and_steps_aside_for_a_job_in_this_process(tmp_path: Path) -> None:
    lock_path = tmp_path / "engine.lock"
    warm = _FakeWarm(lock_path)
    warm.run_job()
    assert warm.child and warm._lock.is_held
    with engine_lock(path=lock_path):           # the waiter's yield hook makes the idle engine step aside
        assert warm.stops == [True] and not warm.child
    warm.run_job()                              # and it warms up again for its next job
    assert warm.child
    warm.close()
    assert warm.stops == [True, True] and not warm._lock.is_held


def test_a_warm_engine_gives_the_engine_back_after_its_idle_timeout(tmp_path: Path) -> None:
    warm = _FakeWarm(tmp_path / "engine.lock", idle_timeout=0.2)
    warm.run_job()
    assert warm.stopped.wait(timeout=60), "the idle timer never shut the engine down"
    assert warm.stops == [True]
    with engine_lock(path=tmp_path / "engine.lock", poll_interval=0.05) as lock:
        assert lock.is_held
