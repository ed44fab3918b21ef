"""main.c's cli_state with its progress and frame callbacks (cli_progress, cli_frame): what the one-shot
CLI (cli.py, main.c) and the interactive mode (interactive.py, h3_cli.c) print while a clip renders.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from . import terminal
from .engine import SimFrame


def terminal_protocol() -> str | None:
    """h3_terminal_detect (h3_terminal.c:29-38): the protocol name, or None."""
    return terminal.detect()


@dataclass
class CliState:
    """main.c cli_state (:145-154) with cli_progress and cli_frame."""

    phase: str = ""
    active: bool = False
    completed: int = -1
    total: int = -1
    terminal: str | None = None
    display_failed: bool = False
    frames_dir: str | None = None
    frame_write_failed: bool = False

    def progress(self, phase: str, completed: int, total: int) -> bool:
        # state->phase is char[64]: comparisons see at most 63 bytes, the line shows all.
        stored = phase.encode("utf-8", "surrogateescape")[:63].decode("utf-8", "ignore")
        if stored == self.phase and completed == self.completed and total == self.total:
            return False
        err = sys.stderr
        if stored != self.phase:
            if self.active:
                err.write("\n")
            self.phase = stored
        self.completed, self.total = completed, total
        self.active = completed < total
        err.write(f"\r{phase:<25} {completed:4d}/{total:<4d}")
        if not self.active:
            err.write("\n")
        err.flush()
        return False

    def frame(self, frame: SimFrame) -> bool:
        preview = frame.denoise_step >= 0
        if not preview and self.frames_dir and not self.frame_write_failed:
            self._write_ppm(frame)
        if self.frame_write_failed:
            return True
        if self.display_failed or self.terminal is None:
            return False
        if self.active:
            sys.stderr.write("\n")
            self.active = False
        if preview:
            sys.stderr.write(f"h3: denoise preview {frame.denoise_step + 1}/{frame.denoise_steps}, "
                             f"video frame {frame.frame_index + 1}/{frame.frame_count} "
                             f"via {self.terminal}\n")
        else:
            sys.stderr.write(f"h3: frame {frame.frame_index + 1}/{frame.frame_count} "
                             f"via {self.terminal}\n")
        sys.stderr.flush()
        try:
            terminal.display_rgb24(self.terminal, frame.rgb)    # graphics on stdout (main.c:221-227)
        except terminal.TerminalError as error:
            sys.stderr.write(f"h3: terminal display disabled: {error}\n")
            sys.stderr.flush()
            self.display_failed = True
        return False

    def _write_ppm(self, frame: SimFrame) -> None:
        assert self.frames_dir is not None
        path = f"{self.frames_dir}/frame-{frame.frame_index:04d}.ppm"
        handle = None
        if len(path.encode("utf-8", "surrogateescape")) < 1024:   # char path[1024]
            try:
                handle = open(path, "wb")
            except OSError:
                handle = None
        if handle is None:
            sys.stderr.write(f"h3: cannot write frame {frame.frame_index} to {self.frames_dir}\n")
            self.frame_write_failed = True
            return
        try:
            with handle:
                handle.write(f"P6\n{frame.width} {frame.height}\n255\n".encode("ascii"))
                handle.write(frame.rgb.tobytes())
        except OSError:
            self.frame_write_failed = True
            sys.stderr.write(f"h3: incomplete frame {frame.frame_index} in {self.frames_dir}\n")
