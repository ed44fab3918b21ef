"""Parsing h3's stderr (main.c cli_progress format) and supervising an engine process group."""
from __future__ import annotations

import os
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3bridge.engine import engine_message_from, expected_phases
from h3bridge.engine_process import EngineProcess
from h3bridge.progress import PHASE_ORDER, ProgressTracker, is_complete_progress, parse_progress
from core_helpers import assert_group_gone, fast_request


def upstream_record(phase: str, done: int, total: int) -> str:
    """Exactly main.c cli_progress: fprintf(stderr, "\\r%-25s %4d/%-4d", phase, done, total)."""
    return "\r%-25s %4d/%-4d" % (phase, done, total)


@given(st.sampled_from(PHASE_ORDER + ("a phase name longer than twenty-five columns",)),
       st.integers(0, 99999), st.integers(0, 99999))
def test_every_upstream_record_parses(phase: str, done: int, total: int) -> None:
    piece = upstream_record(phase, done, total)[1:]
    assert parse_progress(piece) == (phase, done, total)
    assert is_complete_progress(piece)


def test_torn_records_are_not_complete_and_messages_are_not_progress() -> None:
    piece = upstream_record("denoise", 12, 20)[1:]
    assert not is_complete_progress(piece[:-3])       # "denoise ... 12/2" may still be growing
    assert parse_progress("h3: wrote outputs/h3.mp4") is None
    assert parse_progress("h3 profile: denoise 12/20") is None
    assert parse_progress("") is None


def test_tracker_feed_takes_whole_records_only() -> None:
    """The one path both engines use for stderr pieces: torn tails wait, messages are skipped."""
    tracker = ProgressTracker(["tokenizer", "denoise"], started=0.0)
    piece = upstream_record("denoise", 12, 20)[1:]
    assert tracker.feed(piece[:-3], complete=False, now=1.0) is None          # still growing
    assert tracker.feed("h3: warning: slow disk", complete=True, now=1.0) is None
    event = tracker.feed(piece, complete=False, now=1.5)                      # whole, though unterminated
    assert event is not None and (event.phase, event.done, event.total) == ("denoise", 12, 20)
    assert tracker.feed(piece, complete=True, now=2.0) is None                # the same record again


def test_tracker_fraction_is_monotonic_and_dedups() -> None:
    tracker = ProgressTracker(["tokenizer", "text encoder", "denoise"], started=0.0)
    assert tracker.update("tokenizer", 0, 1, now=0.0).fraction == 0.0
    assert tracker.update("tokenizer", 0, 1, now=0.1) is None        # main.c also deduplicates
    mid = tracker.update("denoise", 1, 2, now=1.0)
    back = tracker.update("text encoder", 3, 50, now=2.0)            # out-of-order phase never goes back
    assert back.fraction == mid.fraction and back.elapsed == 2.0
    assert tracker.update("denoise", 2, 2, now=3.0).fraction == pytest.approx(1.0)
    timings = tracker.finish(now=4.0)
    assert timings["total"] == 4.0 and timings["denoise"] == pytest.approx(2.0)


def test_expected_phases_follow_the_job() -> None:
    assert "FFmpeg" not in expected_phases(fast_request(), writes_mp4=False)
    assert "Qwen vision" not in expected_phases(fast_request(), writes_mp4=True)


def test_engine_message_is_the_last_error_line() -> None:
    stderr = ("tokenizer 1/1\nh3: warning: --reuse with only 2 denoising steps ...\n"
              "\rdenoise      1/2   \nh3: Metal command buffer failed: Internal Error\n")
    assert engine_message_from(stderr) == "Metal command buffer failed: Internal Error"
    assert engine_message_from("h3: wrote x.mp4\n") is None


CHILD = r"""
import os, subprocess, sys, time
sys.stderr.write("\rtokenizer                    0/1   "); sys.stderr.flush()
sys.stderr.write("\rtokenizer                    1/1   \n"); sys.stderr.flush()
sys.stderr.write("h3: ünïcødé message\n"); sys.stderr.flush()
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(grandchild.pid, flush=True)
time.sleep(60)
"""


def test_process_group_is_stopped_with_grandchildren(tmp_path) -> None:
    out = open(tmp_path / "stdout", "w+b")
    process = EngineProcess([sys.executable, "-c", CHILD], stdout=out)
    assert process.pgid == process.pid and os.getpgid(process.pid) == process.pid != os.getpgid(0)
    pieces = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any("message" in p.text for p in pieces):
        piece = process.next_piece(0.1)
        if piece is not None:
            pieces.append(piece)
    texts = [p.text for p in pieces if p.complete]
    assert texts[:3] == ["tokenizer                    0/1   ", "tokenizer                    1/1   ",
                         "h3: ünïcødé message"]
    while not (tmp_path / "stdout").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    grandchild = int((tmp_path / "stdout").read_text().split()[0])
    assert os.getpgid(grandchild) == process.pgid
    started = time.monotonic()
    process.stop()
    assert time.monotonic() - started < 5
    assert_group_gone(process.pgid)
    with pytest.raises(ProcessLookupError):
        os.kill(grandchild, 0)
    assert process.popen.returncode < 0
    assert "ünïcødé" in process.stderr_text
    process.stop()                                       # idempotent


def test_signal_names_cover_signals_python_cannot_name() -> None:
    """A crash by a Linux real-time signal (valid, but without an enum name) still gets a message,
    not a ValueError from signal.Signals."""
    from h3bridge.engine_process import signal_name
    assert signal_name(11) == "SIGSEGV" and signal_name(9) == "SIGKILL"
    assert signal_name(40) == "signal 40"
