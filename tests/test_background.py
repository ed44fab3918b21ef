"""Issue 31: --background runs the engine at background priority (engines/priority.py): nice 19
and the idle I/O class on Linux, applied to the engine child right after it is spawned; the macOS
path (PRIO_DARWIN_BG, taskpolicy -b) is checked for the calls it makes, since it cannot run here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from core_helpers import fast_request, model_dir, sim_engine_path  # noqa: F401 (fixture)
from story_helpers import CANVAS, write_story

from h3bridge.comfy import adapter
from h3bridge.engines import priority
from h3bridge.engines.factory import open_engine
from h3bridge.engines.fallback import FallbackEngine
from h3bridge.engines.oneshot import OneShotEngine
from h3bridge.engines.process import EngineProcess
from h3bridge.errors import RequestError
from h3bridge.story.runner import run_story
from h3bridge.story.storyboard import Storyboard
from h3bridge.vocabulary import EngineKind

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice/ionice are read back on Linux")
FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]
WAIT = 120.0        # a safety net for a loaded machine, never an expected time


def _priority_of(pid: int) -> tuple[int, int]:
    process = psutil.Process(pid)
    return process.nice(), int(process.ionice().ioclass)


def _autogroup_nice(pid: int) -> int | None:
    """With autogroup scheduling a session's group nice is what ranks it against other sessions."""
    return priority.autogroup_nice(pid)


def _fresh_session_autogroup_nice() -> int | None:
    """The autogroup nice /proc shows for a child that leads a new session, as an engine does: None
    on a kernel without autogroup scheduling. (Read off such a child, never off this process: one
    still in the boot-time default autogroup, as a CI runner that never called setsid is, shows
    none even where a new session gets its own.)"""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             start_new_session=True)
    try:
        return priority.autogroup_nice(child.pid)
    finally:
        child.communicate(b"")


def _lowered_autogroup() -> int | None:
    """What a lowered engine's autogroup must show here: nice 19, or nothing without autogroups."""
    return None if _fresh_session_autogroup_nice() is None else 19


@linux_only
def test_an_engine_child_is_lowered_only_with_background() -> None:
    ours = psutil.Process().nice()
    normal = EngineProcess(SLEEPER)
    try:
        assert _priority_of(normal.pid)[0] == ours
    finally:
        normal.stop(grace=0.1)
    lowered = EngineProcess(SLEEPER, background=True)
    try:
        assert _priority_of(lowered.pid) == (19, int(psutil.IOPRIO_CLASS_IDLE))
        assert _autogroup_nice(lowered.pid) == _lowered_autogroup()
    finally:
        lowered.stop(grace=0.1)


def _priority_while_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run) -> tuple[int, int]:
    """Run `run()` in a thread with h3-sim held in its denoise; the engine's (nice, I/O class) there."""
    held, release = tmp_path / "held", tmp_path / "release"
    monkeypatch.setenv("H3_SIM_HOLD_PHASE", "denoise")
    monkeypatch.setenv("H3_SIM_HOLD_NOTICE", str(held))
    monkeypatch.setenv("H3_SIM_HOLD_RELEASE", str(release))
    failures: list[BaseException] = []

    def job() -> None:
        try:
            run()
        except BaseException as error:      # noqa: BLE001 - asserted below
            failures.append(error)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while not held.exists() and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.exists(), failures or "the engine never reached its denoise"
        seen = _priority_of(int(held.read_text().strip()))
    finally:
        release.touch()
        thread.join(WAIT)
    assert not thread.is_alive() and not failures, failures
    return seen


@linux_only
def test_the_nodes_background_input_reaches_the_engine_it_opens(tmp_path: Path, model_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """H3 Generate / H3 Storyboard's `background`: the node's handle opens its engine with it
    (comfy.adapter.with_background, open_engine), the same open_engine(background=) as --background."""
    handle = adapter.EngineHandle(sim_engine_path(), model_dir, adapter.ONE_SHOT)
    plain = adapter.open_engine(adapter.with_background(handle, False))
    lowered = adapter.open_engine(adapter.with_background(handle, True))
    assert (plain.background, lowered.background) == (False, True) and handle.background is False
    ours = psutil.Process().nice()
    assert _priority_while_held(tmp_path / "a", monkeypatch, lambda: lowered.generate(
        fast_request(), tmp_path / "lowered.mp4", want_frames=False)) == (19, int(psutil.IOPRIO_CLASS_IDLE))
    assert _priority_while_held(tmp_path / "b", monkeypatch, lambda: plain.generate(
        fast_request(), tmp_path / "plain.mp4", want_frames=False))[0] == ours
    session = adapter.one_shot_handle(adapter.with_background(replace(handle, mode=adapter.SESSION), True))
    assert session.background is True       # a session's one-shot fallback keeps it


def test_the_nodes_background_input_is_refused_for_a_remote_engine_in_its_words() -> None:
    remote = adapter.EngineHandle(None, None, adapter.REMOTE, remote_url="http://127.0.0.1:9")
    assert adapter.with_background(remote, False).background is False
    with pytest.raises(RequestError) as refused:
        adapter.with_background(remote, True)
    assert refused.value.field == "background" and "remote engine renders at its server's priority" in refused.value.message
    assert "set background to false on this node" in (refused.value.hint or "")
    assert "serve --background" in (refused.value.hint or "")


def test_open_engine_refuses_background_for_a_remote_engine() -> None:
    with pytest.raises(RequestError) as refused:
        open_engine(EngineKind.REMOTE, remote_url="http://127.0.0.1:9", background=True)
    assert refused.value.field == "background" and "serve --background" in (refused.value.hint or "")


@linux_only
def test_a_shared_warm_engine_takes_each_callers_choice_and_is_lowered_while_running(model_dir: Path) -> None:
    """A warm session started at normal priority (a ComfyUI job without background), then a job
    with it: the running child is lowered at once; one lowered stays so (it cannot be raised)."""
    first = open_engine(EngineKind.SESSION, engine_path=sim_engine_path(), model_dir=model_dir, shared=True,
                        fallback=False, background=False)
    try:
        first.generate(fast_request(), None, want_frames=False, want_audio=False)
        pid = first.pid
        assert pid is not None and _priority_of(pid)[0] == psutil.Process().nice()
        again = open_engine(EngineKind.SESSION, engine_path=sim_engine_path(), model_dir=model_dir, shared=True,
                            fallback=False, background=True)
        assert again is first and again.background is True and again.pid == pid
        assert _priority_of(pid) == (19, int(psutil.IOPRIO_CLASS_IDLE))
        assert _autogroup_nice(pid) == _lowered_autogroup()
        later = open_engine(EngineKind.SESSION, engine_path=sim_engine_path(), model_dir=model_dir, shared=True,
                            fallback=False, background=False)
        assert later.background is False and _priority_of(pid)[0] == 19      # stays lowered until it restarts
    finally:
        first.close()


@linux_only
def test_the_storyboard_key_lowers_the_engine_the_story_runs_on(tmp_path: Path, model_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    storyboard = Storyboard.from_toml(write_story(tmp_path, CANVAS + 'background = true\n\n[[shot]]\n'
                                                  'prompt = "a lighthouse"\nframes = 22\n'))
    engine = FallbackEngine(OneShotEngine(sim_engine_path(), model_dir),
                            lambda: OneShotEngine(sim_engine_path(), model_dir))
    assert _priority_while_held(tmp_path / "held", monkeypatch, lambda: run_story(
        storyboard, tmp_path / "film.mp4", engine=engine)) == (19, int(psutil.IOPRIO_CLASS_IDLE))
    assert engine.background is True and engine.fallback.background is True     # built later: lowered too


def test_the_macos_path_asks_for_the_background_band(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(priority.sys, "platform", "darwin")
    monkeypatch.setattr(priority.os, "setpriority", lambda which, who, value: calls.append((which, who, value)),
                        raising=False)
    assert priority.lower_to_background(4242) == "PRIO_DARWIN_BG"
    assert calls == [(4, 4242, 0x1000)]      # PRIO_DARWIN_PROCESS, pid, PRIO_DARWIN_BG (<sys/resource.h>)


def test_the_macos_path_falls_back_to_taskpolicy(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(which: int, who: int, value: int) -> None:
        raise PermissionError("not permitted")

    ran: list[list[str]] = []
    monkeypatch.setattr(priority.sys, "platform", "darwin")
    monkeypatch.setattr(priority.os, "setpriority", refuse, raising=False)
    monkeypatch.setattr(priority.subprocess, "run", lambda argv, **kw: ran.append(argv))
    assert priority.lower_to_background(4242) == "taskpolicy -b"
    assert ran == [["taskpolicy", "-b", "-p", "4242"]]


@linux_only
def test_generate_background_runs_the_engine_at_background_priority(tmp_path: Path, model_dir: Path) -> None:
    """The CLI flag reaches the engine: h3-sim is held in its denoise and its priority read."""
    held, release = tmp_path / "held", tmp_path / "release"
    env = {**os.environ, "H3_SIM_HOLD_PHASE": "denoise", "H3_SIM_HOLD_NOTICE": str(held),
           "H3_SIM_HOLD_RELEASE": str(release)}
    argv = [sys.executable, "-m", "h3bridge.cli", "generate", "-p", "fox", *FAST_FLAGS, "-o", str(tmp_path / "a.mp4"),
            "--background", "--quiet", "--engine-path", str(sim_engine_path()), "--model-dir", str(model_dir)]
    cli = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not held.exists() and cli.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.exists(), cli.stderr.read() if cli.poll() is not None else "the engine never reached denoise"
        engine_pid = int(held.read_text().strip())
        assert _priority_of(engine_pid) == (19, int(psutil.IOPRIO_CLASS_IDLE))
        assert _autogroup_nice(engine_pid) == _lowered_autogroup()
        assert _priority_of(cli.pid)[0] == psutil.Process().nice()      # the CLI itself is not lowered
    finally:
        release.touch()
        status = cli.wait(timeout=60)
    assert status == 0 and (tmp_path / "a.mp4").is_file()


def test_background_with_remote_is_refused_in_flag_words(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "generate", "-p", "fox", "--remote",
                           "http://127.0.0.1:9", "--background"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--background is for a local engine" in done.stderr and "h3bridge serve --background" in done.stderr
    assert "drop --background" in done.stderr


@linux_only
def test_doctor_says_what_background_gives_here() -> None:
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "doctor", "--json"], capture_output=True, text=True,
                          timeout=120)
    checks = {check["check"]: check for check in json.loads(done.stdout)["checks"]}
    assert checks["background"]["ok"] is True
    # the probe lowers a child that leads a new session: its autogroup shows where such a child's does
    group = "" if _lowered_autogroup() is None else " (its session's autogroup: nice 19)"
    assert checks["background"]["detail"] == f"--background gives nice 19{group} and the idle I/O class"
