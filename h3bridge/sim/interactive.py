"""h3-sim's interactive mode: upstream h3_cli.c `h3_cli_run` (and the linenoise.c parts it uses).

main.c calls `h3_cli_run(ctx, model_dir, &params, show, seed_given)` when there is no `-p`
and no `--info`; `h3bridge.sim.cli` calls `run(...)` here at the same point. Everything a
caller can observe is mirrored from h3_cli.c at 8974cc0 (line numbers below):

* caching on for the whole session (`h3_cache_set_enabled(ctx, 1)`, :697), so repeated
  prompts hit the conditioning / prepared-DiT / video-decoder caches of the generation core;
* a random 64-bit seed per job unless `--seed` was given (:710, `random_seed` :104);
* outputs `mkdtemp("/tmp/h3-XXXXXX")/video-%04u.mp4`, numbered before each run, so a
  failed run still uses up its number (:736, `generate` :414-418); `-o` and `--frames-dir`
  are not used (`params.output_path = NULL`, `on_frame` only for `!show` previews);
* history in `$HOME/.h3_history`: loaded with linenoise's default cap of 100 lines, then
  capped at 500, consecutive duplicates dropped, saved (mode 0600) at the end (:746-753, :786);
* input: when stdin is not a TTY, linenoise reads plain lines with no prompt and no length
  limit, and EOF ends the session (linenoise.c `linenoiseNoTTY` :1566). On a TTY the sim
  takes linenoise's "unsupported terminal" path (prints `h3> `, reads a line of at most
  4095 bytes); it does not implement line editing;
* output buffering: stdout gets C stdio's rule (line-buffered on a TTY, fully buffered
  otherwise, whatever PYTHONUNBUFFERED says) and is flushed only where upstream calls
  fflush(stdout): after the `Seed:` line of each job (:436) and at exit. So over a pipe
  `Done -> PATH` and command replies arrive late, as with the real h3. stderr (progress,
  `h3: ...`) is flushed on every write, as C's unbuffered stderr;
* every `!` command with upstream's exact replies (stdout) and errors (stderr).

With `!show` on, each preview and final frame is drawn to stdout in the detected terminal's
graphics protocol (h3bridge/sim/terminal.py, h3_terminal.c); `!open` spawns `open PATH`
like upstream (posix_spawnp, never waited for).
"""
from __future__ import annotations

import copy
import errno
import io
import math
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass, field, replace

from . import engine as core
from . import terminal
from .cli_state import CliState as ProgressPrinter
from .cli_state import terminal_protocol
from .ffmpeg import MediaFailure, probe_visual_size
from .libc import c_stdio_stdout, strerror, strtod
from .params import FPS, MAX_STEPS, MIN_DIT_LAYERS, DEFAULT_DIT_LAYERS, ReferenceKind, SimParams, \
    SimReference, align_frame_count, c_llround

CLI_PATH = 4096                  # h3_cli.c:23 H3_CLI_PATH
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
LONG_MIN, LONG_MAX = -2**63, 2**63 - 1   # strtol on LP64 (macOS arm64)
HISTORY_DEFAULT_MAX = 100        # linenoise.c:121 LINENOISE_DEFAULT_HISTORY_MAX_LEN
HISTORY_SESSION_MAX = 500        # h3_cli.c:752 linenoiseHistorySetMaxLen(500)
LINE_MAX = 4096                  # linenoise.c:122 LINENOISE_MAX_LINE


def _out(text: str) -> None:
    """printf/puts to stdout: no flush (block-buffered when stdout is not a TTY)."""
    sys.stdout.write(text)


def _err(text: str) -> None:
    """fprintf(stderr, ...): stderr is unbuffered in C."""
    sys.stderr.write(text)
    sys.stderr.flush()


# ----------------------------------------------------------------------------- C parsing helpers

# [0-9], not \d: Python's \d also matches non-ASCII digits ("٣") that strtol stops at.
_INT_PREFIX = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)")
_C_SPACE = " \t\n\v\f\r"


def _strtol(text: str) -> tuple[int | None, str, bool]:
    """strtol(text, &end, 10): (value or None if no digits, rest at `end`, overflowed)."""
    match = _INT_PREFIX.match(text)
    if not match:
        return None, text, False
    value = int(match[2]) * (-1 if match[1] == "-" else 1)
    overflow = not LONG_MIN <= value <= LONG_MAX
    return value, text[match.end():], overflow


def parse_i32(text: str, minimum: int, maximum: int) -> int | None:
    """h3_cli.c:58 `parse_i32`: strtol, trailing spaces allowed, [minimum, maximum]."""
    value, rest, overflow = _strtol(text)
    if value is None or overflow or rest.strip(_C_SPACE) or not minimum <= value <= maximum:
        return None
    return value


def parse_u64_value(text: str) -> int | None:
    """h3_cli.c:69 `parse_u64_value`: strtoull, so a leading '-' wraps modulo 2**64."""
    match = _INT_PREFIX.match(text)
    if not match or text[match.end():].strip(_C_SPACE):
        return None
    magnitude = int(match[2])
    if magnitude > UINT64_MAX:
        return None           # ERANGE
    return (-magnitude) % 2**64 if match[1] == "-" else magnitude


def parse_size(text: str) -> tuple[int, int] | None:
    """h3_cli.c:79 `parse_size`: "W" then 'x'/'X' right after it, then "H" (strtol skips spaces)."""
    width, middle, overflow = _strtol(text)
    if width is None or overflow or not middle or middle[0] not in "xX":
        return None
    height, end, overflow = _strtol(middle[1:])
    if height is None or overflow or end.strip(_C_SPACE) or width < 1 or height < 1 \
            or width > INT32_MAX or height > INT32_MAX:
        return None
    return width, height


def _format_g3(value: float) -> str:
    """printf("%.3g")."""
    return format(value, ".3g")


# ----------------------------------------------------------------------------- history (linenoise.c)

@dataclass
class History:
    """linenoise.c history: add drops consecutive duplicates and trims to the cap (:1663)."""

    max_len: int = HISTORY_DEFAULT_MAX
    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        if self.max_len == 0:
            return
        if self.lines and self.lines[-1] == line:
            return
        if len(self.lines) == self.max_len:
            del self.lines[0]
        self.lines.append(line)

    def set_max_len(self, length: int) -> None:
        """linenoise.c `linenoiseHistorySetMaxLen`: keeps the newest lines."""
        if length < 1:
            return
        self.lines = self.lines[-length:]
        self.max_len = length

    def load(self, path: str) -> None:
        """linenoise.c:1746 `linenoiseHistoryLoad`: fgets chunks of at most 4095 bytes, cut at \\r or \\n."""
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            return
        position = 0
        while position < len(data):
            newline = data.find(b"\n", position, position + LINE_MAX - 1)
            end = newline + 1 if newline >= 0 else min(position + LINE_MAX - 1, len(data))
            chunk = data[position:end]
            position = end
            cut = chunk.find(b"\r")
            if cut < 0:
                cut = chunk.find(b"\n")
            if cut >= 0:
                chunk = chunk[:cut]
            chunk = chunk.split(b"\0", 1)[0]
            self.add(chunk.decode("utf-8", "surrogateescape"))

    def save(self, path: str) -> None:
        """linenoise.c:1726 `linenoiseHistorySave`: umask 077 while creating, then chmod 0600."""
        old_umask = os.umask(stat.S_IXUSR | stat.S_IRWXG | stat.S_IRWXO)
        try:
            handle = open(path, "wb")
        except OSError:
            return
        finally:
            os.umask(old_umask)
        with handle:
            os.fchmod(handle.fileno(), stat.S_IRUSR | stat.S_IWUSR)
            for line in self.lines:
                handle.write(line.encode("utf-8", "surrogateescape") + b"\n")


_stdin_override: io.BufferedReader | None = None


def _stdin_reader() -> io.BufferedReader:
    """stdin as C stdio reads it: each refill takes whatever the pipe holds, up to the buffer.

    H3_SIM_STDIN_BUFFER=N refills N bytes at most. N=1 is the case where a line ends exactly at
    a refill boundary: the lines sent after it stay in the pipe, where the FFmpeg decoders h3
    spawns (they inherit stdin, h3_ffmpeg.c, and FFmpeg reads keys from it) can take bytes.
    """
    global _stdin_override
    size = os.environ.get("H3_SIM_STDIN_BUFFER")
    if not size:
        return sys.stdin.buffer
    if _stdin_override is None:
        _stdin_override = io.BufferedReader(io.FileIO(sys.stdin.fileno(), "rb", closefd=False),
                                            buffer_size=max(1, int(size)))
    return _stdin_override


def read_line(prompt: str) -> str | None:
    """linenoise.c:1602 `linenoise`, without line editing.

    Not a TTY (`linenoiseNoTTY`): read bytes up to '\\n' with no limit and no prompt; EOF with
    nothing read ends the input, EOF after some bytes returns them. A TTY: the "unsupported
    terminal" path, printf(prompt) + fflush + fgets of at most 4095 bytes, \\r/\\n stripped.
    """
    stdin = _stdin_reader()
    if not os.isatty(sys.stdin.fileno()) and not os.environ.get("LINENOISE_ASSUME_TTY"):
        data = stdin.readline()
        if not data:
            return None
        if data.endswith(b"\n"):
            data = data[:-1]
    else:
        _out(prompt)
        sys.stdout.flush()
        data = stdin.readline(LINE_MAX - 1)
        if not data:
            return None
        data = data.rstrip(b"\r\n")
    # C strings end at the first NUL byte.
    return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


# ----------------------------------------------------------------------------- the session state

@dataclass
class CliState:
    """h3_cli.c:25 `h3_cli_state`."""

    ctx: core.SimContext
    model_dir: str
    params: SimParams
    references: list[SimReference] = field(default_factory=list)
    first_frame: str | None = None
    last_frame: str | None = None
    output_dir: str = ""
    last_output: str = ""
    last_prompt: str | None = None
    output_count: int = 0
    random_seed: bool = False
    show: bool = False
    open_output: bool = False
    terminal: str | None = None      # h3_terminal_detect's protocol name; None = H3_TERM_NONE
    # h3_cli.c's cli_progress is byte-for-byte main.c's: reuse the sim CLI's printer for
    # phase/progress_active/completed/total.
    progress: ProgressPrinter = field(default_factory=ProgressPrinter)
    display_failed: bool = False


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(text: str) -> str:
    """What strcasecmp compares: ASCII letters folded, nothing else (str.lower() would also turn
    the Kelvin sign U+212A into "k", so "!to\u212aen-reduction" would pass)."""
    return text.translate(_ASCII_LOWER)


def _skip_spaces(text: str) -> str:
    return text.lstrip(_C_SPACE)


def cli_frame(state: CliState, frame: core.SimFrame) -> bool:
    """h3_cli.c:128 `cli_frame`: called for previews and final frames once !show is on."""
    if not state.show or state.display_failed or state.terminal is None:
        return False
    if state.progress.active:
        _err("\n")
        state.progress.active = False
    if frame.denoise_step >= 0:
        _err(f"h3: preview {frame.denoise_step + 1}/{frame.denoise_steps}\n")
    try:
        terminal.display_rgb24(state.terminal, frame.rgb)     # previews and final frames alike
    except terminal.TerminalError as error:
        _err(f"h3: display disabled: {error}\n")
        state.display_failed = True
    return False


def print_help() -> None:
    """h3_cli.c:149 `print_help`."""
    _out("Commands:\n"
         "  !help                    Show this help\n"
         "  !status                  Show current settings\n"
         "  !seed [N|random]         Set or show the seed\n"
         "  !size [WxH]              Set or show output size\n"
         "  !render-size [WxH|native]  Set internal render size\n"
         "  !frames [N]              Set or show requested frames\n"
         "  !seconds [N]             Set duration at 24 fps\n"
         "  !steps [N]               Set or show denoising steps\n"
         "  !reuse [N]               Set or show denoiser reuse\n"
         "  !layers [N]              Set or show active DiT blocks\n"
         "  !core-reuse [N]          Set or show core reuse\n"
         "  !token-reduction [on|off]  Toggle token reduction\n"
         "  !ssd-streaming [on|off]   Toggle original-BF16 SSD streaming\n"
         "  !int8-row-fc2 [on|off]    Toggle faster one-scale FC2\n"
         "  !reference-rope [on|off]  Toggle released spatial RoPE\n"
         "  !first [PATH|clear]      Set, show, or clear first frame\n"
         "  !last [PATH|clear]       Set, show, or clear last frame\n"
         "  !ref-image PATH          Append an ordered Ref2VA image\n"
         "  !refs [clear]            List or clear ordered references\n"
         "  !ref-remove N            Remove ordered reference N\n"
         "  !show [on|off]           Toggle denoising previews\n"
         "  !zoom N                  Set terminal image zoom\n"
         "  !open [on|off]           Toggle opening completed videos\n"
         "  !output [DIR]            Set or show the output directory\n"
         "  !save [PATH]             Copy the last generated video\n"
         "  !again                   Repeat the last prompt\n"
         "  !cache                   Show reusable-session cache state\n"
         "  !cache clear             Clear reusable-session caches\n"
         "  !quit                    Exit\n"
         "\nType a prompt on a line by itself to generate a video.\n")


def print_status(state: CliState) -> None:
    """h3_cli.c:183 `print_status`."""
    p = state.params
    aligned = align_frame_count(p.frames)
    text = f"Size: {p.width}x{p.height}"
    if p.render_width:
        text += f" (render {p.render_width}x{p.render_height})"
    text += f"\nFrames: {p.frames} requested, {aligned} generated ({_format_g3(aligned / FPS)} seconds)\n"
    fc2 = "BF16" if p.ssd_streaming else "int8 row" if p.use_int8_row_fc2 else "int8 grouped"
    text += (f"Steps: {p.steps} | reuse: {p.denoise_reuse} | layers: {p.dit_layers} | "
             f"core reuse: {p.core_reuse} | tokens: {'reduced' if p.token_reduction else 'full'} | "
             f"weights: {'SSD BF16' if p.ssd_streaming else 'resident'} | FC2: {fc2}\n")
    text += f"Spatial RoPE: {'released reference' if p.use_reference_rope else 'native 256 adapted'}\n"
    text += "Seed: random\n" if state.random_seed else f"Seed: {p.seed}\n"
    # `ptr ? ptr : "none"`: an empty --first-frame '' prints as empty (h3_cli.c:203-204).
    text += f"First: {'none' if state.first_frame is None else state.first_frame}\n"
    text += f"Last: {'none' if state.last_frame is None else state.last_frame}\n"
    count = len(state.references)
    text += f"References: {count}{' (use !refs to list)' if count else ''}\n"
    text += (f"Show: {'on' if state.show else 'off'} | open: {'on' if state.open_output else 'off'} | "
             f"output: {state.output_dir}\n")
    _out(text)


def parse_toggle(argument: str, current: bool) -> bool | None:
    """h3_cli.c:212 `parse_toggle`: empty flips, on/1, off/0 (case-insensitive on/off)."""
    argument = _skip_spaces(argument)
    if not argument:
        return not current
    if _fold(argument) == "on" or argument == "1":
        return True
    if _fold(argument) == "off" or argument == "0":
        return False
    return None


def validate_anchor(path: str) -> bool:
    """h3_cli.c:229 `validate_anchor`: FFprobe must see a visual stream."""
    try:
        probe_visual_size(path)
    except MediaFailure as failure:
        _err(f"h3: {failure}\n")
        return False
    return True


_KIND_NAMES = {ReferenceKind.IMAGE: "image", ReferenceKind.VIDEO: "video", ReferenceKind.AUDIO: "audio",
               ReferenceKind.VIDEO_AUDIO: "video+audio"}


def clear_references(state: CliState) -> None:
    """h3_cli.c:270 `clear_references`: also clears every cache."""
    state.references.clear()
    state.ctx.clear_cache()


def list_references(state: CliState) -> None:
    """h3_cli.c:277 `list_references`."""
    if not state.references:
        _out("References: none\n")
        return
    picture = video = audio = 0
    lines = ["Ordered references:\n"]
    for index, reference in enumerate(state.references, start=1):
        if reference.kind == ReferenceKind.IMAGE:
            picture += 1
            ordinal, label = picture, "Picture"
        elif reference.kind == ReferenceKind.AUDIO:
            audio += 1
            ordinal, label = audio, "Audio"
        else:
            video += 1
            ordinal, label = video, "Video"
            if reference.kind == ReferenceKind.VIDEO_AUDIO or reference.include_embedded_audio:
                audio += 1
        lines.append(f"  {index}. {_KIND_NAMES.get(reference.kind, 'unknown'):<11} <{label} {ordinal}> "
                     f"{reference.path}\n")
    _out("".join(lines))


def add_reference_image(state: CliState, argument: str) -> None:
    """h3_cli.c:306 `add_reference_image`."""
    argument = _skip_spaces(argument)
    if not argument:
        _err("Usage: !ref-image PATH\n")
        return
    if state.first_frame is not None or state.last_frame is not None:
        _err("h3: Ref2VA references cannot be combined with frame anchors\n")
        return
    if not state.ctx.model.ref2va_transformer.files:
        _err("h3: !ref-image requires the Ref2VA checkpoint\n")
        return
    images = sum(1 for reference in state.references if reference.kind == ReferenceKind.IMAGE)
    if images >= 9:
        _err("h3: Ref2VA supports at most 9 image references\n")
        return
    if len(state.references) >= 12:
        _err("h3: Ref2VA supports at most 12 ordered references\n")
        return
    if not validate_anchor(argument):
        return
    state.references.append(SimReference(ReferenceKind.IMAGE, argument))
    state.ctx.clear_cache()
    _out(f"Added reference {len(state.references)} as <Picture {images + 1}>: {argument}\n")


def remove_reference(state: CliState, argument: str) -> None:
    """h3_cli.c:344 `remove_reference`."""
    number = parse_i32(_skip_spaces(argument), 1, 12)
    if number is None or number > len(state.references):
        _err("Usage: !ref-remove N (see !refs)\n")
        return
    del state.references[number - 1]
    state.ctx.clear_cache()
    _out(f"Removed reference {number}.\n")
    list_references(state)


def set_anchor(state: CliState, first: bool, argument: str) -> None:
    """h3_cli.c:363 `set_anchor`."""
    argument = _skip_spaces(argument)
    name = "First" if first else "Last"
    current = state.first_frame if first else state.last_frame
    if not argument:
        _out(f"{name}: {'none' if current is None else current}\n")
        return
    if _fold(argument) == "clear":
        if first:
            state.first_frame = None
        else:
            state.last_frame = None
        state.ctx.clear_cache()
        _out(f"{name}: none\n")
        return
    if state.references:
        _err("h3: frame anchors cannot be combined with Ref2VA references\n")
        return
    if not validate_anchor(argument):
        return
    if first:
        state.first_frame = argument
    else:
        state.last_frame = argument
    state.ctx.clear_cache()
    _out(f"{name}: {argument}\n")


def copy_file(source: str, destination: str) -> OSError | None:
    """h3_cli.c:393 `copy_file`; returns the failing call's error (errno for strerror), or None."""
    try:
        with open(source, "rb") as reader, open(destination, "wb") as writer:
            while True:
                chunk = reader.read(1024 * 1024)
                if not chunk:
                    break
                writer.write(chunk)
    except OSError as error:
        return error
    return None


def open_video(path: str) -> None:
    """h3_cli.c:416 `open_video`: posix_spawnp("open", ...), never waited for."""
    try:
        os.posix_spawnp("open", ["open", path], os.environ)
    except OSError as error:
        _err(f"h3: cannot open {path}: {strerror(error.errno or 0)}\n")


def generate(state: CliState, prompt: str) -> bool:
    """h3_cli.c:424 `generate`."""
    state.output_count += 1
    output = f"{state.output_dir}/video-{state.output_count:04d}.mp4"
    if len(output.encode("utf-8", "surrogateescape")) >= CLI_PATH:
        _err("h3: output path is too long\n")
        return False
    params = replace(state.params, references=list(state.references))
    params.seed = secrets.randbits(64) if state.random_seed else state.params.seed
    params.first_frame = state.first_frame
    params.last_frame = state.last_frame
    params.output_path = output
    params.preview_denoise = int(state.show and state.terminal is not None)
    on_frame = (lambda frame: cli_frame(state, frame)) if params.preview_denoise else None
    state.progress.phase = ""
    state.progress.active = False
    state.display_failed = False
    _out(f"Seed: {params.seed}\n")
    sys.stdout.flush()
    begin = time.monotonic()
    try:
        core.generate(state.ctx, prompt, params, on_progress=state.progress.progress, on_frame=on_frame)
    except core.SimError as error:
        if state.progress.active:
            _err("\n")
        _err(f"h3: {error.message}\n")
        return False
    elapsed = time.monotonic() - begin
    state.last_output = output
    state.last_prompt = prompt
    _out(f"Done -> {output} [{elapsed:.2f}s]\n")
    if state.open_output:
        open_video(output)
    return True


def set_integer(argument: str, name: str, minimum: int, maximum: int, state: CliState, attribute: str) -> bool:
    """h3_cli.c:465 `set_integer`."""
    argument = _skip_spaces(argument)
    if not argument:
        _out(f"{name}: {getattr(state.params, attribute)}\n")
        return True
    value = parse_i32(argument, minimum, maximum)
    if value is None:
        _err(f"h3: invalid {name}\n")
        return False
    setattr(state.params, attribute, value)
    _out(f"{name}: {value}\n")
    return True


def _set_directory(path: str) -> tuple[bool, int]:
    """h3_cli.c:95 `set_directory` -> (ok, errno for the error message)."""
    if not path or len(path.encode("utf-8", "surrogateescape")) >= CLI_PATH:
        return False, errno.ENAMETOOLONG
    last_errno = 0
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        last_errno = errno.EEXIST
    except OSError as error:
        return False, error.errno or 0
    try:
        status = os.stat(path)
    except OSError as error:
        return False, error.errno or 0
    if not stat.S_ISDIR(status.st_mode):
        return False, last_errno
    return True, 0


def process_command(state: CliState, line: str) -> tuple[bool, bool]:
    """h3_cli.c:482 `process_command` -> (quit, repeat)."""
    command = _skip_spaces(line[1:])
    split = 0
    while split < len(command) and command[split] not in _C_SPACE:
        split += 1
    argument = _skip_spaces(command[split + 1:]) if split < len(command) else ""
    command = command[:split]
    name = _fold(command)
    p = state.params
    if name == "help":
        print_help()
    elif name == "status":
        print_status(state)
    elif name in ("quit", "exit"):
        return True, False
    elif name == "again":
        if state.last_prompt is None:
            _err("h3: no previous prompt\n")
        else:
            return False, True
    elif name == "seed":
        if not argument:
            _out("Seed: random\n" if state.random_seed else f"Seed: {p.seed}\n")
        elif _fold(argument) == "random" or argument == "-1":
            state.random_seed = True
            _out("Seed: random\n")
        else:
            value = parse_u64_value(argument)
            if value is None:
                _err("h3: invalid seed\n")
            else:
                p.seed = value
                state.random_seed = False
                _out(f"Seed: {value}\n")
    elif name == "size":
        if not argument:
            _out(f"Size: {p.width}x{p.height}\n")
        else:
            size = parse_size(argument)
            if size is None:
                _err("h3: size must be WxH\n")
            else:
                p.width, p.height = size
                _out(f"Size: {size[0]}x{size[1]}\n")
    elif name == "render-size":
        if not argument:
            _out(f"Render size: {p.render_width}x{p.render_height}\n" if p.render_width
                 else "Render size: native\n")
        elif _fold(argument) == "native":
            p.render_width = p.render_height = 0
            _out("Render size: native\n")
        else:
            size = parse_size(argument)
            if size is None:
                _err("h3: render size must be WxH or native\n")
            else:
                p.render_width, p.render_height = size
                _out(f"Render size: {size[0]}x{size[1]}\n")
    elif name == "frames":
        set_integer(argument, "Frames", 1, INT32_MAX, state, "frames")
    elif name == "seconds":
        if not argument:
            aligned = align_frame_count(p.frames)
            _out(f"Seconds: {_format_g3(aligned / FPS)} ({aligned} aligned frames)\n")
        else:
            seconds, rest, erange = strtod(argument)
            frames = seconds * FPS if seconds is not None else 0.0
            if (seconds is None or erange or rest.strip(_C_SPACE) or not math.isfinite(seconds)
                    or seconds <= 0
                    or frames > INT32_MAX):
                _err("h3: invalid duration\n")
            else:
                p.frames = c_llround(frames)
                _out(f"Seconds: {_format_g3(seconds)} ({align_frame_count(p.frames)} aligned frames)\n")
    elif name == "steps":
        set_integer(argument, "Steps", 1, MAX_STEPS, state, "steps")
    elif name == "reuse":
        set_integer(argument, "Reuse", 1, 32, state, "denoise_reuse")
    elif name == "layers":
        set_integer(argument, "Layers", MIN_DIT_LAYERS, DEFAULT_DIT_LAYERS, state, "dit_layers")
    elif name == "core-reuse":
        set_integer(argument, "Core reuse", 1, 6, state, "core_reuse")
    elif name == "token-reduction":
        value = parse_toggle(argument, bool(p.token_reduction))
        if value is None:
            _err("h3: use on or off\n")
        else:
            p.token_reduction = int(value)
            _out(f"Token reduction: {'on' if value else 'off'}\n")
    elif name == "ssd-streaming":
        value = parse_toggle(argument, bool(p.ssd_streaming))
        if value is None:
            _err("h3: use on or off\n")
        elif value and p.use_int8_row_fc2:
            _err("h3: disable !int8-row-fc2 before SSD streaming\n")
        else:
            p.ssd_streaming = int(value)
            _out(f"SSD streaming: {'on' if value else 'off'}\n")
    elif name == "int8-row-fc2":
        value = parse_toggle(argument, bool(p.use_int8_row_fc2))
        if value is None:
            _err("h3: use on or off\n")
        elif value and p.ssd_streaming:
            _err("h3: disable !ssd-streaming before int8 row FC2\n")
        else:
            p.use_int8_row_fc2 = int(value)
            _out(f"FC2 int8 row scaling: {'on' if value else 'off'}\n")
    elif name == "reference-rope":
        value = parse_toggle(argument, bool(p.use_reference_rope))
        if value is None:
            _err("h3: use on or off\n")
        else:
            p.use_reference_rope = int(value)
            _out(f"Reference spatial RoPE: {'on' if value else 'off'}\n")
    elif name == "first":
        set_anchor(state, True, argument)
    elif name == "last":
        set_anchor(state, False, argument)
    elif name == "ref-image":
        add_reference_image(state, argument)
    elif name == "refs":
        if not argument:
            list_references(state)
        elif _fold(argument) == "clear":
            clear_references(state)
            _out("References: none\n")
        else:
            _err("h3: use !refs or !refs clear\n")
    elif name == "ref-remove":
        remove_reference(state, argument)
    elif name == "show":
        value = parse_toggle(argument, state.show)
        if value is None:
            _err("h3: use on or off\n")
        elif value and state.terminal is None:
            _err("h3: no supported graphical terminal detected\n")
        else:
            state.show = value
            _out(f"Show: {'on' if value else 'off'}\n")
    elif name == "zoom":
        value = parse_i32(argument, 1, INT32_MAX)
        if value is None or not terminal.set_zoom(value):
            _err("h3: invalid zoom\n")
        else:
            _out(f"Zoom: {value}x\n")
    elif name == "open":
        value = parse_toggle(argument, state.open_output)
        if value is None:
            _err("h3: use on or off\n")
        else:
            state.open_output = value
            _out(f"Open: {'on' if value else 'off'}\n")
    elif name == "output":
        if not argument:
            _out(f"Output: {state.output_dir}\n")
        else:
            ok, code = _set_directory(argument)
            if not ok:
                _err(f"h3: cannot use output directory {argument}: {strerror(code)}\n")
            else:
                state.output_dir = argument
                _out(f"Output: {state.output_dir}\n")
    elif name == "save":
        if not state.last_output:
            _err("h3: no video to save\n")
        else:
            destination = argument if argument else f"h3-{int(time.time())}.mp4"
            # snprintf into char destination[H3_CLI_PATH] (h3_cli.c:662-664) keeps 4095 bytes.
            raw = destination.encode("utf-8", "surrogateescape")
            if len(raw) >= CLI_PATH:
                destination = raw[:CLI_PATH - 1].decode("utf-8", "surrogateescape")
            failure = copy_file(state.last_output, destination)
            if failure is not None:
                _err(f"h3: cannot save {destination}: {strerror(failure.errno or 0)}\n")
            else:
                _out(f"Saved: {destination}\n")
    elif name == "cache":
        if _fold(argument) == "clear":
            state.ctx.clear_cache()
            _out("Cache cleared.\n")
        elif argument:
            _err("h3: use !cache or !cache clear\n")
        else:
            info = state.ctx.cache_info()
            _out(f"Cache: embeddings {info.embedding_entries} ({info.embedding_bytes / (1024.0 * 1024.0):.1f} MiB), "
                 f"DiT {'resident' if info.prepared_dit else 'empty'}, "
                 f"video VAE {'resident' if info.video_decoder else 'empty'}\n")
    else:
        _err("h3: unknown command; type !help\n")
    return False, False


def _make_session_directory() -> str:
    """mkdtemp("/tmp/h3-XXXXXX"): six random [A-Za-z0-9] characters, mode 0700."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    for _ in range(100):
        path = "/tmp/h3-" + "".join(secrets.choice(alphabet) for _ in range(6))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, strerror(errno.EEXIST))


def run(ctx: core.SimContext, model_dir: str, initial: SimParams, show: bool, seed_given: bool) -> int:
    """h3_cli.c:691 `h3_cli_run`. Returns the process exit status (0, or 1 on setup failure)."""
    previous_stdout = c_stdio_stdout()
    try:
        return _run(ctx, model_dir, initial, show, seed_given)
    finally:
        sys.stdout.flush()          # exit() flushes stdio
        if previous_stdout is not None:
            sys.stdout = previous_stdout  # type: ignore[assignment]


def _run(ctx: core.SimContext, model_dir: str, initial: SimParams, show: bool, seed_given: bool) -> int:
    reconfigure = getattr(sys.stderr, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="surrogateescape")     # C passes prompt and path bytes through untouched
    ctx.set_cache_enabled(True)
    params = copy.copy(initial)
    initial_references = list(initial.references)
    params.references = []
    params.output_path = None
    params.first_frame = None
    params.last_frame = None
    state = CliState(ctx=ctx, model_dir=model_dir, params=params)
    state.random_seed = not seed_given
    state.terminal = terminal_protocol()
    state.show = bool(show) and state.terminal is not None
    state.first_frame = initial.first_frame
    state.last_frame = initial.last_frame
    if len(initial_references) > 12:
        _err("h3: cannot copy initial interactive inputs\n")
        return 1
    state.references = initial_references
    try:
        state.output_dir = _make_session_directory()
    except OSError as error:
        _err(f"h3: cannot create session directory: {strerror(error.errno or 0)}\n")
        clear_references(state)
        return 1

    history = History()
    history_path = ""
    home = os.environ.get("HOME")
    # getenv("HOME") may be "": upstream then uses "/.h3_history" (h3_cli.c:747-751).
    if home is not None and len(home.encode("utf-8", "surrogateescape")) + len(b"/.h3_history\0") < CLI_PATH:
        history_path = f"{home}/.h3_history"
        history.load(history_path)
    history.set_max_len(HISTORY_SESSION_MAX)

    _out(f"H3 Interactive Mode\nModel: {model_dir}\nOutputs: {state.output_dir}\n")
    if show and state.terminal is None:
        _out("Display unavailable in this terminal.\n")
    _out("Type a prompt to generate video; !help lists commands.\n")
    print_status(state)

    while (line := read_line("h3> ")) is not None:
        line = line.rstrip(_C_SPACE)            # trim_trailing
        text = _skip_spaces(line)
        if not text:
            continue
        history.add(text)
        quit_now, repeat = process_command(state, text) if text.startswith("!") else (False, False)
        if quit_now:
            break
        if repeat:
            assert state.last_prompt is not None
            generate(state, state.last_prompt)
        elif not text.startswith("!"):
            generate(state, text)
    if history_path:
        history.save(history_path)
    clear_references(state)
    _out("Goodbye.\n")
    sys.stdout.flush()
    return 0
