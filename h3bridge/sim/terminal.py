"""h3_terminal.c for h3-sim: terminal detection, zoom, and the graphics `--show` / `!show` draw.

The real h3 writes each displayed frame to stdout as terminal-graphics escape sequences, so a
caller reading h3's stdout sees them; the simulator writes the same bytes:

- Kitty graphics (h3_terminal.c:121-161 `kitty_display`): the packed RGB24 frame in base64,
  4096-character chunks, the first introduced by `ESC _G a=T,f=24,t=d,s=W,v=H,w=W*zoom,
  h=H*zoom,m=MORE;`, the others by `ESC _G m=MORE;`, each closed by `ESC \\`; then "\\n".
- iTerm2 inline images (:163-284 `iterm2_display`): the frame goes to a mkstemp file
  `/tmp/h3-terminal-rgb-XXXXXX`, `ffmpeg` (found through PATH; H3_FFMPEG is not consulted
  here) turns it into `/tmp/h3-terminal-XXXXXX.png`, and the PNG is sent base64-encoded as
  `ESC ]1337;File=inline=1;width=Npx;height=Npx:` ... BEL "\\n". Both temporaries are removed.
Every draw ends with fflush(stdout). Errors carry upstream's texts.
"""
from __future__ import annotations

import base64
import os
import sys
import tempfile

import numpy as np

from .libc import strerror

KITTY = "Kitty graphics"            # h3_terminal_protocol_name (h3_terminal.c:40-46)
ITERM2 = "iTerm2 inline images"
_KITTY_CHUNK = 4096
_INT_MAX = 2**31 - 1

_zoom = 2   # h3_terminal.c:19 `terminal_zoom` (Retina default)


class TerminalError(Exception):
    """The `error` text of a failed h3_terminal_display_rgb24."""


def detect() -> str | None:
    """h3_terminal_detect (h3_terminal.c:29-38): the protocol name, or None (H3_TERM_NONE)."""
    env = os.environ
    if env.get("KITTY_WINDOW_ID") is not None or env.get("GHOSTTY_RESOURCES_DIR") is not None:
        return KITTY
    if (env.get("TERM_PROGRAM") == "iTerm.app" or env.get("ITERM_SESSION_ID") is not None
            or env.get("WEZTERM_PANE") is not None or env.get("KONSOLE_VERSION") is not None):
        return ITERM2
    return None


def set_zoom(zoom: int) -> bool:
    """h3_terminal_set_zoom (h3_terminal.c:48-52): at least 1."""
    global _zoom
    if zoom < 1:
        return False
    _zoom = zoom
    return True


def _display_size(width: int, height: int) -> tuple[int, int] | None:
    """h3_terminal_display_dimensions (h3_terminal.c:54-62)."""
    if width < 1 or height < 1 or width > _INT_MAX // _zoom or height > _INT_MAX // _zoom:
        return None
    return width * _zoom, height * _zoom


def _write(text: str) -> None:
    sys.stdout.write(text)


def _kitty(pixels: bytes, width: int, height: int) -> None:
    size = _display_size(width, height)
    if size is None:
        raise TerminalError("invalid Kitty display dimensions")
    encoded = base64.b64encode(pixels).decode("ascii")
    for offset in range(0, len(encoded), _KITTY_CHUNK):
        chunk = encoded[offset:offset + _KITTY_CHUNK]
        more = int(offset + len(chunk) < len(encoded))
        if offset == 0:
            _write(f"\033_Ga=T,f=24,t=d,s={width},v={height},w={size[0]},h={size[1]},m={more};")
        else:
            _write(f"\033_Gm={more};")
        _write(chunk + "\033\\")
    _write("\n")
    sys.stdout.flush()


def _encode_png(pixels: bytes, width: int, height: int) -> bytes:
    """encode_png + read_file (h3_terminal.c:175-250)."""
    try:
        raw_fd, raw_path = tempfile.mkstemp(prefix="h3-terminal-rgb-", dir="/tmp")
    except OSError as error:
        raise TerminalError("cannot create terminal RGB temporary file: "
                            f"{strerror(error.errno or 0)}") from None
    try:
        try:
            with os.fdopen(raw_fd, "wb") as raw:
                raw.write(pixels)
        except OSError as error:
            raise TerminalError("cannot write terminal RGB temporary file: "
                                f"{strerror(error.errno or 0)}") from None
        try:
            png_fd, png_path = tempfile.mkstemp(prefix="h3-terminal-", suffix=".png", dir="/tmp")
        except OSError as error:
            raise TerminalError("cannot create terminal PNG temporary file: "
                                f"{strerror(error.errno or 0)}") from None
        os.close(png_fd)
        argv = ["ffmpeg", "-v", "error", "-y", "-f", "rawvideo", "-pixel_format", "rgb24",
                "-video_size", f"{width}x{height}", "-i", raw_path, "-frames:v", "1", png_path]
        try:
            child = os.posix_spawnp("ffmpeg", argv, os.environ)
        except OSError as error:
            os.unlink(png_path)
            raise TerminalError("FFmpeg cannot encode terminal PNG: "
                                f"{strerror(error.errno or 0)}") from None
        _, status = os.waitpid(child, 0)
    finally:
        os.unlink(raw_path)
    try:
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status):
            raise TerminalError("FFmpeg cannot encode terminal PNG")
        try:
            with open(png_path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise TerminalError(f"cannot read terminal PNG: {strerror(error.errno or 0)}") from None
        if not data:
            raise TerminalError("cannot read terminal PNG: Undefined error: 0")   # ftell < 1
        return data
    finally:
        os.unlink(png_path)


def _iterm2(pixels: bytes, width: int, height: int) -> None:
    size = _display_size(width, height)
    if size is None:
        raise TerminalError("invalid iTerm2 display dimensions")
    png = _encode_png(pixels, width, height)
    _write(f"\033]1337;File=inline=1;width={size[0]}px;height={size[1]}px:")
    _write(base64.b64encode(png).decode("ascii"))
    _write("\a\n")
    sys.stdout.flush()


def display_rgb24(protocol: str | None, rgb: np.ndarray) -> None:
    """h3_terminal_display_rgb24 (h3_terminal.c:286-304); raises TerminalError on failure."""
    height, width = int(rgb.shape[0]), int(rgb.shape[1])
    pixels = np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()
    if protocol == KITTY:
        _kitty(pixels, width, height)
    elif protocol == ITERM2:
        _iterm2(pixels, width, height)
    else:
        raise TerminalError("no supported graphical terminal detected")
