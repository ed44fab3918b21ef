"""One exception family for everything h3bridge reports.

Where a message came from the engine, `engine_message` keeps h3's own words
verbatim (the text after ``h3: `` on its last error line), so a user can search
upstream issues for it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .fixes import Fix, Words, joined, python_words


class H3BridgeError(Exception):
    """Base class. `hint` says what to do about it, when we know.

    A hint that names settings is given as a `Fix` (h3bridge.fixes): `hint` is then the fix in
    Python's words and `fix` keeps it, so each interface says it in its own (`hint_in(words)`).
    Setting `hint` to text later drops the `fix` (the text is then the whole hint).

    `before_start` is True for a refusal: an error raised before any engine started (a bad
    request, a missing or damaged model, no engine binary, a memory plan or a disk that cannot
    take the clip). Nothing ran and nothing changed, so the request can be fixed and retried;
    the CLI exits 2 for these and 1 for failures of a job that ran."""

    before_start: bool = False

    def __init__(self, message: "str | Fix", *, hint: "str | Fix | None" = None) -> None:
        # A message that names settings (a reference's kind, ...) may be a Fix too: said in
        # Python's words here, kept as `message_fix` for `message_in(words)`.
        self.message_fix: Fix | None = message if isinstance(message, Fix) else None
        text = message.say(python_words) if isinstance(message, Fix) else message
        super().__init__(text)
        self.message = text
        self.hint = hint      # type: ignore[assignment]  (the setter takes a Fix too)

    @property
    def hint(self) -> str | None:
        return self._hint

    @hint.setter
    def hint(self, value: "str | Fix | None") -> None:
        self.fix: Fix | None = value if isinstance(value, Fix) else None
        self._hint = value.say(python_words) if isinstance(value, Fix) else value

    def message_in(self, words: Words) -> str:
        """The message in one interface's words (its settings said with `words`)."""
        if self.message_fix is not None and self.message == self.message_fix.say(python_words):
            return self.message_fix.say(words)
        return self.message      # rewritten since (a prefix added by a caller): as it is now

    def hint_in(self, words: Words) -> str | None:
        """The hint in one interface's words: its fix said with `words`, else the hint as it is."""
        return self.fix.say(words) if self.fix is not None else self.hint

    def message_with(self, before: str = "", after: str = "") -> "str | Fix":
        """The message with words around it (`shot 2: ` before it), its settings kept as data: what
        a caller that re-raises with more context gives the new error."""
        if self.message_fix is not None and self.message == self.message_fix.say(python_words):
            return joined(before, self.message_fix, after)
        return before + self.message + after

    @property
    def hint_data(self) -> "str | Fix | None":
        """The hint as it was given: its Fix when it has one (to hand on to another error), else its text."""
        return self.fix if self.fix is not None else self.hint

    def reword(self, before: str = "", after: str = "") -> None:
        """Put words around the message in place (see message_with), its settings kept as data."""
        message = self.message_with(before, after)
        self.message_fix = message if isinstance(message, Fix) else None
        self.message = message.say(python_words) if isinstance(message, Fix) else message
        self.args = (self.message,)

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.hint}" if self.hint else self.message


class RequestError(H3BridgeError, ValueError):
    """The request cannot run as given; raised before any engine starts."""

    before_start = True

    def __init__(self, message: "str | Fix", *, field: str | None = None, hint: "str | Fix | None" = None) -> None:
        super().__init__(message, hint=hint)
        self.field = field


class OutputExistsError(H3BridgeError, FileExistsError):
    """The output path already holds a file and the caller did not allow overwriting it.
    Raised before the engine starts, and also (before_start False) when the file appeared
    while rendering: the new clip is then kept beside it."""

    def __init__(self, message: str, *, hint: str | None = None, before_start: bool = True) -> None:
        super().__init__(message, hint=hint)
        self.before_start = before_start


class MediaError(H3BridgeError):
    """An input or output media file cannot be read or written."""


class DiskError(MediaError):
    """A folder the clip is written to is full, read-only, or not a writable file system.

    `folder` is that folder; `free` and `needed` (bytes) are set when free space was the
    problem and known. Raised before the engine starts when the check can tell
    (`before_start`), and after a render that the disk stopped (h3 and FFmpeg's own words
    are then in `engine_message` and the engine log)."""

    def __init__(self, message: str, *, folder: Path, free: int | None = None, needed: int | None = None,
                 before_start: bool = False, hint: str | None = None, engine_message: str | None = None,
                 stderr: str = "") -> None:
        super().__init__(message, hint=hint)
        self.folder = folder
        self.free = free
        self.needed = needed
        self.before_start = before_start
        self.engine_message = engine_message
        self.stderr = stderr


class ModelError(H3BridgeError):
    """The model directory is missing, has the wrong layout, or cannot be read by h3."""

    before_start = True


class IntegrityError(ModelError):
    """A shard is damaged: bad header, truncated, or its checksum does not match."""

    def __init__(self, message: str, *, path: Path | None = None, tensor: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path
        self.tensor = tensor


class MemoryPlanError(H3BridgeError):
    """The request will not fit in this machine's memory (see the attached plan)."""

    before_start = True

    def __init__(self, message: str, *, plan: object = None, hint: "str | Fix | None" = None) -> None:
        super().__init__(message, hint=hint)
        self.plan = plan


class EngineNotFoundError(H3BridgeError):
    """No h3 binary (or FFmpeg, which h3 needs) could be located or started."""

    before_start = True


class EngineError(H3BridgeError):
    """The engine ran and failed. `engine_message` is h3's own text, verbatim."""

    def __init__(self, message: str, *, engine_message: str | None = None,
                 exit_code: int | None = None, stderr: str = "",
                 command: Sequence[str] = (), hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.engine_message = engine_message
        self.exit_code = exit_code
        self.stderr = stderr
        self.command = list(command)


class EngineCrashedError(EngineError):
    """The engine died from a signal (segfault, abort, out-of-memory kill)."""


class EngineStalledError(EngineError):
    """The watchdog killed an engine that made no progress for too long."""


class SessionError(EngineError):
    """The warm interactive session could not do what was asked."""


class SessionCommandError(SessionError):
    """h3 refused a session `!` command (its reply is `engine_message`) and kept the old value."""


class UnsupportedRequestError(EngineError):
    """This engine cannot run this request as given, though another can (the one-shot engine runs
    every valid request); `Engine.check_supported` raises it before anything starts."""

    before_start = True


class SessionUnsupportedError(SessionError, UnsupportedRequestError):
    """The warm session cannot run this request as given (e.g. a multi-line prompt: h3's
    interactive mode reads one line per prompt); run it one-shot. Raised before anything starts."""


class DataDirectoryInUse(H3BridgeError):
    """Another `h3bridge serve` owns this data directory (its queue); raised before anything runs."""

    before_start = True


class QueueFullError(H3BridgeError):
    """A server's queue holds as many waiting jobs as it was told to take (`serve --max-queued`);
    nothing was queued. `retry_after` is the seconds after which asking again is worth it."""

    before_start = True

    def __init__(self, message: str, *, retry_after: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retry_after = retry_after


class GenerationCancelled(H3BridgeError):
    """The caller cancelled the job; the engine is gone and no output was left behind."""


class LoraError(ModelError):
    """A LoRA cannot be folded into this model as asked (keys matching nothing, shapes that do not
    fit, dtypes that cannot be folded, a fold that failed its parity probe). Refusals come
    before a byte of the output is written (`before_start`); a fold stopped midway (a failed
    parity probe, an overflow) has `before_start` False and leaves no output either."""

    def __init__(self, message: str, *, hint: str | None = None, before_start: bool = True) -> None:
        super().__init__(message, hint=hint)
        self.before_start = before_start


class RemoteError(EngineError):
    """A video server driven as an engine (`RemoteEngine`) failed the job or could not be used.
    `url` is the server's base URL, `status` the HTTP status when there was a response;
    `engine_message` keeps the server's own words verbatim."""

    def __init__(self, message: str, *, url: str, status: int | None = None, engine_message: str | None = None,
                 hint: str | None = None, before_start: bool | None = None) -> None:
        super().__init__(message, engine_message=engine_message, hint=hint)
        self.url = url
        self.status = status
        if before_start is not None:     # else the class's: an auth refusal comes before anything ran
            self.before_start = before_start


class RemoteAuthError(RemoteError):
    """The server refused the API key (HTTP 401/403), or wanted one and got none."""

    before_start = True


class RemoteUnreachableError(RemoteError):
    """The server could not be reached (refused, unknown host, timed out) or the connection broke."""


class LibraryLoadError(EngineNotFoundError):
    """A libh3 shared library is missing, is not a library, or was built for another OS or CPU
    (h3bridge.libh3.load_library). `path` is the file that was asked for; `hint` the fix."""

    def __init__(self, message: str, *, path: Path | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class LibraryBuildError(EngineNotFoundError):
    """The libh3 test double (`h3-sim-lib`, h3bridge/sim/library.py) could not be compiled: no C
    compiler, no Python headers, or the compiler failed (its output is in `compiler_output`)."""

    def __init__(self, message: str, *, hint: str | None = None, compiler_output: str = "") -> None:
        super().__init__(message, hint=hint)
        self.compiler_output = compiler_output


# ----------------------------------------------------------------------------- values in messages

SHOWN_VALUE_CHARS = 80        # how much of a caller's value a message repeats


def shown_value(value: object, *, limit: int = SHOWN_VALUE_CHARS) -> str:
    """A caller's value as an error message shows it: its repr, cut to `limit` characters.
    Formatting a value must never be the error itself: a whole number Python refuses to print
    (over 4300 digits: ValueError) shows as "(a N-digit number)", and an object whose repr
    raises shows as "(a TYPE object)"."""
    if isinstance(value, int) and not isinstance(value, bool):
        digits = digit_count(value)
        if digits > 30:
            return f"({'a negative' if value < 0 else 'a'} {digits}-digit number)"
        return int.__repr__(value)
    if isinstance(value, (str, bytes)) and len(value) > limit:
        value = value[:limit]            # repr only what is shown (a prompt may be megabytes)
    try:
        text = repr(value)
    except Exception:                    # a caller's object may raise anything from its repr
        return f"(a {type(value).__name__} object)"
    if not isinstance(text, str):
        return f"(a {type(value).__name__} object)"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def digit_count(number: int) -> int:
    """The decimal digits of a whole number of any size, without printing it."""
    number = abs(number)
    if number < 10**18:
        return len(int.__str__(number))
    # log10 from the bit length is at most one below the truth; 10**k settles it exactly.
    import math
    digits = int((number.bit_length() - 1) * math.log10(2))
    while 10 ** digits <= number:
        digits += 1
    return digits
