"""Pausing a job at the engine level (issue 31): `generate(..., pause=PauseControl())` stops the
engine's process group (SIGSTOP) and continues it on resume (SIGCONT), for the one-shot engine,
the warm session and the library engine (its worker), on h3-sim and the libh3 double.

Synchronisation is on progress callbacks and on the engine group's process state (every member
`stopped`), never on sleeps: the only sleep is the pause itself, which must outlast the stall
watchdog to show that the watchdog leaves paused time out.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import psutil
import pytest

from core_helpers import assert_group_gone, fast_request, model_dir, sim_engine_path  # noqa: F401 (fixture)
from h3bridge import CancelToken, GenerationCancelled, LibraryEngine, OneShotEngine, SessionEngine
from h3bridge.cancel import PauseControl
from h3bridge.history.store import HistoryStore
from h3bridge.progress import PAUSED_PHASE, ProgressEvent
from h3bridge.engines.groups import all_stopped

PAUSE_SECONDS = 2.0          # longer than the stall timeout the test sets while paused
SHORT_STALL = 0.5
WAIT_FOR_STOP = 60.0         # how long the group may take to show as stopped on a loaded machine


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder and a HOME of the test's own, so "nothing left behind" is exact."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(home / "cache"))
    return folder


@pytest.fixture(params=["one-shot", "session", "library"])
def engine(request: pytest.FixtureRequest, model_dir: Path):  # noqa: F811
    if request.param == "one-shot":
        yield OneShotEngine(sim_engine_path(), model_dir)
    elif request.param == "session":
        with SessionEngine(sim_engine_path(), model_dir, idle_timeout=120) as session:
            yield session
    else:
        from double_helpers import double_library_path
        with LibraryEngine(double_library_path(), model_dir, idle_timeout=120) as library:
            yield library


def engine_group(engine) -> int:
    """The process group the engine runs its job in: the warm child's, or the one-shot h3's (the
    one child of this process that leads its own session)."""
    if not isinstance(engine, OneShotEngine):
        assert engine.pid is not None
        return engine.pid
    leaders = [child.pid for child in psutil.Process().children() if os.getpgid(child.pid) == child.pid]
    assert len(leaders) == 1, leaders
    return leaders[0]


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (OSError, psutil.Error):
            continue
    return members


def wait_until_stopped(pgid: int) -> list[psutil.Process]:
    """Every member of the group stopped (the SIGSTOP took effect)."""
    deadline = time.monotonic() + WAIT_FOR_STOP
    while True:
        members = group_members(pgid)
        if all_stopped(members):        # (or held in vfork by a child stopped before its exec)
            return members
        assert time.monotonic() < deadline, [(m.pid, m.status()) for m in members]
        time.sleep(0.01)


def work_done(members: list[psutil.Process]) -> tuple[float, int]:
    """(CPU seconds, bytes written) of the group's members so far: what a running engine moves."""
    cpu = written = 0
    for member in members:
        times = member.cpu_times()
        cpu += times.user + times.system + times.children_user + times.children_system
        written += member.io_counters().write_chars
    return cpu, written


class PausedRun:
    """Pauses a job at its first denoise report; a helper thread waits until the engine's group is
    stopped, measures it over PAUSE_SECONDS, then does `then` (resume, or cancel)."""

    def __init__(self, engine, *, then: str) -> None:
        self.engine = engine
        self.then = then
        self.pause = PauseControl()
        self.cancel = CancelToken()
        self.events: list[ProgressEvent] = []
        self.before: tuple[float, int] | None = None
        self.after: tuple[float, int] | None = None
        self.pgid: int | None = None
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    def on_progress(self, event: ProgressEvent) -> None:
        self.events.append(event)
        if self.thread is None and event.phase in ("denoise", "denoise enqueue"):
            self.pgid = engine_group(self.engine)
            self.engine.stall_timeout = SHORT_STALL       # only while paused (restored before resume)
            self.pause.pause()
            self.thread = threading.Thread(target=self._measure)
            self.thread.start()

    def _measure(self) -> None:
        try:
            assert self.pgid is not None
            members = wait_until_stopped(self.pgid)
            self.before = work_done(members)
            time.sleep(PAUSE_SECONDS)
            self.after = work_done(members)
            assert all_stopped(members)
        except BaseException as error:      # noqa: BLE001 - re-raised by the test
            self.failure = error
        finally:
            self.engine.stall_timeout = 600.0
            if self.then == "cancel":
                self.cancel.cancel()
            else:
                self.pause.resume()

    def generate(self, output: Path | None) -> object:
        return self.engine.generate(fast_request(seed=7), output, on_progress=self.on_progress,
                                    cancel=self.cancel, pause=self.pause)

    def join(self) -> None:
        assert self.thread is not None, "the job never reached denoising"
        self.thread.join()
        if self.failure is not None:
            raise self.failure


def test_a_paused_engine_does_no_work_and_resumes_to_the_same_clip(engine, tmp_path: Path) -> None:
    plain_events: list[ProgressEvent] = []
    plain = engine.generate(fast_request(seed=7), tmp_path / "plain.mp4", on_progress=plain_events.append)
    plain_phases = [event.phase for event in plain_events]
    run = PausedRun(engine, then="resume")
    started = time.monotonic()
    paused = run.generate(tmp_path / "paused.mp4")
    wall = time.monotonic() - started
    run.join()

    # No CPU and no output while stopped; the stall watchdog (SHORT_STALL) did not fire in PAUSE_SECONDS.
    assert run.before is not None and run.before == run.after
    # The same clip as without the pause.
    assert np.array_equal(paused.frames, plain.frames) and np.array_equal(paused.audio, plain.audio)
    assert paused.seed == plain.seed
    # The caller heard the pause, then the job again.
    phases = [event.phase for event in run.events]
    assert PAUSED_PHASE in phases
    after_pause = phases[phases.index(PAUSED_PHASE) + 1:]
    # Which report comes first after the pause is not fixed: lines the engine wrote before the stop
    # took effect are still read from its pipe. The job reports again, pauses once, and ends as
    # an unpaused run ends.
    assert after_pause and PAUSED_PHASE not in after_pause
    assert after_pause[-1] == plain_phases[-1]
    # Timings and the history leave the paused time out.
    paused_for = run.pause.paused_seconds()
    assert paused_for >= PAUSE_SECONDS
    assert paused.timings["total"] <= wall - paused_for
    latest = HistoryStore().recent_jobs()[0]
    assert latest.outcome == "completed" and latest.total_seconds <= wall - paused_for


def test_cancel_while_paused_ends_everything_and_leaves_nothing(engine, tmp_path: Path, _private_tmp: Path) -> None:
    run = PausedRun(engine, then="cancel")
    with pytest.raises(GenerationCancelled):
        run.generate(tmp_path / "out.mp4")
    run.join()
    assert run.before == run.after
    assert list(tmp_path.glob("*.mp4")) == [] and list(tmp_path.glob(".h3bridge-*")) == []
    assert list(_private_tmp.iterdir()) == []
    assert run.pgid is not None
    if isinstance(engine, LibraryEngine) and engine.pid == run.pgid:
        # The worker answered the cancel and stays warm for the next job: running, not stopped.
        assert all(member.status() != psutil.STATUS_STOPPED for member in group_members(run.pgid))
        assert engine.generate(fast_request(), None, want_audio=False).frames is not None
        engine.close()
    assert_group_gone(run.pgid)
