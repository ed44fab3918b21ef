"""Shared helpers for the h3-sim tests (tests/test_sim_*.py)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from h3bridge.sim.cli import main as sim_main
from h3bridge.sim.fixture import write_fixture_model

PROGRAM = "h3"   # argv[0] used for in-process runs, so messages read like the real h3's


@dataclass
class Run:
    code: int
    out: str
    err: str


def run_sim(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    """Run h3-sim's main in-process with argv[0] = "h3".

    main.c setenv()s H3_PROFILE for --profile, and so does the sim: in a real process that dies
    with it, so the environment is restored here to keep in-process runs independent."""
    capsys.readouterr()
    saved = dict(os.environ)
    try:
        code = sim_main([PROGRAM, *args])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


def sim_program() -> str:
    path = shutil.which("h3-sim")
    if path is None:
        pytest.skip("h3-sim console script not installed (pip install -e .)")
    return path


def run_sim_process(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                    timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the installed h3-sim console script as a child process.

    Output is decoded by hand: text mode would turn cli_progress's '\r' into newlines."""
    merged = dict(os.environ)
    merged.update(env or {})
    done = subprocess.run([sim_program(), *args], capture_output=True, env=merged, cwd=cwd,
                          timeout=timeout)
    return subprocess.CompletedProcess(done.args, done.returncode,
                                       done.stdout.decode("utf-8", "replace"),
                                       done.stderr.decode("utf-8", "replace"))


def make_model(path: Path, *, ref2va: bool = True) -> Path:
    return write_fixture_model(path, realistic=False, ref2va=ref2va)


def progress_records(stderr: str) -> list[tuple[str, int, int]]:
    """Parse main.c cli_progress output back into (phase, done, total) records."""
    records = []
    for match in re.finditer(r"\r(.{25}) +(\d+)/(\d+) *", stderr):
        records.append((match.group(1).rstrip(), int(match.group(2)), int(match.group(3))))
    return records


def make_image(path: Path, color: str, size: str = "80x60") -> Path:
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"color=c={color}:s={size}",
                    "-frames:v", "1", str(path)], check=True)
    return path


def make_video(path: Path, seconds: float, *, audio: bool = True, size: str = "96x64") -> Path:
    command = ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc=size={size}:rate=24"]
    if audio:
        command += ["-f", "lavfi", "-i", "sine=f=440:sample_rate=32000"]
    command += ["-t", str(seconds), "-c:v", "libx264", "-pix_fmt", "yuv420p"]
    command += ["-c:a", "aac"] if audio else ["-an"]
    subprocess.run([*command, str(path)], check=True)
    return path


def make_audio(path: Path, seconds: float) -> Path:
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                    "sine=f=330:sample_rate=32000", "-t", str(seconds), "-ac", "2", str(path)],
                   check=True)
    return path


def read_ppm(path: Path) -> tuple[bytes, np.ndarray]:
    """(header bytes, HxWx3 pixels) of a binary P6 file as main.c cli_frame writes it."""
    data = path.read_bytes()
    magic, dims, maxval, rest = data.split(b"\n", 3)
    width, height = (int(v) for v in dims.split())
    return magic + b"\n" + dims + b"\n" + maxval + b"\n", np.frombuffer(rest, np.uint8).reshape(height, width, 3)


__all__ = ["Run", "run_sim", "run_sim_process", "make_model", "progress_records",
           "make_image", "make_video", "make_audio", "read_ppm", "sim_program"]
