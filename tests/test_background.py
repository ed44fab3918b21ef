"""Issue 31: --background runs the engine at background priority (engines/priority.py): nice 19
and the idle I/O class on Linux, applied to the engine child right after it is spawned; the macOS
path (PRIO_DARWIN_BG, taskpolicy -b) is checked for the calls it makes, since it cannot run here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from core_helpers import model_dir, sim_engine_path  # noqa: F401 (fixture)
from h3bridge.engines import priority
from h3bridge.engines.process import EngineProcess

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice/ionice are read back on Linux")
FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


@pytest.fixture
def background_off():
    priority.set_background(False)
    yield
    priority.set_background(False)


def _priority_of(pid: int) -> tuple[int, int]:
    process = psutil.Process(pid)
    return process.nice(), int(process.ionice().ioclass)


def _autogroup_nice(pid: int) -> int | None:
    """With autogroup scheduling a session's group nice is what ranks it against other sessions."""
    return priority.autogroup_nice(pid)


@linux_only
def test_an_engine_child_is_lowered_only_with_background(background_off: None) -> None:
    ours = psutil.Process().nice()
    normal = EngineProcess(SLEEPER)
    try:
        assert _priority_of(normal.pid)[0] == ours
    finally:
        normal.stop(grace=0.1)
    priority.set_background(True)
    lowered = EngineProcess(SLEEPER)
    try:
        assert _priority_of(lowered.pid) == (19, int(psutil.IOPRIO_CLASS_IDLE))
        assert _autogroup_nice(lowered.pid) in (None, 19)        # None: a kernel without autogroups
    finally:
        lowered.stop(grace=0.1)


@linux_only
def test_background_lowers_an_engine_already_running(background_off: None) -> None:
    """A warm engine started before --background was asked for (a ComfyUI job after another)."""
    warm = EngineProcess(SLEEPER)
    try:
        priority.set_background(True)
        assert _priority_of(warm.pid) == (19, int(psutil.IOPRIO_CLASS_IDLE))
    finally:
        warm.stop(grace=0.1)


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
        assert _autogroup_nice(engine_pid) in (None, 19)
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
    group = "" if priority.autogroup_nice(os.getpid()) is None else " (its session's autogroup: nice 19)"
    assert checks["background"]["detail"] == f"--background gives nice 19{group} and the idle I/O class"
