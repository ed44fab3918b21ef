"""Issue 31: Ctrl-Z on `h3bridge generate` pauses the engine with the command. SIGTSTP (what the
terminal sends on Ctrl-Z) stops the engine's process group, says so (memory stays resident), and
stops the CLI; SIGCONT (`fg`) continues both, and the clip is the one an unpaused run makes. While
paused the engine's CPU time does not advance."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from h3bridge.engines.groups import all_stopped
import pytest

from core_helpers import model_dir, pause_notice, sim_engine_path, sim_invocations  # noqa: F401 (fixture)
from story_helpers import decode_film

FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "8"]
WAIT = 120.0        # a safety net for a loaded machine, never an expected time
PAUSED_FOR = 2.0    # longer than the engine's remaining sleeps at this time scale
LONG_PHASE_LINE = "h3bridge: load transformer core"     # h3-sim's longest phase for a small clip


def default_signals() -> None:
    """A test run as a background job inherits SIGINT/SIGTSTP ignored; the child must hear them."""
    for signum in (signal.SIGINT, signal.SIGTSTP, signal.SIGCONT):
        signal.signal(signum, signal.SIG_DFL)


def generate_argv(output: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "h3bridge.cli", "generate", "-p", "a fox in the snow", *FLAGS, "-o", str(output),
            "--engine-path", str(sim_engine_path()), "--model-dir", str(model), *extra]


def wait_until(condition, what: str):
    deadline = time.monotonic() + WAIT
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return value


def stopped(processes: list[psutil.Process]) -> bool:
    return all_stopped(processes)      # (or held in vfork by a child stopped before its exec)


def engine_group(pid: int) -> list[psutil.Process]:
    engine = psutil.Process(pid)
    return [engine, *engine.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(sum(process.cpu_times()[:2]) for process in processes)


def test_ctrl_z_pauses_the_engine_and_fg_finishes_the_same_clip(tmp_path: Path, model_dir: Path) -> None:
    log = tmp_path / "sim-log.jsonl"
    env = {**os.environ, "H3_SIM_TIME_SCALE": "0.05", "H3_SIM_LOG": str(log)}
    reference = subprocess.run(generate_argv(tmp_path / "reference.mp4", model_dir, "--quiet"), env=env,
                               capture_output=True, text=True, timeout=WAIT)
    assert reference.returncode == 0, reference.stderr
    cli = subprocess.Popen(generate_argv(tmp_path / "paused.mp4", model_dir), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    assert cli.stderr is not None
    try:
        for line in cli.stderr:
            if line.startswith(LONG_PHASE_LINE):
                break
        cli.send_signal(signal.SIGTSTP)       # what the terminal sends on Ctrl-Z
        said = pause_notice(cli.stderr)
        assert "paused: the engine is stopped where it was and its memory stays in use (resident)" in said, said
        assert "`fg` resumes it" in said
        wait_until(lambda: stopped([psutil.Process(cli.pid)]), "the CLI never stopped itself")
        group = wait_until(lambda: (g := engine_group(sim_invocations(log)[1]["pid"])) and stopped(g) and g,
                           "the engine's group was never stopped")
        cpu = cpu_seconds(group)
        time.sleep(PAUSED_FOR)
        assert cpu_seconds(group) == cpu, "the paused engine used CPU"
        assert stopped(group) and not (tmp_path / "paused.mp4").exists()
        cli.send_signal(signal.SIGCONT)       # what `fg` sends
        rest = cli.stderr.read()
        assert cli.wait(timeout=WAIT) == 0, rest
    finally:
        if cli.poll() is None:
            cli.send_signal(signal.SIGCONT)
            cli.kill()
    assert "h3bridge: resumed" in rest and "wrote" in rest
    frames, audio, _ = decode_film(tmp_path / "paused.mp4")
    expected_frames, expected_audio, _ = decode_film(tmp_path / "reference.mp4")
    assert np.array_equal(frames, expected_frames) and np.array_equal(audio, expected_audio)


def test_a_sigtstp_the_caller_ignores_stays_ignored(tmp_path: Path, model_dir: Path) -> None:
    """nohup-style callers that ignore SIGTSTP: the job runs on, nothing is paused."""
    def ignore_tstp() -> None:
        signal.signal(signal.SIGTSTP, signal.SIG_IGN)

    env = {**os.environ, "H3_SIM_TIME_SCALE": "0.05"}
    cli = subprocess.Popen(generate_argv(tmp_path / "a.mp4", model_dir), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, preexec_fn=ignore_tstp)
    assert cli.stderr is not None
    for line in cli.stderr:
        if line.startswith(LONG_PHASE_LINE):
            cli.send_signal(signal.SIGTSTP)
            break
    rest = cli.stderr.read()
    assert cli.wait(timeout=WAIT) == 0 and "paused" not in rest and (tmp_path / "a.mp4").is_file()


def test_ctrl_z_pauses_generate_takes_and_fg_finishes_the_same_takes(tmp_path: Path, model_dir: Path) -> None:
    """`generate --takes 2`: Ctrl-Z during the first take stops its engine and the CLI; `fg` goes on
    and both takes are the ones an unpaused run makes."""
    log = tmp_path / "sim-log.jsonl"
    env = {**os.environ, "H3_SIM_TIME_SCALE": "0.05", "H3_SIM_LOG": str(log)}
    reference = subprocess.run(generate_argv(tmp_path / "reference.mp4", model_dir, "--takes", "2", "--quiet"),
                               env=env, capture_output=True, text=True, timeout=WAIT)
    assert reference.returncode == 0, reference.stderr
    before = len(sim_invocations(log))
    cli = subprocess.Popen(generate_argv(tmp_path / "paused.mp4", model_dir, "--takes", "2"), env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    assert cli.stderr is not None
    try:
        for line in cli.stderr:
            if line.startswith(LONG_PHASE_LINE):
                break
        cli.send_signal(signal.SIGTSTP)
        said = pause_notice(cli.stderr)
        assert "paused: the engine is stopped where it was" in said, said
        wait_until(lambda: stopped([psutil.Process(cli.pid)]), "the CLI never stopped itself")
        group = wait_until(lambda: (g := engine_group(sim_invocations(log)[before]["pid"])) and stopped(g) and g,
                           "the first take's engine group was never stopped")
        cpu = cpu_seconds(group)
        time.sleep(PAUSED_FOR)
        assert cpu_seconds(group) == cpu, "the paused engine used CPU"
        assert len(sim_invocations(log)) == before + 1, "a second take started while paused"
        cli.send_signal(signal.SIGCONT)
        rest = cli.stderr.read()
        assert cli.wait(timeout=WAIT) == 0, rest
    finally:
        if cli.poll() is None:
            cli.send_signal(signal.SIGCONT)
            cli.kill()
    assert "h3bridge: resumed" in rest and "wrote 2 takes" in rest
    for take in (1, 2):
        frames, audio, _ = decode_film(tmp_path / f"paused.take{take}.mp4")
        expected_frames, expected_audio, _ = decode_film(tmp_path / f"reference.take{take}.mp4")
        assert np.array_equal(frames, expected_frames) and np.array_equal(audio, expected_audio)
