"""`h3bridge history` and `h3bridge stats` (h3bridge/cli/history.py), and the ETA on the CLI's
progress and on the ComfyUI node's text."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core_helpers import sim_engine_path
from h3bridge.sim.fixture import write_fixture_model
from h3bridge.cli.main import PhaseProgressBars, main
from h3bridge.comfy.adapter import NodeText, ProgressForwarder
from h3bridge.history import HistoryStore
from h3bridge.history.job import Device
from h3bridge.history.stats import FINISHING, shape_stats
from h3bridge.history.store import CANCELLED, COMPLETED, FAILED, JobEnd, NewJob, history_path
from h3bridge.progress import ProgressEvent

FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]
STUDIO = Device("Apple M3 Ultra", 256 * 2**30)
LAPTOP = Device("Apple M4 Pro", 48 * 2**30)


@pytest.fixture(scope="module")
def sim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fixture model for h3-sim (h3bridge/sim/fixture.py)."""
    return write_fixture_model(tmp_path_factory.mktemp("model") / "MiniMax-H3")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "h3bridge.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def add(store: HistoryStore, device: Device, shape: str, phases: dict[str, float], *, total: float,
        waited: float = 0.0, outcome: str = COMPLETED, started: float = 1_700_000_000.0,
        prompt: str = "a fox", message: str | None = None, engine: str = "one-shot") -> int:
    return store.add_job(NewJob(engine=engine, device=device, shape=shape, request={"prompt": prompt},
                                started_at=started),
                         JobEnd(outcome=outcome, phases=phases, total_seconds=total, waited_seconds=waited,
                                message=message, error_type=None if message is None else "EngineError"))


@pytest.fixture
def known_history() -> HistoryStore:
    """Known durations: on the studio, three completed 864x480 runs (text encoder 10/12/30 s,
    denoise 80/95/90 s; run totals 100-5 waited, 120, 130) beside a failed one that must not
    count; two completed 480x864 runs (text encoder 4 and 7 s: an even median); one laptop run."""
    store = HistoryStore()
    wide, tall = "864x480 56f 20 steps", "480x864 56f 20 steps"
    add(store, STUDIO, wide, {"text encoder": 10.0, "denoise": 80.0}, total=100.0, waited=5.0, started=1.0)
    add(store, STUDIO, wide, {"text encoder": 12.0, "denoise": 95.0}, total=120.0, started=2.0)
    add(store, STUDIO, wide, {"text encoder": 30.0, "denoise": 90.0, FINISHING: 1.5}, total=130.0, started=3.0)
    add(store, STUDIO, wide, {"text encoder": 500.0}, total=501.0, outcome=FAILED, started=4.0,
        message="h3 failed: Metal command buffer failed")
    add(store, STUDIO, tall, {"text encoder": 4.0}, total=20.0, started=5.0)
    add(store, STUDIO, tall, {"text encoder": 7.0}, total=30.0, started=6.0, engine="session")
    add(store, LAPTOP, wide, {"text encoder": 25.0, "denoise": 400.0}, total=450.0, started=7.0)
    add(store, LAPTOP, wide, {"text encoder": 26.0}, total=40.0, outcome=CANCELLED, started=8.0,
        prompt="a very long prompt about a red fox running through deep snow at dawn, golden light",
        message="generation cancelled; the engine was stopped and no output was kept")
    return store


# ----------------------------------------------------------------------------- stats

def test_stats_are_medians_and_ranges_of_completed_jobs_per_device_and_shape(known_history: HistoryStore) -> None:
    stats = {(s.device.name, s.shape): s for s in shape_stats(known_history.completed_jobs())}
    assert set(stats) == {("Apple M3 Ultra", "864x480 56f 20 steps"), ("Apple M3 Ultra", "480x864 56f 20 steps"),
                          ("Apple M4 Pro", "864x480 56f 20 steps")}
    wide = stats["Apple M3 Ultra", "864x480 56f 20 steps"]
    assert wide.runs == 3 and wide.device.memory_bytes == 256 * 2**30
    assert vars(wide.phases["text encoder"]) == {"runs": 3, "median": 12.0, "low": 10.0, "high": 30.0}
    assert vars(wide.phases["denoise"]) == {"runs": 3, "median": 90.0, "low": 80.0, "high": 95.0}
    assert vars(wide.phases[FINISHING]) == {"runs": 1, "median": 1.5, "low": 1.5, "high": 1.5}
    assert vars(wide.total) == {"runs": 3, "median": 120.0, "low": 95.0, "high": 130.0}   # 100 less 5 waited
    tall = stats["Apple M3 Ultra", "480x864 56f 20 steps"]
    assert vars(tall.phases["text encoder"]) == {"runs": 2, "median": 5.5, "low": 4.0, "high": 7.0}
    assert stats["Apple M4 Pro", "864x480 56f 20 steps"].runs == 1


def test_stats_command_prints_them(known_history: HistoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:8] == [
        "Apple M3 Ultra, 256 GiB",
        "  864x480 56f 20 steps (3 completed runs)",
        "    phase                        median  range                 runs",
        "    text encoder                 12.0 s  10.0 s - 30.0 s          3",
        "    denoise                      90.0 s  80.0 s - 95.0 s          3",
        "    finishing                   1.500 s  1.500 s - 1.500 s        1",
        "    total                       120.0 s  95.0 s - 130.0 s         3",
        "  480x864 56f 20 steps (2 completed runs)",
    ]
    assert "    text encoder                5.500 s  4.000 s - 7.000 s        2" in lines
    assert "Apple M4 Pro, 48 GiB" in lines and "500.0 s" not in "\n".join(lines)    # the failed job is not in it


def test_stats_json(known_history: HistoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    [wide] = [s for s in stats if s["device"] == "Apple M3 Ultra" and s["shape"].startswith("864x480")]
    assert wide["runs"] == 3 and wide["memory_bytes"] == 256 * 2**30
    assert wide["phases"]["denoise"] == {"runs": 3, "median": 90.0, "low": 80.0, "high": 95.0}
    assert wide["total"] == {"runs": 3, "median": 120.0, "low": 95.0, "high": 130.0}


# ----------------------------------------------------------------------------- history

def test_history_lists_recent_jobs_newest_first(known_history: HistoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "-n", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].split()[:6] == ["id", "started", "engine", "status", "run", "shape"]
    assert lines[1].split()[0] == "8" and "cancelled" in lines[1] and "generation cancelled" in lines[1]
    assert "40.0 s" in lines[1]
    assert lines[2].split()[0] == "7" and "completed" in lines[2] and "450.0 s" in lines[2] and "a fox" in lines[2]
    assert lines[3].split()[0] == "6" and "session" in lines[3]


def test_history_json_has_the_whole_record(known_history: HistoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "--json", "--limit", "100"]) == 0
    jobs = json.loads(capsys.readouterr().out)
    assert [job["id"] for job in jobs] == [8, 7, 6, 5, 4, 3, 2, 1]
    failed = jobs[4]
    assert failed["outcome"] == failed["status"] == FAILED and failed["message"] == "h3 failed: Metal command buffer failed"
    assert failed["device"] == "Apple M3 Ultra" and failed["phases"] == {"text encoder": 500.0}
    assert jobs[7]["request"] == {"prompt": "a fox"} and jobs[7]["waited_seconds"] == 5.0


def test_history_without_jobs_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history"]) == 0 and main(["stats"]) == 0
    err = capsys.readouterr().err
    assert f"no jobs in {history_path()} yet" in err and "no completed jobs" in err
    assert main(["history", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []


def test_history_of_a_broken_file_fails_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    history_path().write_bytes(b"garbage" * 100)
    assert main(["history"]) == 1
    err = capsys.readouterr().err
    assert f"the job history {history_path()} is damaged" in err and "fix: move that file away" in err


def test_history_refuses_a_non_positive_limit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["history", "-n", "0"])
    assert raised.value.code == 2 and "0 is not a positive number of jobs" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the ETA, shown

def test_generate_shows_an_eta_once_the_shape_has_run_on_this_machine(sim_model: Path, tmp_path: Path) -> None:
    engine = ["--engine-path", str(sim_engine_path()), "--model-dir", str(sim_model)]
    first = cli("generate", "-p", "a red fox", *FAST_FLAGS, "-o", str(tmp_path / "a.mp4"), *engine)
    assert first.returncode == 0, first.stderr
    assert "h3bridge: denoise (overall" in first.stderr and "ETA" not in first.stderr
    other = cli("generate", "-p", "a red fox", *FAST_FLAGS[:4], "--frames", "39", "--steps", "2",
                "-o", str(tmp_path / "b.mp4"), *engine)
    assert other.returncode == 0 and "ETA" not in other.stderr          # another shape: still none
    again = cli("generate", "-p", "another fox", *FAST_FLAGS, "-o", str(tmp_path / "c.mp4"), "--engine", "session", *engine)
    assert again.returncode == 0, again.stderr
    phase_lines = [line for line in again.stderr.splitlines() if line.startswith("h3bridge: ") and "overall" in line]
    assert phase_lines and all(", ETA 0:0" in line for line in phase_lines), again.stderr
    listed = cli("history", "--json")
    jobs = json.loads(listed.stdout)
    assert [(job["engine"], job["shape"], job["outcome"]) for job in jobs] == [
        ("session", "96x64 22f 2 steps", COMPLETED), ("one-shot", "96x64 39f 2 steps", COMPLETED),
        ("one-shot", "96x64 22f 2 steps", COMPLETED)]
    assert jobs[0]["program"] in ("cli.py", "__main__.py", "h3bridge") and jobs[0]["pid"] != os.getpid()


def test_a_broken_history_warns_once_on_the_cli_and_the_clip_is_made(sim_model: Path, tmp_path: Path) -> None:
    history_path().write_bytes(b"\0garbage" * 500)
    done = cli("generate", "-p", "a red fox", *FAST_FLAGS, "-o", str(tmp_path / "a.mp4"),
               "--engine-path", str(sim_engine_path()), "--model-dir", str(sim_model))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.mp4").stat().st_size > 0
    assert done.stderr.count("job history skipped") == 1 and "the render goes on" in done.stderr


def test_terminal_bars_carry_the_eta() -> None:
    stream = io.StringIO()
    bars = PhaseProgressBars(terminal=True)
    saved = sys.stderr
    sys.stderr = stream
    try:
        bars(ProgressEvent("denoise", 3, 20, 0.4, 12.0, eta=65.4))
        bars(ProgressEvent("denoise", 4, 20, 0.45, 14.0))
        bars.close()
    finally:
        sys.stderr = saved
    text = stream.getvalue()
    assert "overall  40%, 12.0 s, ETA 1:05" in text
    later = [piece for piece in text.split("\r") if "overall  45%" in piece]
    assert later and all(piece.rstrip().endswith("overall  45%, 14.0 s") for piece in later)   # no estimate: none shown


def test_the_node_shows_its_notice_then_the_eta() -> None:
    shown: list[str] = []
    updates: list[tuple[int, int]] = []
    text = NodeText(shown.append)
    forward = ProgressForwarder(lambda value, total: updates.append((value, total)), on_eta=text.eta)
    text.notice("one-shot: 96x64, 22 frames")
    forward(ProgressEvent("tokenizer", 0, 1, 0.0, 0.1))                       # no past runs: no ETA
    forward(ProgressEvent("denoise", 1, 2, 0.5, 1.0, eta=3725.2))
    forward(ProgressEvent("denoise", 2, 2, 0.6, 1.1, eta=3725.0))             # same text: not sent again
    forward(ProgressEvent("FFmpeg", 0, 1, 0.9, 2.0, eta=4.0))
    assert shown == ["one-shot: 96x64, 22 frames",
                     "one-shot: 96x64, 22 frames\nETA 1:02:05 (from past runs of this shape on this machine)",
                     "one-shot: 96x64, 22 frames\nETA 0:04 (from past runs of this shape on this machine)"]
    assert updates == [(0, 1000), (500, 1000), (600, 1000), (900, 1000)]


def test_json_into_a_closed_pipe_is_not_an_error(known_history: HistoryStore) -> None:
    """`h3bridge history --json | head`: the reader left; no "Broken pipe", exit 0 (it was 1).
    The pipe's read end is closed before h3bridge starts, so every write to stdout fails."""
    for command in (["history", "--json"], ["stats", "--json"], ["plan", "--json", "--memory-gb", "64"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run([sys.executable, "-m", "h3bridge.cli", *command], stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write_end)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stderr == "", (command, done.stderr)
