"""The CLI's progress bars in a real terminal (a pty), including one that reports 0 columns."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import sys
import termios

import pytest

CHILD = r"""
from h3bridge.cli.main import PhaseProgressBars
from h3bridge.progress import ProgressEvent
bars = PhaseProgressBars()          # decides by itself that stderr is a terminal
for done in range(6):
    bars(ProgressEvent("denoise", done, 5, done / 5, float(done)))
bars.close()
"""


def progress_in_a_pty(columns: int, env: dict[str, str]) -> str:
    """Run CHILD with stdin/stdout/stderr on a pty sized `columns` x 24; all it wrote, to EOF."""
    pid, fd = pty.fork()
    if pid == 0:                                            # the child: never returns into pytest
        try:
            os.execve(sys.executable, [sys.executable, "-c", CHILD], {**os.environ, **env})
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    output = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:                                     # EIO: the child closed its side
            break
        if not chunk:
            break
        output += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, output.decode("utf-8", "replace")
    return output.decode("utf-8", "replace")


def last_bar(output: str) -> str:
    return [piece for piece in re.split(r"[\r\n]+", output) if piece.strip()][-1]


@pytest.mark.parametrize("env", [{}, {"COLUMNS": "0"}], ids=["unsized pty", "unsized pty, COLUMNS=0"])
def test_a_terminal_of_zero_columns_gets_a_whole_80_column_bar(env: dict[str, str]) -> None:
    """Issue 9 item 7: tqdm took the 0 at its word and trimmed the line (the bar one cell, the
    overall figure cut off); the CLI now draws 80 columns (less the one that would wrap)."""
    bar = last_bar(progress_in_a_pty(0, env))
    assert bar.endswith("overall 100%, 5.0 s"), bar
    assert len(bar) == 79, bar


def test_a_sized_terminal_keeps_its_width() -> None:
    bar = last_bar(progress_in_a_pty(120, {}))
    assert bar.endswith("overall 100%, 5.0 s") and len(bar) == 119, bar


def test_columns_fills_in_when_the_terminal_reports_none() -> None:
    bar = last_bar(progress_in_a_pty(0, {"COLUMNS": "100"}))
    assert len(bar) == 99, bar
