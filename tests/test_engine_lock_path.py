"""An engine given its own lock file (`lock_path`) waits on that lock and names that lock's holder
(issue 34): a SessionEngine(lock_path=X) and a OneShotEngine(lock_path=X), its fallback, never run
at once, and the waiting line names who holds X, not who holds the machine-wide lock."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge import GenerationCancelled, OneShotEngine, SessionEngine
from h3bridge.cancel import CancelToken
from h3bridge.engines.lock import EngineLock
from h3bridge.progress import WAITING_PHASE

from core_helpers import fast_request, model_dir, sim_engine_path  # noqa: F401 (model_dir: a fixture)


@pytest.fixture
def held_lock(tmp_path: Path):
    """X held by this test, with a recorded engine (a sleeping child in its own group)."""
    path = tmp_path / "own-engine.lock"
    lock = EngineLock(path)
    lock.acquire()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        lock.record_engine(child.pid)
        yield path, child.pid
    finally:
        child.kill()
        child.wait()
        lock.release()


@pytest.mark.parametrize("engine_class", [OneShotEngine, SessionEngine])
def test_an_engine_waits_on_its_own_lock_and_names_its_holder(engine_class, held_lock, model_dir,
                                                              tmp_path: Path) -> None:
    path, holder_pid = held_lock
    engine = engine_class(sim_engine_path(), model_dir, lock_path=path)
    cancel = CancelToken()
    waits: list[str | None] = []

    def progress(event) -> None:
        if event.phase == WAITING_PHASE:
            waits.append(event.detail)
            cancel.cancel()

    try:
        with pytest.raises(GenerationCancelled):
            engine.generate(fast_request(), tmp_path / "clip.mp4", on_progress=progress, cancel=cancel)
    finally:
        engine.close()
    assert waits, "the engine did not wait for the lock its caller gave it"
    assert f"process {holder_pid}" in (waits[0] or ""), waits[0]
    assert not (tmp_path / "clip.mp4").exists()
