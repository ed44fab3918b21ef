"""Warm engine session: one long-lived `h3` interactive process, MiniMax-H3 kept resident between jobs.

`h3 -d MODEL_DIR` without `-p`/`--info` runs upstream's interactive mode (main.c calls
`h3_cli_run`, h3_cli.c). There `h3_cache_set_enabled(ctx, 1)` keeps the encoded
conditioning, the prepared DiT and the video VAE decoder between prompts, so a second
job with the same prompt and shape skips the text encoder, the transformer load and
the decoder load (h3.c `h3_generate`: "conditioning cache hit", "prepared DiT cache
hit", "video VAE cache hit"). `SessionEngine` drives that process over pipes.

Protocol (all of it upstream's, nothing private):

* stdin is a pipe. linenoise.c `linenoise()` sees a non-TTY stdin and reads plain lines
  (`linenoiseNoTTY`): no prompt is echoed, EOF ends the session. A line is a prompt unless
  it starts with `!` (h3_cli.c `h3_cli_run`), so prompts cannot contain newlines.
* stdout is a pseudo-terminal. Upstream prints every reply (`Seed: N`, `Size: WxH`,
  `Done -> PATH [T s]`) with stdio and flushes only the `Seed:` line (h3_cli.c
  `generate`); over a pipe stdout is block-buffered, so `Done -> PATH` would sit in the
  child's buffer until the *next* job. With a pty stdio line-buffers stdout and every
  reply arrives when it is printed. (Relying on stderr alone would lose the output path
  and every command reply; a pty costs nothing and changes nothing else: linenoise only
  looks at stdin, and terminal graphics are keyed on environment variables, h3_terminal.c
  `h3_terminal_detect`.) The pty is put in raw mode so `\\n` is not rewritten to `\\r\\n`.
* stderr is a pipe: progress (`\\r%-25s %4d/%-4d`, h3_cli.c `cli_progress`), cache
  notices and `h3: <error>` lines.
* Each `!` command answers with exactly one line: on stdout when it worked, on stderr
  (`h3: ...`/`Usage: ...`) when it did not (h3_cli.c `process_command`). After a prompt
  we queue two markers, `!output` (stdout `Output: DIR`) and an unknown command (stderr
  `h3: unknown command; type !help`); both are answered only once `generate` returns,
  so when both have arrived every byte of the job's output has been read on both
  channels. The job worked iff `Done -> PATH` came before them; otherwise the last
  `h3: ...` line is upstream's error, verbatim.
* Nothing may wait in stdin while h3 decodes the anchors and references: it spawns its
  FFmpeg decoders with stdin inherited (h3_ffmpeg.c, no `-nostdin`), and FFmpeg reads
  keyboard commands from it, so a queued `!output` lost its `!` and became a prompt. So the
  markers follow the prompt only once the decoding is over: at `Done ->`, or at the first
  `h3: ` line, since upstream prints none while decoding (h3.c 1018-1250) except the
  debug-variable notices of h3_gpu.m; after them only the encoder runs, its stdin a pipe.

Interactive mode ignores `-o` and `--frames-dir` (h3_cli.c `generate` sets
`output_path` to `OUTPUTS/video-%04u.mp4` and `on_frame` only for `!show` previews), so
the session moves the MP4 to the requested output and, when frames are wanted, decodes
them from the MP4 with PyAV (lossy H.264 frames, not the engine's raw RGB; the one-shot
engine's `--frames-dir` PPMs are exact). Options with no `!` command (the `--use-slower-*`
paths, `--ref-image-size`, and non-image references) are passed at launch; a job that needs
different ones restarts the session.

Lifecycle and the machine-wide lock: the warm-engine rules of warm.py (the lock is held while
the process lives; idle timeout; stepping aside for a waiting job; host exit). Besides those the
session's process goes

* when a job is cancelled (upstream cannot stop a running denoise; the process group is
  killed) or the process crashes (that job raises; the next job starts a fresh process),
* when the engine binary (path or mtime) changed, or the model directory differs, and
* if the host dies without cleanup, by itself: an idle h3 sees EOF on stdin and leaves its
  loop (linenoise returns NULL), a busy one dies at its next progress write because its
  stderr pipe is broken (SIGPIPE).
"""
from __future__ import annotations

import os
import pty
import queue
import re
import shutil
import subprocess
import threading
import tty
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from ..cancel import CancelToken, PauseControl
from .child import NOTHING, ChildJob, Deadline, Nothing, child_gone, reap, wait_until
from .job import Rendered, check_disks, open_job, run_job
from .locate import (
    FFMPEG_HINT,
    check_media_tools,
    engine_environment,
    engine_variables,
    engine_working_directory,
    locate_engine,
    locate_model_dir,
)
from .disk import (
    DiskNeed,
    disk_error_from_os_error,
    existing_folder,
    expected_clip_bytes,
    raise_for_disk_problem,
)
from .h3_command import absolute_path, engine_error_text, engine_message_from, expected_phases, reference_arguments
from .hints import failure_hint, phase_words
from .output import JobFiles
from .process import EngineChild, EngineProcess
from ..errors import (
    EngineError,
    EngineNotFoundError,
    EngineStalledError,
    GenerationCancelled,
    MediaError,
    RequestError,
    SessionCommandError,
    SessionError,
    SessionUnsupportedError,
)
from .scratch import new_session_dir, own_session_dirs, remove_leftovers, session_dir_leftovers
from ..history.recorder import recorded
from ..media.decode import decode_video_frames, remove_quietly
from ..userdirs import cache_dir
from ..progress import ProgressCallback, ProgressEvent, ProgressTracker
from ..request import (
    DEFAULT_FRAMES,
    DEFAULT_HEIGHT,
    DEFAULT_STEPS,
    DEFAULT_WIDTH,
    MAX_LAYERS,
    GenerationRequest,
    Reference,
    ReferenceImageSize,
    ReferenceKind,
)
from ..result import GenerationResult
from .warm import DEFAULT_IDLE_TIMEOUT, WarmEngine
from .protocol import EngineCapabilities
from ..progress import PreviewCallback

# How long a graceful `!quit` may take before the process group is killed.
QUIT_GRACE = 3.0
# Once one of h3's streams ends, how long the other may take to deliver what it still holds.
EOF_DRAIN_SECONDS = 5.0
# h3_cli.c `process_command`: the reply to any unknown `!` command, on stderr.
UNKNOWN_COMMAND_REPLY = "h3: unknown command; type !help"
SYNC_COMMAND = "!h3bridge-sync"
# h3_cli.c `generate`: printf("Done -> %s [%.2fs]\n", output, elapsed)
_DONE_LINE = re.compile(r"^Done -> (?P<path>.+) \[(?P<seconds>\d+(?:\.\d+)?)s\]$")
# h3_cli.c `generate`: printf("Seed: %" PRIu64 "\n", params.seed) before each run.
_SEED_LINE = re.compile(r"^Seed: (?P<seed>\d+)$")
# h3_gpu.m, behind H3_DEBUG_GPU_MEMORY / H3_NAX_DIAGNOSTIC: `h3: ` lines that may come while the
# anchors and references are still being decoded, so they do not release the end markers.
_DECODING_NOTICES = ("h3: Metal live allocation", "h3: TensorOps compile failed")
# h3_cli.c `h3_cli_run`: mkdtemp("/tmp/h3-XXXXXX"), whatever TMPDIR says; every clip is written there.
SESSION_OUTPUTS_PARENT = Path("/tmp")
SESSION_BEFORE_PROGRESS = "before the job's first progress report"
SESSION_STARTING = "while the session started (loading the model, before any progress report)"


# ============================================================================ settings mirror

@dataclass(frozen=True)
class SessionSettings:
    """The generation settings an interactive h3 holds (h3_cli.c `h3_cli_state.params`).

    `seed=None` means `Seed: random`. `references` are the ordered Ref2VA inputs.
    """

    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT
    render: tuple[int, int] | None = None
    frames: int = DEFAULT_FRAMES
    steps: int = DEFAULT_STEPS
    reuse: int = 1
    layers: int = MAX_LAYERS
    core_reuse: int = 1
    token_reduction: bool = False
    ssd_streaming: bool = False
    int8_row_fc2: bool = False
    reference_rope: bool = False
    seed: int | None = None
    first_frame: str | None = None
    last_frame: str | None = None
    references: tuple[Reference, ...] = ()

    @classmethod
    def for_request(cls, request: GenerationRequest) -> "SessionSettings":
        render = None
        if request.render_width is not None and request.render_height is not None:
            render = (request.render_width, request.render_height)
        return cls(
            width=request.width, height=request.height, render=render,
            frames=request.requested_frames, steps=request.steps, reuse=request.reuse,
            layers=request.layers, core_reuse=request.core_reuse,
            token_reduction=request.token_reduction, ssd_streaming=request.ssd_streaming,
            int8_row_fc2=request.int8_row_fc2, reference_rope=request.reference_rope,
            seed=request.seed,
            first_frame=_sendable_path(request.first_frame, "first frame"),
            last_frame=_sendable_path(request.last_frame, "last frame"),
            references=tuple(replace(ref, path=Path(_sendable_path(ref.path, "reference") or ref.path),
                                     audio_path=Path(absolute_path(ref.audio_path)) if ref.audio_path else None)
                             for ref in request.references),
        )

    @classmethod
    def from_status(cls, lines: list[str], references: tuple[Reference, ...]) -> "SessionSettings":
        """Parse the `print_status` block h3_cli.c prints at startup (h3_cli.c `print_status`)."""
        values: dict[str, object] = {"references": references}
        for line in lines:
            if match := re.match(r"^Size: (\d+)x(\d+)(?: \(render (\d+)x(\d+)\))?$", line):
                values["width"], values["height"] = int(match[1]), int(match[2])
                values["render"] = (int(match[3]), int(match[4])) if match[3] else None
            elif match := re.match(r"^Frames: (\d+) requested", line):
                values["frames"] = int(match[1])
            elif match := re.match(r"^Steps: (\d+) \| reuse: (\d+) \| layers: (\d+) \| core reuse: (\d+) \| "
                                   r"tokens: (\w+) \| weights: ([\w ]+) \| FC2: ([\w ]+)$", line):
                values.update(steps=int(match[1]), reuse=int(match[2]), layers=int(match[3]),
                              core_reuse=int(match[4]), token_reduction=match[5] == "reduced",
                              ssd_streaming=match[6] == "SSD BF16", int8_row_fc2=match[7] == "int8 row")
            elif match := re.match(r"^Spatial RoPE: (.*)$", line):
                values["reference_rope"] = match[1] == "released reference"
            elif match := re.match(r"^Seed: (random|\d+)$", line):
                values["seed"] = None if match[1] == "random" else int(match[1])
            elif match := re.match(r"^(First|Last): (.*)$", line):
                key = "first_frame" if match[1] == "First" else "last_frame"
                values[key] = None if match[2] == "none" else match[2]
            elif match := re.match(r"^References: (\d+)", line):
                if int(match[1]) != len(references):
                    raise SessionError(f"h3 reports {match[1]} references at startup, expected {len(references)}")
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SessionCommand:
    """One `!` line, the stdout reply that means it worked (h3_cli.c `process_command`),
    and what it changes in the session's settings once it did."""

    text: str
    reply: str
    changes: tuple[tuple[str, object], ...]

    def accepts(self, line: str) -> bool:
        return line == self.reply

    def applied_to(self, settings: SessionSettings) -> SessionSettings:
        return replace(settings, **dict(self.changes))


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def commands_for_change(current: SessionSettings, target: SessionSettings) -> list[SessionCommand]:
    """The `!` commands that turn `current` into `target`, only for values that differ.

    Replies are h3_cli.c's `printf`s for each command. Order matters where upstream refuses
    combinations: SSD streaming and int8-row FC2 exclude each other ("disable !int8-row-fc2
    before SSD streaming"), and anchors exclude references (`set_anchor`,
    `add_reference_image`), so whatever is switched off or cleared goes first.
    """
    commands: list[SessionCommand] = []

    def add(text: str, reply: str, **changes: object) -> None:
        commands.append(SessionCommand(text, reply, tuple(changes.items())))

    if (current.width, current.height) != (target.width, target.height):
        size = f"{target.width}x{target.height}"
        add(f"!size {size}", f"Size: {size}", width=target.width, height=target.height)
    if current.render != target.render:
        if target.render is None:
            add("!render-size native", "Render size: native", render=None)
        else:
            size = f"{target.render[0]}x{target.render[1]}"
            add(f"!render-size {size}", f"Render size: {size}", render=target.render)
    # h3_cli.c `set_integer`: printf("%s: %d\n", name, value)
    for name, label, attribute in (("frames", "Frames", "frames"), ("steps", "Steps", "steps"),
                                   ("reuse", "Reuse", "reuse"), ("layers", "Layers", "layers"),
                                   ("core-reuse", "Core reuse", "core_reuse")):
        value = getattr(target, attribute)
        if getattr(current, attribute) != value:
            add(f"!{name} {value}", f"{label}: {value}", **{attribute: value})
    if current.token_reduction != target.token_reduction:
        state = _on_off(target.token_reduction)
        add(f"!token-reduction {state}", f"Token reduction: {state}", token_reduction=target.token_reduction)
    if current.reference_rope != target.reference_rope:
        state = _on_off(target.reference_rope)
        add(f"!reference-rope {state}", f"Reference spatial RoPE: {state}", reference_rope=target.reference_rope)
    toggles = [
        (current.ssd_streaming != target.ssd_streaming, target.ssd_streaming,
         f"!ssd-streaming {_on_off(target.ssd_streaming)}", f"SSD streaming: {_on_off(target.ssd_streaming)}",
         {"ssd_streaming": target.ssd_streaming}),
        (current.int8_row_fc2 != target.int8_row_fc2, target.int8_row_fc2,
         f"!int8-row-fc2 {_on_off(target.int8_row_fc2)}", f"FC2 int8 row scaling: {_on_off(target.int8_row_fc2)}",
         {"int8_row_fc2": target.int8_row_fc2}),
    ]
    for switch_on in (False, True):
        for changed, on, text, reply, changes in toggles:
            if changed and on == switch_on:
                add(text, reply, **changes)
    if current.seed != target.seed:
        if target.seed is None:
            add("!seed random", "Seed: random", seed=None)
        else:
            add(f"!seed {target.seed}", f"Seed: {target.seed}", seed=target.seed)
    references_change = current.references != target.references
    if references_change and current.references:
        add("!refs clear", "References: none", references=())
    anchors = (("first", "First", "first_frame"), ("last", "Last", "last_frame"))
    for name, label, attribute in anchors:
        if getattr(current, attribute) is not None and getattr(target, attribute) is None:
            add(f"!{name} clear", f"{label}: none", **{attribute: None})
    for name, label, attribute in anchors:
        path = getattr(target, attribute)
        if path is not None and getattr(current, attribute) != path:
            add(f"!{name} {path}", f"{label}: {path}", **{attribute: path})
    if references_change:
        for index, reference in enumerate(target.references, start=1):
            if reference.kind is not ReferenceKind.IMAGE:
                raise SessionUnsupportedError(
                    f"reference {index} is a {reference.kind.value} reference; h3's interactive session can "
                    "only add image references (!ref-image)", hint="run it one-shot")
            # h3_cli.c `add_reference_image`: "Added reference %zu as <Picture %zu>: %s"
            add(f"!ref-image {reference.path}", f"Added reference {index} as <Picture {index}>: {reference.path}",
                references=target.references[:index])
    return commands


def _sendable_path(path: Path | None, what: str) -> str | None:
    """An absolute path that survives the line protocol (one line, ends not trimmed)."""
    if path is None:
        return None
    text = absolute_path(path)
    if "\n" in text or "\r" in text or text != text.strip():
        raise SessionUnsupportedError(
            f"the {what} path {text!r} has a line break or surrounding whitespace, which h3's "
            "interactive session cannot receive", hint="rename the file, or run it one-shot")
    return text


def _launch_flags(request: GenerationRequest) -> tuple[str, ...]:
    """main.c flags that have no interactive command, so they are fixed for a process's life:
    the slower-path switches, `--ref-image-size`, and references that are not images."""
    flags: list[str] = [f"--use-slower-{path.value}" for path in sorted(request.slower_paths, key=lambda p: p.value)]
    if request.reference_image_size is not ReferenceImageSize.MATCH:
        flags += ["--ref-image-size", request.reference_image_size.value]
    if any(ref.kind is not ReferenceKind.IMAGE for ref in request.references):
        flags += reference_arguments(request.references)
    return tuple(flags)


def _launch_references(request: GenerationRequest) -> tuple[Reference, ...]:
    """The references a process launched with `_launch_flags(request)` starts with."""
    if any(ref.kind is not ReferenceKind.IMAGE for ref in request.references):
        return SessionSettings.for_request(request).references
    return ()


def session_prompt(prompt: str, *, join_prompt_lines: bool = False) -> str:
    """The one line a prompt becomes in the session, or SessionUnsupportedError.

    Upstream reads one line per prompt and trims surrounding whitespace (h3_cli.c
    `trim_trailing`/`skip_spaces`); a line starting with `!` is a command. A one-shot run
    passes the prompt verbatim with `-p`, so anything the line protocol would change is
    refused unless the caller opted in to joining lines.
    """
    if join_prompt_lines:
        line = " ".join(part.strip() for part in prompt.splitlines() if part.strip())
    else:
        if "\n" in prompt or "\r" in prompt:
            raise SessionUnsupportedError(
                "the prompt has several lines; h3's interactive session reads one line per prompt",
                hint="run it one-shot, or pass join_prompt_lines=True to join the lines with spaces")
        if prompt != prompt.strip():
            raise SessionUnsupportedError(
                "the prompt starts or ends with whitespace, which h3's interactive session strips",
                hint="strip the prompt, run it one-shot, or pass join_prompt_lines=True")
        line = prompt
    if not line:
        # Nothing for any engine to render (h3.c h3_generate: "prompt must not be empty").
        raise RequestError("the prompt has no text (it is empty or only whitespace)", field="prompt",
                           hint="describe the clip in the prompt")
    if line.startswith("!"):
        raise SessionUnsupportedError(
            "the prompt starts with '!', which h3's interactive session reads as a command",
            hint="reword the prompt's first character, or run it one-shot")
    return line


# ============================================================================ the child process

@dataclass(frozen=True)
class _Event:
    stream: str            # "out" (a stdout line) or "err" (a stderr piece between \r/\n)
    text: str | None       # None at that stream's EOF
    complete: bool = True  # False: an unterminated stderr tail (a progress redraw), may grow


class _SessionProcess(EngineChild):
    """One interactive h3 child: stdin pipe, stdout pty, stderr pipe, both read into one queue.

    Process-group supervision and stderr reading are engine_process.EngineProcess's (shared
    with the one-shot engine); this adds the pty for stdout and the merged event queue.
    """

    quit_grace = QUIT_GRACE

    def __init__(self, argv: list[str], *, cwd: str | None, env: dict[str, str] | None,
                 background: bool = False) -> None:
        self.events: "queue.Queue[_Event]" = queue.Queue()
        master, slave = pty.openpty()
        tty.setraw(slave)   # no \n -> \r\n rewriting, no echo
        try:
            self.engine = EngineProcess(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=slave,
                                        background=background)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)   # the child has its copy; the master then sees EIO when the child is gone
        self._master = master
        self._threads = [
            threading.Thread(target=self._read_stdout, name=f"h3-session-stdout-{self.pid}", daemon=True),
            threading.Thread(target=self._forward_stderr, name=f"h3-session-stderr-{self.pid}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pgid(self) -> int:
        return self.engine.pgid

    def _read_stdout(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:       # EIO: every holder of the pty's other end is gone
                chunk = b""
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self.events.put(_Event("out", line.decode("utf-8", "replace").rstrip("\r")))
        if pending:
            self.events.put(_Event("out", pending.decode("utf-8", "replace")))
        self.events.put(_Event("out", None))

    def _forward_stderr(self) -> None:
        while True:
            piece = self.engine.pieces.get()
            if piece is None:
                self.events.put(_Event("err", None))
                return
            self.events.put(_Event("err", piece.text, piece.complete))

    def send(self, line: str) -> None:
        stdin = self.engine.popen.stdin
        assert stdin is not None
        try:
            stdin.write(line.encode("utf-8", "surrogateescape") + b"\n")
            stdin.flush()
        except (BrokenPipeError, ValueError):
            pass     # the child is gone: its streams hit EOF and the waiting side reports why

    def kill(self) -> None:
        """Stop the whole process group (SIGTERM, SIGKILL after a short grace) and close our ends."""
        self.engine.stop()
        self._close()

    def _say_goodbye(self) -> None:
        """`!quit`: upstream saves its history and prints Goodbye."""
        if self.alive():
            self.send("!quit")

    def _close(self) -> None:
        for thread in self._threads:
            thread.join(timeout=1)
        try:
            os.close(self._master)
        except OSError:
            pass
        stdin = self.engine.popen.stdin
        try:
            if stdin is not None and not stdin.closed:
                stdin.close()
        except OSError:
            pass


# ============================================================================ the engine

def session_home() -> Path:
    """The HOME the session's h3 runs with: `session-home` in h3bridge's cache directory.

    Interactive h3 loads `$HOME/.h3_history` (cut to linenoise's default 100 lines before its
    500-line cap applies), adds every line it reads and rewrites the file at exit (h3_cli.c
    747-786). With the user's HOME each session would trim their own h3 history and fill it
    with our prompts and commands. That is upstream's only use of HOME."""
    return cache_dir() / "session-home"


def session_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for the session's h3: a private HOME (session_home), and no LINENOISE_* variables
    (LINENOISE_ASSUME_TTY, linenoise.c:1605, would make it draw `h3> ` prompts on our stdout)."""
    child = {name: value for name, value in env.items() if not name.startswith("LINENOISE_")}
    child["HOME"] = str(session_home())
    return child


@dataclass(frozen=True)
class _EngineIdentity:
    """What a running session was started from; any change means a restart."""

    path: str
    mtime_ns: int
    model_dir: str
    launch_flags: tuple[str, ...]
    # Upstream's H3_* variables are read by the running process (engine.engine_variables); a
    # one-shot run sees a change at once, so a session restarts for it.
    engine_variables: tuple[tuple[str, str], ...]


@dataclass
class _Job:
    """Book-keeping for one generate() call."""

    request: GenerationRequest
    tracker: ProgressTracker
    on_progress: ProgressCallback | None
    cancel: CancelToken | None
    stall_timeout: float | None = None     # for a job made without `child`
    child: ChildJob = None  # type: ignore[assignment]   # cancel, pause and the stall watchdog (child.py)
    commands: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    in_sync: bool = True     # False while a sent line's reply is still outstanding
    last_event: ProgressEvent | None = None     # where the job is: named when it crashes or stalls
    before_progress: str = SESSION_BEFORE_PROGRESS    # ... and where it is before any report

    def __post_init__(self) -> None:
        if self.child is None:
            self.child = ChildJob(cancel=self.cancel, pause=None, stall_timeout=self.stall_timeout,
                                  on_progress=self.on_progress)

    def report(self, event: ProgressEvent | None) -> None:
        if event is not None:
            self.last_event = event
            if self.on_progress is not None:
                self.on_progress(event)
        self.child.progressed(event)

    def where(self) -> str:
        return phase_words(self.last_event, before=self.before_progress)


class SessionEngine(WarmEngine):
    """A warm h3: one interactive `h3` process reused across jobs while its inputs stay the same.

    Use it as a context manager, or keep one for a host's lifetime through
    `shared_session`. `generate` has the one-shot engine's signature and returns the same
    GenerationResult. Thread-safe: jobs run one at a time.

    Parameters:
        engine_path: the `h3` binary (or h3-sim).
        model_dir: the MiniMax-H3 model directory, fixed for the session's life.
        idle_timeout: seconds without a job after which the process exits (memory goes back).
        join_prompt_lines: join multi-line prompts with spaces instead of raising
            SessionUnsupportedError (the clip then differs from a one-shot run of the same text).
        stall_timeout: kill the session when a job shows no output for this long (None: never);
            the one-shot engine's default.
        lock_path: the engine lock file (default lock.default_lock_path()).
        env, cwd: the child's environment and working directory (default: ours with FFmpeg
            pinned, as one-shot; and the engine binary's directory, because upstream opens
            `h3_shaders.metal` relative to it).
        background: run the child at background priority (engines/priority.py; settable later).
    """

    def __init__(self, engine_path: Path | str | None = None, model_dir: Path | str | None = None, *,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, join_prompt_lines: bool = False,
                 stall_timeout: float | None = 600.0, lock_path: Path | None = None,
                 env: dict[str, str] | None = None, cwd: Path | str | None = None, background: bool = False) -> None:
        # Located exactly as the one-shot engine does (H3_BIN / PATH, H3_MODEL_DIR).
        self.engine_path = locate_engine(engine_path)
        self.model_dir = locate_model_dir(model_dir)
        super().__init__(idle_timeout=idle_timeout, lock_path=lock_path, background=background)
        self.join_prompt_lines = join_prompt_lines
        self.stall_timeout = stall_timeout
        self.env = env
        self.cwd = cwd
        self._process: _SessionProcess | None = None
        self._identity: _EngineIdentity | None = None
        self._settings: SessionSettings | None = None
        self._outputs_dir: Path | None = None
        # This user's session folders before the running process started (_unannounced_outputs_dir).
        self._session_dirs_before: set[str] = set()
        self.starts = 0            # processes started so far (tests and benchmarks read it)
        self.jobs = 0

    # ------------------------------------------------------------------ public surface

    @property
    def outputs_dir(self) -> Path | None:
        """The running h3's own output directory (`Outputs:` in its banner), or None."""
        return self._outputs_dir

    @property
    def settings(self) -> SessionSettings | None:
        """What the running h3 currently holds, as far as the session knows."""
        return self._settings

    @property
    def capabilities(self) -> EngineCapabilities:
        return EngineCapabilities(warm_model=True, previews=False, exact_frames=False, remote=False,
                                  multiline_prompts=self.join_prompt_lines)

    def check_supported(self, request: GenerationRequest) -> None:
        """SessionUnsupportedError when the prompt or a file path cannot go through h3's line
        protocol (several lines, surrounding whitespace, a leading '!'); see `session_prompt`."""
        session_prompt(request.prompt, join_prompt_lines=self.join_prompt_lines)
        SessionSettings.for_request(request)

    @recorded("session")     # the job history (history/recorder.py)
    def generate(self, request: GenerationRequest, output: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, want_frames: bool = True, want_audio: bool = True,
                 on_progress: ProgressCallback | None = None, on_preview: PreviewCallback | None = None,
                 cancel: CancelToken | None = None, pause: PauseControl | None = None) -> GenerationResult:
        """Run one job in the warm process; same contract and result as OneShotEngine.generate
        (the `Engine` protocol). `on_preview` is accepted and never called: interactive h3 shows
        denoise previews only on a terminal (`!show`).

        Before each job only the `!` commands for values that changed are sent, then the
        prompt. `result.command` lists exactly what was sent for this job. Frames, when
        wanted, are decoded from the MP4 (interactive h3 has no `--frames-dir`).

        Raises SessionUnsupportedError (before anything starts) when the request cannot go
        through the line protocol, e.g. a multi-line prompt: run it one-shot then.
        SessionCommandError when h3 refuses a setting (the session stays up). A job that is
        cancelled (GenerationCancelled), stalls or crashes (EngineCrashedError) takes the
        process with it; the next job starts a fresh one. While another engine holds the
        machine-wide lock, `on_progress` sees WAITING_PHASE events and `cancel` still works.
        `pause` stops the session's process group while paused (child.py); the process stays warm.
        """
        spec = open_job(request, output, overwrite=overwrite, want_frames=want_frames, want_audio=want_audio,
                        cancel=cancel,
                        refuse=lambda: session_prompt(request.prompt, join_prompt_lines=self.join_prompt_lines))
        line = session_prompt(request.prompt, join_prompt_lines=self.join_prompt_lines)
        destination = spec.output_path
        tools = check_media_tools(request, writes_mp4=True)    # interactive h3 always writes an MP4
        # One at a time: the clip exists in h3's folder, then (moved) in the output folder, never
        # twice on one disk (a move within a disk is a rename).
        check_disks(self._disk_needs(request, destination), one_at_a_time=True)
        if (request.first_frame is not None or request.last_frame is not None) and tools.ffprobe is None:
            # Unlike a one-shot run, `!first`/`!last` probe the image first (h3_cli.c validate_anchor
            # -> h3_ffprobe_visual_size); h3 would refuse the command only after loading.
            raise EngineNotFoundError("FFprobe was not found; h3's interactive session needs it to check "
                                      "first/last frames", hint=FFMPEG_HINT)
        target = SessionSettings.for_request(request)
        flags = _launch_flags(request)
        child = ChildJob(cancel=cancel, pause=pause, stall_timeout=lambda: self.stall_timeout, on_progress=on_progress)
        job = _Job(request=request, tracker=ProgressTracker(expected_phases(request, writes_mp4=True), child.now()),
                   on_progress=on_progress, cancel=cancel, child=child)

        def run(files: JobFiles) -> Rendered:
            with self._job(on_progress=on_progress, cancel=cancel):
                try:
                    self._ensure_process(flags, job, references=_launch_references(request),
                                         env=session_environment(self.env if self.env is not None
                                                                 else engine_environment(tools)))
                    assert self._settings is not None and self._process is not None
                    child.attach(self._process.pgid)      # a process started by this job is attached already
                    for command in commands_for_change(self._settings, target):
                        self._command(command, job)
                    produced, seed = self._run_prompt(line, job)
                except BaseException:
                    child.let_go()
                    if not (job.in_sync and self._process is not None and self._process.alive()):
                        # Cancelled (upstream cannot stop a running denoise), stalled, crashed, or
                        # interrupted mid-exchange: the process state is unknown, so it goes.
                        self._shutdown(graceful=False)
                    # Otherwise h3 answered in full (a refused command, a failed generation) and
                    # waits for the next line, as upstream's loop does: keep it.
                    raise
                finally:
                    child.detach()      # a warm process never stays stopped after its job
                self.jobs += 1
                timings = job.tracker.finish(child.now())
                variables = dict(self._identity.engine_variables) if self._identity else {}
                # Out of h3's session folder while the session is this job's: that folder goes
                # with the process (a waiting job may make it step aside as soon as this job ends).
                self._take_clip(produced, files.mp4_temp, request, destination)
            mp4 = files.mp4_temp
            return Rendered(timings=timings, command=list(job.commands), engine_log="\n".join(job.stderr),
                            engine_variables=variables, seed=seed,
                            read_frames=None if mp4 is None else
                            lambda: decode_video_frames(mp4, request.frame_count, request.width, request.height))

        return run_job(spec, run, mp4_for_frames=True)

    def _disk_needs(self, request: GenerationRequest, destination: Path | None) -> list[DiskNeed]:
        """Where a session job writes its clip: h3's own session folder (it ignores -o), then the
        output folder it is moved to."""
        clip = expected_clip_bytes(request)
        outputs = self._outputs_dir
        needs = [DiskNeed(outputs if outputs is not None and outputs.is_dir() else SESSION_OUTPUTS_PARENT,
                          "h3's session folder", clip)]
        if destination is not None:
            needs.append(DiskNeed(existing_folder(destination.parent), "the output folder", clip))
        return needs

    @staticmethod
    def _take_clip(produced: Path, target: Path | None, request: GenerationRequest, destination: Path | None) -> None:
        """Move the clip h3 wrote (in its session folder, which grows by one MP4 per job otherwise)
        to the job's MP4 (`target`: beside the output, for the final atomic rename, or in the job's
        folder); None: it is not wanted."""
        try:
            if target is not None:
                try:
                    shutil.move(str(produced), target)
                except OSError as error:     # a copy across file systems can fail (disk full)
                    place = destination.parent if destination is not None else target.parent
                    need = DiskNeed(place, "the output folder" if destination is not None
                                    else "h3bridge's temporary folder", expected_clip_bytes(request))
                    raise disk_error_from_os_error(error, need) or MediaError(
                        f"cannot copy the finished clip to {destination or target}: {error.strerror or error}",
                        hint="check the output folder's permissions") from None
        finally:
            remove_quietly(produced)

    # ------------------------------------------------------------------ process lifecycle

    def _identity_for(self, flags: tuple[str, ...], env: Mapping[str, str]) -> _EngineIdentity:
        try:
            stat = self.engine_path.stat()
        except OSError:
            raise EngineNotFoundError(f"the h3 engine {self.engine_path} does not exist",
                                      hint="build h3 (make) or pass the path of the h3 binary") from None
        return _EngineIdentity(path=os.path.realpath(self.engine_path), mtime_ns=stat.st_mtime_ns,
                               model_dir=os.path.realpath(self.model_dir), launch_flags=flags,
                               engine_variables=tuple(engine_variables(env).items()))

    def _ensure_process(self, flags: tuple[str, ...], job: _Job, *, references: tuple[Reference, ...],
                        env: dict[str, str]) -> None:
        """Reuse the running process if it was started from the same binary, model and launch
        flags; otherwise (re)start one, first taking the machine-wide engine lock."""
        identity = self._identity_for(flags, env)
        if self._process is not None and (not self._process.alive() or identity != self._identity):
            self._shutdown(graceful=self._process.alive())
        if self._process is not None:
            return
        self._take_engine_lock(on_progress=job.on_progress, cancel=job.cancel)
        try:
            home = Path(env["HOME"])
            try:
                home.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as error:
                raise EngineError(f"cannot create the session's home folder {home}: {error.strerror}",
                                  hint="set H3BRIDGE_CACHE_DIR to a writable folder") from None
            argv = [str(self.engine_path), "-d", str(self.model_dir), *flags]
            # h3 opens h3_shaders.metal by relative path: run it where the binary really is (a
            # ~/bin/h3 symlink must still run from the h3.c checkout), as the one-shot engine does.
            cwd = str(self.cwd) if self.cwd is not None else str(engine_working_directory(self.engine_path))
            self._session_dirs_before = own_session_dirs()
            try:
                self._process = _SessionProcess(argv, cwd=cwd, env=env, background=self.background)
            except OSError as error:
                raise EngineNotFoundError(f"cannot start the engine {argv[0]}: {error.strerror}") from None
            job.child.attach(self._process.pgid)      # paused while it loads, too
            self._lock.record_engine(self._process.pid, session_dirs_before=self._session_dirs_before)
            self._identity = identity
            self.starts += 1
            job.before_progress = SESSION_STARTING
            self._read_banner(references, job)
            job.before_progress = SESSION_BEFORE_PROGRESS
            if self._outputs_dir is not None:
                self._lock.record_engine(self._process.pid, leftovers=session_dir_leftovers(self._outputs_dir))
        except BaseException:
            self._shutdown(graceful=False)
            raise

    def _read_banner(self, references: tuple[Reference, ...], job: _Job) -> None:
        """h3_cli.c `h3_cli_run`: "H3 Interactive Mode", Model:, Outputs:, ..., then `print_status`."""
        status: list[str] = []
        while True:
            event = self._next_event(job)
            if event.stream == "err":
                continue
            line = event.text or ""
            if line.startswith("Outputs: "):
                self._outputs_dir = Path(line[len("Outputs: "):])
            status.append(line)
            if line.startswith("Show: "):     # the last line of print_status
                break
        self._settings = SessionSettings.from_status(status, references)

    # WarmEngine's hooks: what the warm child is, and how it goes.

    def _child(self) -> "_SessionProcess | None":
        return self._process

    def _stop_engine(self, *, graceful: bool) -> None:
        process, self._process = self._process, None
        if process is not None:
            if graceful and process.alive():
                process.quit()
            else:
                process.kill()
            if self._outputs_dir is None:
                self._outputs_dir = self._unannounced_outputs_dir(process)
        self._settings = None
        self._identity = None
        self._remove_outputs_dir()

    def _kill_engine_now(self) -> None:
        process = self._process
        if process is not None:
            process.engine.stop()    # the job's thread sees the streams end and raises, if it still runs
            if self._outputs_dir is None:
                self._outputs_dir = self._unannounced_outputs_dir(process)
            self._remove_outputs_dir()

    def _unannounced_outputs_dir(self, process: "_SessionProcess") -> Path | None:
        """The session folder of a process stopped while it started, before its banner's
        `Outputs: DIR` was read (a cancel, a crash, a stall during start-up), once it is gone:
        the line if it is among what the process wrote and no one read yet; else, since h3 makes
        the folder (mkdtemp) a moment before it prints that line, the one folder of this user's
        that appeared while the process lived. Only one: the machine-wide lock was held all that
        while, so no other h3bridge engine made one; two new ones mean someone else's h3 did,
        and neither is touched. None when h3 made none."""
        while True:
            try:
                event = process.events.get_nowait()
            except queue.Empty:
                break
            if event.stream == "out" and event.text and event.text.startswith("Outputs: "):
                return Path(event.text[len("Outputs: "):])
        appeared = new_session_dir(self._session_dirs_before)
        return Path(appeared) if appeared is not None else None

    def _remove_outputs_dir(self) -> None:
        """h3 leaves its mkdtemp session directory (/tmp/h3-XXXXXX) behind. Every finished MP4 was
        moved or deleted; a `video-NNNN.mp4` still there is the partial file of a job that was
        cancelled or crashed while muxing (h3_cli.c `generate` names them), so it goes too. Any
        other file means the directory is not just ours: it is left alone."""
        outputs, self._outputs_dir = self._outputs_dir, None
        if outputs is not None:
            remove_leftovers(session_dir_leftovers(outputs))

    # ------------------------------------------------------------------ talking to h3

    def _next_event(self, job: _Job) -> _Event:
        """The next stdout line or stderr piece; raises on cancel, stall, or the process ending."""
        process = self._process
        assert process is not None
        job.child.alive()       # the watchdog counts from each wait

        def poll(timeout: float) -> _Event | Nothing:
            try:
                event = process.events.get(timeout=timeout)
            except queue.Empty:
                return NOTHING
            job.child.alive()
            if event.text is None:
                self._drain_after_eof(process, job, ended=event.stream)
                self._process_gone(process, job)
            if event.stream == "err":
                self._take_stderr(event, job, now=job.child.now())
                if not event.complete:
                    return NOTHING      # the same text arrives again once terminated
            return event

        def stalled() -> BaseException:
            message = engine_message_from("\n".join(job.stderr))
            return EngineStalledError(
                f"h3 session showed no progress for {job.child.stall_words()} {job.where()}; it was stopped",
                engine_message=message, stderr="\n".join(job.stderr), command=job.commands,
                hint=failure_hint(job.request, message, stalled=True))

        return job.child.wait(poll, on_cancel=lambda: GenerationCancelled("cancelled; the warm h3 session was stopped"),
                              on_stall=stalled)

    @staticmethod
    def _take_stderr(event: _Event, job: _Job, *, now: float) -> None:
        assert event.text is not None
        job.report(job.tracker.feed(event.text, event.complete, now=now))
        if event.complete:
            job.stderr.append(event.text)

    def _drain_after_eof(self, process: _SessionProcess, job: _Job, *, ended: str) -> None:
        """One stream ended, so the child is exiting: take in what the other stream still holds
        (h3's last progress report and error line may still be on their way through the stderr
        reader) before the failure is described, or it would name an earlier phase."""
        open_streams = {"out", "err"} - {ended}

        def poll(timeout: float) -> None | Nothing:
            try:
                event = process.events.get(timeout=timeout)
            except queue.Empty:
                return NOTHING
            if event.text is None:
                open_streams.discard(event.stream)
            elif event.stream == "err":
                self._take_stderr(event, job, now=job.child.now())
            return None if not open_streams else NOTHING

        wait_until(poll, deadline=Deadline(EOF_DRAIN_SECONDS), on_expired=lambda: None)

    def _process_gone(self, process: _SessionProcess, job: _Job) -> None:
        """A stream hit EOF: the child is exiting. Turn its status into a typed error."""
        ended = reap(process.engine.popen)
        log = "\n".join(job.stderr)
        message = engine_message_from(log)     # h3's last error, never a cache notice
        raise child_gone("the h3 session", ended, where=job.where(), engine_message=message, stderr=log,
                         command=job.commands,
                         hint=failure_hint(job.request, message, signal_number=ended.signal) if ended.signal
                         else failure_hint(job.request, message, model_dir=self.model_dir))

    def _command(self, command: SessionCommand, job: _Job) -> None:
        """Send one `!` command; its one reply is on stdout (worked) or stderr (refused)."""
        assert self._process is not None
        job.commands.append(command.text)
        job.in_sync = False
        self._process.send(command.text)
        while True:
            event = self._next_event(job)
            line = event.text or ""
            if event.stream == "out" and command.accepts(line):
                assert self._settings is not None
                self._settings = command.applied_to(self._settings)
                job.in_sync = True
                return
            if event.stream == "err" and (line.startswith("h3: ") or line.startswith("Usage: ")):
                job.in_sync = True
                message = line[4:] if line.startswith("h3: ") else line
                raise SessionCommandError(f"h3 refused {command.text!r}: {message}", engine_message=message,
                                   stderr="\n".join(job.stderr), command=job.commands)

    def _run_prompt(self, line: str, job: _Job) -> tuple[Path, int]:
        """Send the prompt, then the two end markers once h3 no longer decodes media (see the
        module notes); return (MP4 path, seed) or raise EngineError."""
        process = self._process
        assert process is not None
        job.commands.append(line)
        job.in_sync = False
        process.send(line)
        markers_sent = False

        def send_markers() -> None:
            nonlocal markers_sent
            if not markers_sent:
                markers_sent = True
                process.send("!output")       # stdout "Output: DIR" once generate() returned
                process.send(SYNC_COMMAND)    # stderr "h3: unknown command; type !help" after that

        produced: Path | None = None
        seed: int | None = None
        engine_lines: list[str] = []
        seen_output = seen_sync = False
        while not (seen_output and seen_sync):
            event = self._next_event(job)
            text = event.text or ""
            if event.stream == "out":
                if seed is None and (match := _SEED_LINE.match(text)):
                    seed = int(match["seed"])
                elif match := _DONE_LINE.match(text):
                    produced = Path(match["path"])
                    send_markers()
                elif text.startswith("Output: ") and markers_sent:
                    seen_output = True
            elif text == UNKNOWN_COMMAND_REPLY and markers_sent:
                seen_sync = True
                job.stderr.pop()       # our marker, not part of the job's log
            elif text.startswith("h3: "):
                error = engine_error_text(text)      # not a cache notice or another informational line
                if error is not None:
                    engine_lines.append(error)
                if not text.startswith(_DECODING_NOTICES):
                    send_markers()
        job.in_sync = True
        if produced is None:
            message = engine_lines[-1] if engine_lines else None
            log = "\n".join(job.stderr)
            raise_for_disk_problem(log, self._disk_needs(job.request, None), engine_message=message)
            raise EngineError(f"h3 failed: {message}" if message else "h3 produced no video",
                              engine_message=message, stderr=log, command=job.commands,
                              hint=failure_hint(job.request, message, model_dir=self.model_dir))
        assert seed is not None
        return produced, seed


# ============================================================================ one per host process

_shared: dict[tuple[str, str], SessionEngine] = {}
_shared_guard = threading.Lock()


def shared_session(engine_path: Path | str | None = None, model_dir: Path | str | None = None,
                   **options: object) -> SessionEngine:
    """The process-wide SessionEngine for this engine binary and model directory.

    For hosts that render many clips (the ComfyUI H3 Engine node's "session" mode): every
    caller asking for the same (engine, model dir) gets the same session, so the model stays
    resident across jobs, graphs and nodes. The process inside starts on first use, restarts
    transparently after a crash or when the binary changes, exits after `idle_timeout`
    seconds idle, and is shut down at interpreter exit. `options` (SessionEngine keywords)
    apply only when the session is first created.

    A one-shot run (here or in another process) does not sit behind it: while this session is
    idle it steps aside (shuts down) as soon as someone waits for the engine lock; while it is
    busy, right after its job (see the module docstring). The next session job restarts it.
    """
    engine = locate_engine(engine_path)
    model = locate_model_dir(model_dir)
    key = (os.path.realpath(engine), os.path.realpath(model))
    with _shared_guard:
        session = _shared.get(key)
        if session is None:
            session = SessionEngine(engine, model, **options)  # type: ignore[arg-type]
            _shared[key] = session
        return session
