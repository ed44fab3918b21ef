"""The command-line parts every subcommand that runs an engine shares (`generate` in main.py,
`story` in story.py, `serve` in serve.py): the engine flags and the engines they
choose, signals and exit statuses, the progress display.

It lives below all three so that none of them imports another (main.py registers the other two).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generic, Iterator, Sequence, TypeVar

from ..cancel import CancelToken, PauseControl
from .flags import float_flag
from ..errors import GenerationCancelled, H3BridgeError, RequestError, UnsupportedRequestError
from ..fixes import Change, Given
from ..history.eta import eta_suffix     # seconds left from past runs of the shape (job history)
from ..progress import PAUSED_PHASE, WAITING_PHASE, ProgressEvent
from ..vocabulary import ENGINE_KIND_MEANING, ENGINE_KINDS, EngineKind, read_engine_kind
from ..runnable import h3bridge_command

if TYPE_CHECKING:
    from .library import PreviewWriter
    from ..engines.protocol import Engine
    from ..model.memory import MachineFacts

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130


# ---------------------------------------------------------------------------------------------
# The command line's words for the request vocabulary (h3bridge.fixes: one renderer per interface)

# Each field a fix may name, as the flag that sets it (GenerationRequest's fields and the settings
# beside a request). `prompt` and `references` are said differently (see cli_words).
FLAG_FOR_FIELD: dict[str, str] = {
    "width": "--width", "height": "--height", "render_width": "--render-width",
    "render_height": "--render-height", "frames": "--frames", "seconds": "--seconds", "seed": "--seed",
    "steps": "--steps", "reuse": "--reuse", "layers": "--layers", "core_reuse": "--core-reuse",
    "token_reduction": "--token-reduction", "ssd_streaming": "--ssd-streaming",
    "int8_row_fc2": "--int8-row-fc2", "reference_rope": "--reference-rope", "slower_paths": "--slower-paths",
    "first_frame": "--first-frame", "last_frame": "--last-frame", "reference_image_size": "--ref-image-size",
    "stall_timeout": "--stall-timeout", "preview": "--show", "force": "--force", "overwrite": "--overwrite",
    "engine_path": "--engine-path", "model_dir": "--model-dir", "library_path": "--library-path",
    "redo": "--redo", "only": "--only", "prompt": "--prompt", "job_dir": "--job-dir",
    "preset": "--preset", "engine": "--engine",
    # `model download`'s (model.download.download_model), `lora fold`'s, `verify`'s
    "repo_id": "--repo", "revision": "--revision", "partition": "--partition", "rounding": "--rounding",
    "verbose": "--verbose",
}


def cli_word(change: Change) -> str:
    """One change as the command line takes it: `--width 640`, `--force`, `(omit --show)` for a
    switch to leave off or a setting to leave out; a setting the request gave (a Given) as its flag
    and value as given: `--frames 23`."""
    if change.field == "references" and hasattr(change.value, "value"):     # a reference of one kind
        return f"a reference given with --ref-{change.value.value.replace('_', '-')}"   # type: ignore[union-attr]
    flag = FLAG_FOR_FIELD.get(change.field)
    value = change.value
    if isinstance(change, Given):      # a setting the request gave, named in a message
        name = flag or change.field
        if value in ("True", "False") and flag is not None:      # a switch: on, or left off
            return flag if value == "True" else f"no {flag}"
        return name if value is None else f"{name} {value}"
    if flag is None:      # no flag sets it: say so rather than print a flag argparse would refuse
        return f"(not a command-line setting: {change.field})"
    if value is True:
        return flag
    if value is False or value is None:
        return f"(omit {flag})"
    if isinstance(value, (set, frozenset, tuple, list)):
        return f"{flag} " + " ".join(sorted(str(getattr(item, "value", item)) for item in value))
    return f"{flag} {getattr(value, 'value', value)}"


def cli_words(group: "Sequence[Change]") -> str:
    """A group of changes as flags, in order: `--render-width 640 --render-height 352`."""
    return " ".join(cli_word(change) for change in group)


def cli_hint(error: H3BridgeError) -> str | None:
    """The error's hint in the command line's words (its fix said as flags)."""
    return error.hint_in(cli_words)


def cli_message(error: H3BridgeError) -> str:
    """The error's message in the command line's words."""
    return error.message_in(cli_words)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """--engine-path / --model-dir, shared by every subcommand that runs or inspects h3."""
    parser.add_argument("--engine-path", metavar="PATH",
                        help="the h3 binary or its h3.c checkout (default: $H3_BIN, then h3 on PATH)")
    parser.add_argument("-d", "--model-dir", metavar="PATH",
                        help="the MiniMax-H3 model directory (default: $H3_MODEL_DIR)")


FALLBACK_COLUMNS = 80


def bar_columns() -> int:
    """Columns for a progress line on stderr: the terminal's width less one (a line that fills
    the last column wraps), else $COLUMNS, else 80. A terminal that reports 0 columns (an unsized
    pty: some IDE consoles, `docker exec` or `ssh` without a size) would otherwise get a bar
    trimmed to nothing; tqdm's own dynamic_ncols takes the 0 at its word."""
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):     # not a terminal, or stderr replaced
        columns = 0
    if columns <= 0:
        text = os.environ.get("COLUMNS", "")
        columns = int(text) if text.isdigit() else 0
    return (columns if columns > 0 else FALLBACK_COLUMNS) - 1


# Without a terminal, a long wait for the engine is reported when it starts and after these
# seconds, then every WAIT_LINE_EVERY: visible in a log, and a few lines an hour at most.
WAIT_LINES_AFTER = (10.0, 30.0, 60.0)
WAIT_LINE_EVERY = 60.0


PAUSED_WORDS = "paused"
RESUME_WORDS = "`fg` resumes"


class PhaseProgressBars:
    """One tqdm bar per upstream phase, with elapsed time; closed as each phase ends.

    Without a terminal (a log file, a pipe) a bar's redraws are noise: one line per phase is
    written instead (and, while waiting for another job's engine, a line now and then saying
    who holds it). Progress is a courtesy: if stderr breaks (a closed pipe), the display turns
    itself off and the render goes on. `waited` is how long the job waited for the engine."""

    def __init__(self, enabled: bool = True, *, terminal: bool | None = None,
                 note: Callable[[], str | None] | None = None) -> None:
        self.enabled = enabled
        self.note = note      # more for the bar's postfix (the library engine's "previews N/M")
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self._bar = None
        self._phase: str | None = None
        self.waited = 0.0
        self._next_wait_line = 0.0
        self._holder: str | None = None

    def __call__(self, event: ProgressEvent) -> None:
        if event.phase == WAITING_PHASE:
            self.waited = max(self.waited, event.elapsed)
        if not self.enabled:
            return
        try:
            self._show(event)
        except (OSError, ValueError):     # EPIPE, or stderr closed under us
            self.enabled = False
            self._bar = None

    def _show(self, event: ProgressEvent) -> None:
        if event.phase == WAITING_PHASE:
            self._show_wait(event)
            return
        if event.phase == PAUSED_PHASE:      # the phase's bar stays, saying so (the engine's next event clears it)
            self.show_paused()
            return
        if not self.terminal:
            if event.phase != self._phase:
                self._phase = event.phase
                print(f"h3bridge: {event.phase} (overall {event.fraction:.0%}, {event.elapsed:.1f} s{eta_suffix(event)})",
                      file=sys.stderr, flush=True)
            return
        from tqdm import tqdm
        if event.phase != self._phase or self._bar is None or self._bar.total != event.total:
            self.close()
            self._phase = event.phase
            self._bar = tqdm(total=event.total, desc=f"{event.phase:<22}", unit="step", file=sys.stderr,
                             leave=True, ncols=bar_columns(),
                             bar_format="{desc} {percentage:3.0f}%|{bar}| {n}/{total} [{elapsed}]{postfix}")
        self._bar.ncols = bar_columns()      # follows a resized terminal, like dynamic_ncols
        self._bar.n = event.done
        extra = self.note() if self.note is not None else None
        self._bar.set_postfix_str(f"overall {event.fraction:4.0%}, {event.elapsed:.1f} s"
                                  + (f", {extra}" if extra else "") + eta_suffix(event), refresh=False)
        self._bar.refresh()

    def _show_wait(self, event: ProgressEvent) -> None:
        """Waiting for another job's engine: who holds it and for how long, kept visible."""
        held = f"held by {event.detail}" if event.detail else "held by another job"
        if not self.terminal:
            first = self._phase != WAITING_PHASE
            new_holder = event.detail is not None and event.detail != self._holder and not first
            if first or new_holder or event.elapsed >= self._next_wait_line:
                print(f"h3bridge: {'waiting' if first else 'still waiting'} for the engine"
                      + ("" if first else f" ({event.elapsed:.0f} s)") + f": {held}", file=sys.stderr, flush=True)
                later = [mark for mark in WAIT_LINES_AFTER if mark > event.elapsed]
                self._next_wait_line = later[0] if later else event.elapsed + WAIT_LINE_EVERY
            self._phase, self._holder = WAITING_PHASE, event.detail or self._holder
            return
        from tqdm import tqdm
        if self._phase != WAITING_PHASE or self._bar is None:
            self.close()
            self._phase = WAITING_PHASE
            self._bar = tqdm(total=None, desc=WAITING_PHASE, file=sys.stderr, leave=True, ncols=bar_columns(),
                             bar_format="{desc} [{elapsed}] {postfix}")
        self._bar.ncols = bar_columns()
        self._bar.set_postfix_str(held, refresh=False)
        self._bar.refresh()

    def show_paused(self) -> None:
        """The progress bar says the job is paused (Ctrl-Z); its next event shows it running again.
        (Without a terminal the line pause_on_ctrl_z writes says it.)"""
        if not self.enabled or not self.terminal or self._bar is None:
            return
        try:
            self._bar.set_postfix_str(f"{PAUSED_WORDS} ({RESUME_WORDS})", refresh=True)
        except (OSError, ValueError):
            self.enabled = False
            self._bar = None

    def close(self) -> None:
        if self._bar is not None:
            try:
                self._bar.close()
            except (OSError, ValueError):
                pass
            self._bar = None


def add_engine_run_options(parser: argparse.ArgumentParser, *, warm_by_default: bool = False) -> None:
    """The options that choose and run an engine, shared by `generate` and `story` (an engine added
    here, and in `engine_from_args`, reaches both). `warm_by_default`: the warm session unless
    told otherwise (a story renders many clips), instead of one-shot."""
    add_engine_options(parser)
    add_engine_safety_options(parser)
    default = EngineKind.SESSION if warm_by_default else EngineKind.ONE_SHOT
    engine = parser.add_argument_group("engine")
    add_engine_choice(engine, parser, kinds=ENGINE_KINDS, default=default)
    # the flags that chose the warm mode before `--engine session` (issue 30): still read, with a notice
    engine.add_argument("--session", dest="session", action=OldEngineFlag, kind=EngineKind.SESSION)
    engine.add_argument("--one-shot", dest="session", action=OldEngineFlag, kind=EngineKind.ONE_SHOT)
    add_background_option(engine)
    from .library import add_library_options      # --engine library (engines/library.py)
    add_library_options(parser)
    from .remote import add_remote_option      # --remote URL: render on a Videos API server
    add_remote_option(parser)


def add_background_option(group: "argparse._ArgumentGroup") -> None:
    """--background (generate, story, serve): the engine at background priority (engines/priority.py)."""
    from ..engines.priority import platform_background
    group.add_argument("--background", action="store_true",
                       help=f"run the engine at background priority ({platform_background()}), so the machine stays "
                            "responsive while it renders; a warm engine stays so until it is restarted")


class EngineChoices(tuple):
    """The engine kinds a command offers (what --help and "invalid choice" list), which also holds
    every older spelling (vocabulary.OLD_ENGINE_SPELLINGS) and every other kind, so that argparse
    lets them through to _EngineFlag: it says what they are called now, or why this command does
    not take that kind, in better words than "invalid choice"."""

    def __contains__(self, value: object) -> bool:
        try:
            read_engine_kind(value)
        except ValueError:
            return False
        return True

    def offers(self, kind: EngineKind) -> bool:
        return any(choice == kind.value for choice in self)


class _EngineFlag(argparse.Action):
    """--engine KIND: the EngineKind in `dest`, and the spelling it was given in (an old one gets
    its notice once the whole command line is read: engine_kind)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        kind, old = read_engine_kind(values)
        if not self.choices.offers(kind):      # serve: its own machine only
            offered = ", ".join(self.choices)
            raise argparse.ArgumentError(self, f"{kind.value} is not an engine `{parser.prog}` runs (it runs "
                                               f"{offered}); to pass jobs on to other servers, put "
                                               f"`{h3bridge_command('fleet')}` in front of them")
        setattr(namespace, self.dest, kind)
        namespace.engine_spelling = old


class OldEngineFlag(argparse.Action):
    """--session / --one-shot, the flags before `--engine session` / `--engine one-shot`: hidden
    from --help; `dest` keeps the flag as given (engine_kind reads it, says its notice and finds
    contradictions)."""

    def __init__(self, option_strings, dest, kind: EngineKind, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.kind = kind
        super().__init__(option_strings, dest, nargs=0, default=None, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        given = [*(getattr(namespace, self.dest, None) or []), (option_string, self.kind)]
        setattr(namespace, self.dest, given)


def add_engine_choice(group: argparse._ActionsContainer, parser: argparse.ArgumentParser, *,
                      kinds: tuple[str, ...], default: EngineKind) -> None:
    """--engine {kinds} (vocabulary.EngineKind), its help from ENGINE_KIND_MEANING: generate and
    story offer every kind, serve the ones on its own machine. Read with `engine_kind(args)`."""
    notes = {EngineKind.SESSION: "; a request it cannot take runs one-shot",
             EngineKind.LIBRARY: "; needs --library-path or $H3_LIBRARY", EngineKind.REMOTE: "; with --remote URL"}
    meanings = ". ".join(f"{kind}: {ENGINE_KIND_MEANING[EngineKind(kind)]}{notes.get(EngineKind(kind), '')}"
                         for kind in kinds)
    group.add_argument("--engine", choices=EngineChoices(kinds), action=_EngineFlag, default=None,
                       metavar="{" + ",".join(kinds) + "}",
                       help=f"how the clip is rendered. {meanings}. Default: {default}")
    parser.set_defaults(engine_default=default)


def _flag_words(kind: EngineKind) -> str:
    return f"--engine {kind}"


def engine_kind(args: argparse.Namespace) -> EngineKind:
    """The engine the command line chose, in the one vocabulary (EngineKind), from `--engine`, the
    older spellings (`--engine cli`/`oneshot`, `--session`, `--one-shot`: a notice each on stderr)
    and `--remote URL` (the remote engine). Contradicting flags, --engine remote without --remote,
    and the library engine's own flags with another engine are refused (RequestError naming the
    flags). Read once: the result is kept in `args.engine_kind`."""
    known = getattr(args, "engine_kind", None)
    if isinstance(known, EngineKind):
        return known
    given: EngineKind | None = getattr(args, "engine", None)
    spelled: str | None = getattr(args, "engine_spelling", None)
    old_flags: list[tuple[str, EngineKind]] = getattr(args, "session", None) or []
    remote = getattr(args, "remote", None)
    notices: list[tuple[str, str]] = []
    shown = f"--engine {spelled or given}"
    if len({kind for _, kind in old_flags}) > 1:
        raise RequestError(f"{old_flags[0][0]} and {old_flags[-1][0]} contradict each other", field="engine",
                           hint="give one engine: --engine session or --engine one-shot")
    flag, flag_kind = old_flags[-1] if old_flags else (None, None)
    kind = given
    if flag_kind is not None:
        if given is not None and spelled == "cli":
            # `--engine cli` named the h3 program, which --session made warm: the pair is one engine
            notices.append((f"{shown} {flag}", _flag_words(flag_kind)))
            spelled = None
        elif given is not None and given is not flag_kind:
            raise RequestError(f"{shown} and {flag} contradict each other ({flag} is the old spelling of "
                               f"{_flag_words(flag_kind)})", field="engine",
                               hint=f"keep one: {shown} or {_flag_words(flag_kind)}")
        else:
            notices.append((flag, _flag_words(flag_kind)))
        kind = flag_kind
    if spelled is not None and given is not None:
        notices.append((shown, _flag_words(given)))
    if remote:
        if kind is not None and kind is not EngineKind.REMOTE:
            words = flag if flag is not None and given is None else shown
            raise RequestError(f"--remote {remote} and {words} contradict each other: --remote renders on that server, "
                               f"{words} on this machine", field="engine",
                               hint=f"drop {words} to render on the server, or drop --remote to render here")
        kind = EngineKind.REMOTE
    elif kind is EngineKind.REMOTE:
        raise RequestError("--engine remote sends the job to a Videos API server, and no --remote URL says which",
                           field="remote", hint="add --remote URL (e.g. --remote http://studio-mac.local:8765), "
                                                "or choose an engine on this machine: --engine one-shot")
    if kind is None:
        kind = getattr(args, "engine_default", EngineKind.ONE_SHOT)
    refuse_library_flags_without_library(args, kind)
    for old, new in notices:
        print(f"h3bridge: notice: {old} is now {new} (the old spelling still works for now)", file=sys.stderr)
    args.engine_kind = kind
    return kind


# The library engine's own flags, by dest (--preview-dir has its own refusal: library.py).
LIBRARY_ONLY_FLAGS = {"library_path": "--library-path", "h3_dir": "--h3-dir"}


def refuse_library_flags_without_library(args: argparse.Namespace, kind: EngineKind) -> None:
    """--library-path / --h3-dir choose the library engine's files: with another engine they would be
    ignored, so they are refused (said in flags, with both ways out)."""
    if kind is EngineKind.LIBRARY:
        return
    given = [dest for dest in LIBRARY_ONLY_FLAGS if getattr(args, dest, None)]
    if given:
        flags = [LIBRARY_ONLY_FLAGS[dest] for dest in given]
        add = "--engine library" + ("" if "library_path" in given else " --library-path PATH (or set $H3_LIBRARY)")
        raise RequestError(f"{' and '.join(flags)} {'chooses' if len(flags) == 1 else 'choose'} the library engine's "
                           f"files, and the engine is {kind}", field=given[0],
                           hint=f"add {add}, or drop {' '.join(flags)}")


def preview_writer_from_args(args: argparse.Namespace) -> "PreviewWriter | None":
    """`--preview-dir`'s writer (checked before anything starts), or None; refused without the library."""
    refuse_preview_without_library(args)
    if not args.preview_dir:
        return None
    from pathlib import Path

    from .library import PreviewWriter
    return PreviewWriter(Path(args.preview_dir), overwrite=args.overwrite)


def refuse_preview_without_library(args: argparse.Namespace) -> None:
    if getattr(args, "preview_dir", None) and engine_kind(args) is not EngineKind.LIBRARY:
        raise RequestError("--preview-dir needs --engine library: the h3 program shows previews only on a terminal",
                           field="preview_dir", hint="add --engine library --library-path PATH, or drop --preview-dir")


# ----------------------------------------------------------------------------- the model folder

def add_model_dir_argument(parser: argparse.ArgumentParser, *, what: str = "the MiniMax-H3 model directory") -> None:
    """-d/--model-dir, as generate, doctor, plan, story and serve take it, for a command that took the
    folder as its first argument before (info, verify, lora fold): that spelling keeps working."""
    parser.add_argument("-d", "--model-dir", metavar="PATH", type=Path, help=f"{what} (default: $H3_MODEL_DIR)")
    parser.add_argument("model_dir_positional", nargs="?", metavar="MODEL_DIR", type=Path,
                        help="the same folder given without -d")


def model_dir_from_args(args: argparse.Namespace) -> Path:
    """The folder -d/--model-dir or MODEL_DIR names (both: refused), else $H3_MODEL_DIR."""
    import os

    from ..engines.locate import MODEL_DIR_ENV
    from ..errors import ModelError, RequestError
    flag, positional = args.model_dir, getattr(args, "model_dir_positional", None)
    if flag is not None and positional is not None:
        raise RequestError(f"the model folder is given twice: --model-dir {str(flag)!r} and MODEL_DIR "
                           f"{str(positional)!r}", field="model_dir",
                           hint="give it once, as -d PATH")
    if flag is not None:
        return model_folder(flag, "--model-dir")
    if positional is not None:
        return model_folder(positional, "MODEL_DIR")
    if os.environ.get(MODEL_DIR_ENV):
        return Path(os.environ[MODEL_DIR_ENV])
    raise ModelError("no model directory given", hint=f"add -d PATH (the model folder) or set {MODEL_DIR_ENV}")


def model_folder(path: Path, shown: str) -> Path:
    """`path` if it is not there (the inventory says what to download) or a folder; a FIFO, a
    device, a file or a dangling link is a bad argument (exit 2), said before anything opens it."""
    from ..errors import ModelError
    from ..safeio.paths import not_a_folder
    what = not_a_folder(path)
    if what is None:
        return path
    if what == "a file":        # a repack checkpoint: the inventory's one wording (what it is, and the fix)
        from ..model.inventory import not_a_model_folder_error
        raise not_a_model_folder_error(path.absolute())
    raise ModelError(f"{shown} {str(path)!r} is {what}, not a model folder",
                     hint="pass the model folder, the one that holds FL2VA/")


def add_engine_safety_options(parser: argparse.ArgumentParser) -> None:
    """The pre-flight override and the stall watchdog, for every subcommand that runs a local
    engine (generate and story through add_engine_run_options; serve, which picks its engine
    with its own --engine)."""
    parser.add_argument("--force", action="store_true",
                        help="start even if the model check or the memory plan says it will fail (see `h3bridge plan`)")
    parser.add_argument("--stall-timeout", type=float_flag(0, MAX_STALL_SECONDS), default=600.0, metavar="SECONDS",
                        help="stop the engine after this long without progress (default 600; 0 disables)")


MAX_STALL_SECONDS = 7 * 24 * 3600.0     # a week: longer is a typo, not a watchdog


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine the flags describe (`engine_kind`: generate's, story's, serve's and plan's
    --engine), opened by the one factory (engines/factory.py; nothing starts yet). A session hands
    what h3's interactive mode cannot take to one-shot, saying so on stderr."""
    from ..engines.factory import open_engine
    kind = engine_kind(args)
    if kind is EngineKind.REMOTE:
        from .remote import refuse_local_only_flags
        refuse_local_only_flags(args)
        return open_engine(kind, remote_url=args.remote, dialect=getattr(args, "remote_dialect", "h3bridge"))
    if getattr(args, "remote_dialect", "h3bridge") != "h3bridge":
        raise RequestError(f"--remote-dialect {args.remote_dialect} says how to talk to a --remote server, and no "
                           "--remote was given", field="remote_dialect",
                           hint="add --remote URL, or drop --remote-dialect to render on this machine")
    stall_timeout = args.stall_timeout if args.stall_timeout and args.stall_timeout > 0 else None
    return open_engine(kind, engine_path=args.engine_path, model_dir=args.model_dir, stall_timeout=stall_timeout,
                       library_path=getattr(args, "library_path", None), h3_dir=getattr(args, "h3_dir", None),
                       on_fallback=say_running_one_shot,
                       background=getattr(args, "background", False))     # --remote refused it above


def say_running_one_shot(refusal: UnsupportedRequestError) -> None:
    """The command line's words for a session handing a request to one-shot (FallbackEngine)."""
    print(f"h3bridge: {refusal.message}; running it one-shot instead", file=sys.stderr)


def machine_facts_of(engine: Engine, cancel: CancelToken | None = None) -> MachineFacts | None:
    """The facts to plan memory with when the engine knows better than psutil (the library's
    h3_device: Metal's recommended working set); None: this machine as detected."""
    facts = getattr(engine, "machine_facts", None)
    return facts(cancel=cancel) if facts is not None else None


@contextmanager
def cancel_on_signals(cancel: CancelToken) -> Iterator[list[int]]:
    """Ctrl-C, `kill`, a closed terminal cancel `cancel` (the list receives the signal numbers).

    The engine runs in its own process group and would otherwise keep rendering (and holding
    the model) after we are gone. A signal the caller chose to ignore (`nohup`, a background
    job) stays ignored."""
    received: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        received.append(signum)
        cancel.cancel()     # the engine loop notices within 50 ms and stops the process group

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def pause_on_ctrl_z(pause: PauseControl, on_pause: Callable[[], None] | None = None) -> Iterator[None]:
    """Ctrl-Z (SIGTSTP) pauses the engine with the command: the engine, which runs in a session of
    its own and so never hears the terminal's Ctrl-Z, is stopped where it is (PauseControl: its
    process group gets SIGSTOP; its memory stays resident), then this process stops itself as Ctrl-Z
    would have. `fg` (SIGCONT) continues both. A SIGTSTP the caller chose to ignore stays ignored."""
    if signal.getsignal(signal.SIGTSTP) is signal.SIG_IGN:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        pause.pause()
        if on_pause is not None:
            on_pause()
        _say("paused: the engine is stopped where it was and its memory stays in use (resident); "
             "`fg` resumes it, and the clip is the same as without the pause")
        os.kill(os.getpid(), signal.SIGSTOP)      # stopped here until `fg` / `bg` / SIGCONT
        pause.resume()          # (the SIGCONT handler below may have run first: the same resume)
        _say("resumed")

    def continued(signum: int, frame: object) -> None:
        pause.resume()          # continued after a stop that came some other way (kill -STOP)

    previous = {signal.SIGTSTP: signal.signal(signal.SIGTSTP, stop),
                signal.SIGCONT: signal.signal(signal.SIGCONT, continued)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        pause.resume()


def _say(text: str) -> None:
    try:
        # (below a progress bar's line on a terminal, not on it)
        print(f"{chr(10) if sys.stderr.isatty() else ''}h3bridge: {text}", file=sys.stderr, flush=True)
    except OSError:
        pass


Outcome = TypeVar("Outcome")


@dataclass
class SignalledRun(Generic[Outcome]):
    """What `run_with_signals` ran to: the outcome, or the exit status of a cancelled run."""
    outcome: Outcome | None
    status: int | None          # set when Ctrl-C or a signal cancelled the run
    wall_seconds: float         # wall time, waiting for the engine included, paused time left out


def run_with_signals(engine: Engine, display: PhaseProgressBars, cancel: CancelToken,
                     call: Callable[[PauseControl], Outcome], *, also: AbstractContextManager | None = None,
                     on_cancelled: Callable[[GenerationCancelled], None] | None = None) -> SignalledRun[Outcome]:
    """The one way a command runs an engine under the terminal's signals (generate, --takes,
    story): Ctrl-C / SIGTERM / SIGHUP cancel `cancel`, Ctrl-Z pauses the engine with the command
    (`call` gets the PauseControl to hand the engine), and the display and the engine are closed
    whatever happens. `also` is one more context held around the run (story: stop after a shot
    on SIGUSR1); `on_cancelled` may reword a cancellation before its exit status is chosen."""
    pause = PauseControl()
    started = time.monotonic()
    with cancel_on_signals(cancel) as received, pause_on_ctrl_z(pause, display.show_paused), \
            (also if also is not None else nullcontext()):
        try:
            outcome = call(pause)
        except GenerationCancelled as error:
            display.close()         # before the cancellation is said (cancelled_status prints it)
            if on_cancelled is not None:
                on_cancelled(error)
            return SignalledRun(None, cancelled_status(error, received), 0.0)
        finally:
            display.close()
            engine.close()
    return SignalledRun(outcome, None, time.monotonic() - started - pause.paused_seconds())


def cancelled_status(error: GenerationCancelled, received: list[int]) -> int:
    """The exit status for a cancelled job: 130 for Ctrl-C (main reports it), 128+N for a signal N."""
    if received and received[0] != signal.SIGINT:
        print(f"h3bridge: {error.message} ({signal.Signals(received[0]).name})", file=sys.stderr)
        return 128 + received[0]     # 143 for SIGTERM, 129 for SIGHUP, as a shell reports them
    raise error
