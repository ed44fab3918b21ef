"""Waiting for the engine another job holds (issue 20 item 6): `generate` says who holds it
(program, process, user, from the holder's engine record), keeps the wait visible without a
terminal (a line now and then, not one per poll), and its summary's wall time includes the wait."""
from __future__ import annotations

import os
import pwd
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core_helpers import model_dir, sim_engine_path  # noqa: F401  (fixture)
from h3bridge.cli.engine import PhaseProgressBars
from h3bridge.progress import WAITING_PHASE, ProgressEvent
from h3bridge.cli.story import StoryProgressDisplay
from h3bridge.story.runner import StoryProgress

HOLDER = r"""
import subprocess, sys
from h3bridge.engines.lock import engine_lock
with engine_lock() as lock:
    engine = subprocess.Popen(["sleep", "600"], start_new_session=True)
    lock.record_engine(engine.pid)
    print(engine.pid, flush=True)
    sys.stdin.readline()                    # until the test lets go
    engine.kill()
    engine.wait()
    lock.clear_engine()
"""


def line_reader(stream) -> queue.Queue:
    """The lines of `stream`, read on a thread (None at its end), so that every wait is bounded."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    return lines


def read_until(lines: queue.Queue, pattern: str, seen: list[str], deadline: float) -> re.Match[str]:
    """Lines until one matches `pattern`; fails at `deadline` or at the end of the stream."""
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            pytest.fail(f"never saw {pattern!r} in:\n{''.join(seen)}")
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match


def test_generate_says_who_holds_the_engine_and_counts_the_wait(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    job = None
    engine_pid = 0
    try:
        engine_pid = int(holder.stdout.readline())     # bounded: the holder prints it at once, or exits
        job = subprocess.Popen([sys.executable, "-m", "h3bridge.cli", "generate", "-p", "fox", "--width", "96",
                                "--height", "64", "--frames", "22", "--steps", "2", "-o", str(tmp_path / "fox.mp4"),
                                "--engine-path", str(sim_engine_path()), "--model-dir", str(model_dir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen: list[str] = []
        deadline = time.monotonic() + 120
        lines = line_reader(job.stderr)
        first = read_until(lines, r"waiting for the engine: held by (.*)", seen, deadline)
        user = pwd.getpwuid(os.geteuid()).pw_name
        assert re.fullmatch(rf"sleep started by python\S* \(process {engine_pid} of user {re.escape(user)}\)",
                            first[1]), first[1]
        # the job waits visibly: it goes on saying so (10 s in), and only that
        read_until(lines, r"still waiting for the engine \(10 s\): held by sleep", seen, deadline)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        assert job.wait(timeout=120) == 0
        rest = ""
        while (line := lines.get(timeout=60)) is not None:
            rest += line
    finally:
        for process in (job, holder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=60)
        if engine_pid and holder.returncode != 0:     # a killed holder leaves its engine (own session)
            try:
                os.kill(engine_pid, 9)
            except ProcessLookupError:
                pass
    summary = re.search(r"rendered in ([\d.]+) s wall time \(([\d.]+) s of it waiting for the engine\)", rest)
    assert summary is not None, rest
    wall, waited = float(summary[1]), float(summary[2])
    assert waited >= 10 and wall >= waited, "".join(seen) + rest
    assert sum("waiting for the engine" in line for line in seen) <= 3     # a few lines, not one per poll


def wait_events(seconds: list[float], detail: str = "h3 started by h3bridge serve (process 7 of user ann)"
                ) -> list[ProgressEvent]:
    return [ProgressEvent(WAITING_PHASE, 0, 0, 0.0, s, detail=detail) for s in seconds]


def test_without_a_terminal_a_long_wait_prints_a_few_lines(capsys: pytest.CaptureFixture[str]) -> None:
    bars = PhaseProgressBars(terminal=False)
    for event in wait_events([i / 10 for i in range(0, 36000)]):     # an hour of 0.1 s polls
        bars(event)
    bars(ProgressEvent("text encoder", 0, 1, 0.0, 3600.0))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "h3bridge: waiting for the engine: held by h3 started by h3bridge serve (process 7 of " \
                       "user ann)"
    assert lines[1].startswith("h3bridge: still waiting for the engine (10 s): held by h3 started by")
    assert [int(re.search(r"\((\d+) s\)", line)[1]) for line in lines[1:-1]] == [10, 30, *range(60, 3600, 60)]
    assert lines[-1].startswith("h3bridge: text encoder")
    assert bars.waited == pytest.approx(3599.9)


def test_quiet_still_counts_the_wait(capsys: pytest.CaptureFixture[str]) -> None:
    bars = PhaseProgressBars(enabled=False, terminal=False)
    for event in wait_events([0.0, 4.5]):
        bars(event)
    assert capsys.readouterr().err == "" and bars.waited == 4.5


def test_story_says_who_holds_the_engine(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """`story` waited in silence ("shot 1/1: waiting for the engine (overall 0%)" once): it says
    who holds the engine as generate does."""
    story = tmp_path / "story.toml"
    story.write_text('width = 96\nheight = 64\nsteps = 2\n\n[[shot]]\nprompt = "a fox"\nframes = 22\n')
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    job = None
    engine_pid = 0
    try:
        engine_pid = int(holder.stdout.readline())
        job = subprocess.Popen([sys.executable, "-m", "h3bridge.cli", "story", str(story), "--engine", "one-shot",
                                "--engine-path", str(sim_engine_path()), "--model-dir", str(model_dir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen: list[str] = []
        lines = line_reader(job.stderr)
        first = read_until(lines, r"waiting for the engine: held by (.*)", seen, time.monotonic() + 120)
        user = pwd.getpwuid(os.geteuid()).pw_name
        assert re.fullmatch(rf"sleep started by python\S* \(process {engine_pid} of user {re.escape(user)}\)",
                            first[1]), first[1]
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        assert job.wait(timeout=120) == 0, "".join(seen)
    finally:
        for process in (job, holder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=60)
        if engine_pid and holder.returncode != 0:
            try:
                os.kill(engine_pid, 9)
            except ProcessLookupError:
                pass
    assert (tmp_path / "story.mp4").is_file()


def test_without_a_terminal_a_storys_long_wait_prints_a_few_lines(capsys: pytest.CaptureFixture[str]) -> None:
    display = StoryProgressDisplay(terminal=False)
    for event in wait_events([i / 10 for i in range(0, 6000)]):      # ten minutes of 0.1 s polls
        display(StoryProgress(1, 2, WAITING_PHASE, 0.0, 0.0, event.elapsed, None, event))
    display(StoryProgress(1, 2, "text encoder", 0.0, 0.0, 600.0, None, ProgressEvent("text encoder", 0, 1, 0.0, 600.0)))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "h3bridge: waiting for the engine: held by h3 started by h3bridge serve (process 7 of " \
                       "user ann)"
    assert [int(re.search(r"\((\d+) s\)", line)[1]) for line in lines[1:-1]] == [10, 30, *range(60, 600, 60)]
    assert all("held by h3 started by h3bridge serve" in line for line in lines[:-1])
    assert lines[-1].startswith("h3bridge: shot 1/2: text encoder")
