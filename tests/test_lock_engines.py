"""The engine lock as the one-shot engine uses it (engine.py holds it around each run)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from core_helpers import fast_request, model_dir, sim_engine_path, sim_invocations, sim_log  # noqa: F401
from h3bridge import OneShotEngine
from h3bridge.cancel import CancelToken
from h3bridge.errors import GenerationCancelled
from h3bridge.lock import EngineLock, engine_lock
from h3bridge.progress import WAITING_PHASE


def test_one_shot_waits_for_the_engine_and_can_be_cancelled(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                            sim_log: Path) -> None:
    engine = OneShotEngine(sim_engine_path(), model_dir)
    token = CancelToken()
    events = []

    def on_progress(event) -> None:
        events.append(event)
        if len(events) == 3:
            token.cancel()

    with engine_lock():        # another engine holds the machine
        with pytest.raises(GenerationCancelled):
            engine.generate(fast_request(), tmp_path / "a.mp4", on_progress=on_progress, cancel=token)
    assert [event.phase for event in events] == [WAITING_PHASE] * 3
    assert sim_invocations(sim_log) == []          # h3 never started
    assert [p.name for p in tmp_path.iterdir()] == []    # no output, no staged partial file


def test_one_shot_runs_once_the_holder_releases(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    engine = OneShotEngine(sim_engine_path(), model_dir)
    holder = EngineLock()
    holder.acquire()
    phases: list[str] = []
    released = threading.Event()

    def on_progress(event) -> None:
        phases.append(event.phase)
        if event.phase == WAITING_PHASE and not released.is_set():
            released.set()
            threading.Timer(0.05, holder.release).start()

    result = engine.generate(fast_request(), tmp_path / "a.mp4", on_progress=on_progress,
                             want_frames=False, want_audio=False)
    assert result.video_path.is_file()
    waiting = [phase for phase in phases if phase == WAITING_PHASE]
    assert waiting and phases[:len(waiting)] == waiting          # all the waiting came first
    assert "denoise" in phases and not holder.is_held
