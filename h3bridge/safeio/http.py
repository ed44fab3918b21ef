"""Fetching a file over HTTP with every wait bounded and never more bytes than declared.

httpx does the HTTP (connections, TLS, redirects, proxies from the environment, chunked bodies);
this module adds the bounds a download needs and no HTTP client has by itself:

* connect and read timeouts (`FetchLimits.connect_timeout`, `read_timeout`): a server that never
  answers, or goes silent, is an error after that long;
* a stall bound that progress cannot reset (`stall_bytes` per `stall_window`): a server dripping a
  byte every 2 s never trips a read timeout, but it delivers less than the window asks for and is
  stopped. It is judged on bytes over time, not on "something arrived";
* an overall deadline (`deadline`, seconds, or the absolute `deadline_at` a caller shares across
  attempts);
* a watchdog for what happens inside httpx between two pieces of the body: the status and headers
  must arrive within `stall_window` (a server dripping its headers a byte at a time never trips a
  read timeout either), and the deadline holds during a read. When either passes, the watchdog
  shuts the connection's socket down (found through httpcore's `trace` extension), so the read
  blocked in httpx returns at once;
* the declared size: nothing past `size` bytes is ever written. A Content-Length over it is refused
  before the body is read, and a body (chunked, or lying) that goes on past it stops there:
  `FetchTooLong`;
* resume: a kept `.part` is continued with a Range request from its size; a server that ignores
  the Range (200) restarts the file from 0; a part longer than `size` is not a prefix and is dropped.
  So every fetch either finishes at exactly `size` bytes or leaves a prefix the next one continues.

The body is written in whole `write_chunk` pieces (what was received since the last whole piece is
dropped on a failure, as huggingface_hub's http_get does), so a kept part is always a prefix made of
complete writes.

Errors are `FetchError` and subclasses (the project's family): the URL in them never shows a user
name, password or query string.
"""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ..errors import H3BridgeError

T = TypeVar("T")


@dataclass(frozen=True)
class FetchLimits:
    """The bounds of one fetch. Defaults suit a large file from a hub over an ordinary connection."""

    connect_timeout: float = 15.0        # seconds to open a connection
    read_timeout: float = 30.0           # longest silence on an open connection
    stall_window: float = 60.0           # a server must deliver stall_bytes in every window this long
    stall_bytes: int = 256 << 10         # ... 256 KiB a minute (~4 KiB/s): far below any real connection
    deadline: float | None = None        # seconds for the whole fetch (None: only the bounds above)

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "stall_window"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"FetchLimits.{name} must be a positive finite number of seconds, not {value!r}")
        if not (isinstance(self.stall_bytes, int) and self.stall_bytes >= 0):
            raise ValueError(f"FetchLimits.stall_bytes must be a whole number >= 0, not {self.stall_bytes!r}")

    def deadline_from_now(self) -> float | None:
        return None if self.deadline is None else time.monotonic() + self.deadline


class FetchError(H3BridgeError):
    """A fetch failed (`url` is shown without credentials or query). `received` is how many bytes
    the part holds now."""

    def __init__(self, message: str, *, url: str, received: int = 0, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.url = url
        self.received = received


class FetchTimeout(FetchError):
    """The server did not connect or answer within the timeouts, or the deadline passed."""


class FetchStalled(FetchError):
    """The server delivered less than `stall_bytes` in a `stall_window` (a drip)."""


class FetchTooLong(FetchError):
    """The server sent, or declared, more bytes than the caller declared the file to have."""


class FetchStatusError(FetchError):
    """The server answered with an HTTP status that is not the file (`status`)."""

    def __init__(self, message: str, *, url: str, status: int, received: int = 0, hint: str | None = None) -> None:
        super().__init__(message, url=url, received=received, hint=hint)
        self.status = status


class FetchConnectionError(FetchError):
    """The connection could not be made or broke before the body ended."""


def shown_url(url: str) -> str:
    """`url` as messages show it: no user name or password, no query (signed URLs carry tokens)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an invalid URL)"
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def fetch_to_file(url: str, part: str | os.PathLike[str], *, size: int, headers: Mapping[str, str] | None = None,
                  limits: FetchLimits = FetchLimits(), deadline_at: float | None = None,
                  write_chunk: int = 1 << 20, on_bytes: Callable[[int], None] | None = None,
                  client: "object | None" = None) -> None:
    """Bring `part` to the `size` bytes at `url`, continuing from what it holds (see the module doc).

    `deadline_at` (time.monotonic()) overrides `limits.deadline` so that attempts of one download
    share one deadline; `on_bytes(n)` is told of every piece written (a progress bar);
    `client` is an httpx.Client to reuse (else one is made and closed here). Raises FetchError."""
    import httpx
    part = Path(part)
    if not (isinstance(size, int) and size >= 0):
        raise ValueError(f"size must be a whole number >= 0, not {size!r}")
    if deadline_at is None:
        deadline_at = limits.deadline_from_now()
    shown = shown_url(url)
    own_client = client is None
    http = httpx.Client(follow_redirects=True) if own_client else client
    try:
        with _open_part(part) as sink:
            offset = sink.tell()
            if offset > size:                 # longer than the file: not a prefix of it
                sink.seek(0)
                sink.truncate()
                offset = 0
            if offset == size:
                return
            request_headers = dict(headers or {})
            # byte ranges of the file itself, not of a gzip stream of it
            request_headers["Accept-Encoding"] = "identity"
            if offset:
                request_headers["Range"] = f"bytes={offset}-"
            watchdog = _Watchdog()
            try:
                answer_by = time.monotonic() + limits.stall_window
                watchdog.arm(answer_by if deadline_at is None else min(answer_by, deadline_at),
                             f"{shown} did not send its answer (status and headers) within "
                             f"{limits.stall_window:g} s" if deadline_at is None or answer_by <= deadline_at
                             else f"the deadline for {shown} passed before it answered")
                with http.stream("GET", url, headers=request_headers,          # type: ignore[attr-defined]
                                 timeout=_timeout(limits, deadline_at, shown, offset),
                                 extensions={"trace": watchdog.trace}) as response:
                    watchdog.arm(deadline_at, f"{shown} did not finish by the deadline")
                    offset = _check_response(response, sink, offset, size, shown)
                    _read_body(response, sink, offset, size, shown, limits, deadline_at, write_chunk, on_bytes)
            except (httpx.HTTPError, FetchConnectionError) as error:
                if watchdog.fired is not None:        # the watchdog cut the connection: say why
                    raise FetchTimeout(watchdog.fired, url=shown, received=sink.tell()) from None
                if isinstance(error, FetchConnectionError):
                    raise
                raise _from_httpx(error, shown, limits, deadline_at, sink.tell()) from None
            finally:
                watchdog.disarm()
    finally:
        if own_client:
            http.close()      # type: ignore[attr-defined]


def _from_httpx(error: Exception, shown: str, limits: FetchLimits, deadline_at: float | None,
                received: int) -> FetchError:
    import httpx
    try:
        raise error
    except httpx.TimeoutException:
        what = "connect" if isinstance(error, httpx.ConnectTimeout) else "answer"
        return FetchTimeout(f"{shown} did not {what} within {_seconds(limits, deadline_at, error)}",
                            url=shown, received=received)
    except httpx.HTTPError:     # refused, reset, a body that ended early, a protocol error
        return FetchConnectionError(f"the connection to {shown} failed: {error or type(error).__name__}",
                                    url=shown, received=received)


class _Watchdog:
    """Cuts the connections of one fetch when a time passes (arm), by shutting their sockets down:
    a read blocked inside httpx then returns with an error, and `fired` says why. The sockets are
    those httpcore opens for this request (its `trace` extension reports each new connection)."""

    def __init__(self) -> None:
        self.sockets: list[object] = []
        self.fired: str | None = None
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()

    def trace(self, event: str, info: dict) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                with self.lock:
                    self.sockets.append(sock)
                    if self.fired is not None:
                        self._cut(sock)

    def arm(self, at: float | None, reason: str) -> None:
        self.disarm()
        if at is None:
            return
        self.timer = threading.Timer(max(at - time.monotonic(), 0.0), self._fire, args=(reason,))
        self.timer.daemon = True
        self.timer.start()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, reason: str) -> None:
        with self.lock:
            self.fired = reason
            for sock in self.sockets:
                self._cut(sock)

    @staticmethod
    def _cut(sock: object) -> None:
        import socket
        try:
            sock.shutdown(socket.SHUT_RDWR)       # type: ignore[attr-defined]
        except OSError:
            pass                                   # already closed: nothing left to cut


def _open_part(part: Path):
    """The part file for reading and appending (created if missing): only a regular file, never
    through a link (a FIFO opened non-blocking is seen and refused, never waited on)."""
    from .paths import describe_mode
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(part, flags, 0o644)
    kind = describe_mode(os.fstat(descriptor).st_mode)
    if kind is not None:
        os.close(descriptor)
        raise FetchError(f"{part} is {kind}, not a regular file to download into", url=str(part),
                         hint=f"remove it (`rm {part}`), then fetch again")
    os.set_blocking(descriptor, True)
    sink = os.fdopen(descriptor, "r+b")
    sink.seek(0, os.SEEK_END)
    return sink


def _timeout(limits: FetchLimits, deadline_at: float | None, shown: str, received: int):
    import httpx
    left = None if deadline_at is None else deadline_at - time.monotonic()
    if left is not None and left <= 0:
        raise FetchTimeout(f"the deadline for {shown} passed", url=shown, received=received)

    def bounded(value: float) -> float:
        return value if left is None else max(min(value, left), 0.001)

    return httpx.Timeout(connect=bounded(limits.connect_timeout), read=bounded(limits.read_timeout),
                         write=bounded(limits.read_timeout), pool=bounded(limits.connect_timeout))


def _seconds(limits: FetchLimits, deadline_at: float | None, error: Exception) -> str:
    import httpx
    value = limits.connect_timeout if isinstance(error, (httpx.ConnectTimeout, httpx.PoolTimeout)) \
        else limits.read_timeout
    if deadline_at is not None and deadline_at - time.monotonic() < 0.01:
        return "the deadline"
    return f"{value:g} s"


def _check_response(response, sink, offset: int, size: int, shown: str) -> int:
    """Where the body starts in the file; refuses what is not the file, or declares more than `size`."""
    status = response.status_code
    if status == 200 and offset:
        sink.seek(0)             # the server ignored the Range: the body is the whole file again
        sink.truncate()
        offset = 0
    elif status == 206:
        found = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
        if found is None or int(found[1]) != offset or (found[3] != "*" and int(found[3]) != size):
            raise FetchConnectionError(f"{shown} answered the range request from byte {offset} with "
                                       f"{response.headers.get('content-range')!r}, not the rest of a "
                                       f"{size}-byte file", url=shown, received=offset)
    elif status != 200:
        raise FetchStatusError(f"{shown} answered HTTP {status}", url=shown, status=status, received=offset)
    declared = response.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and offset + int(declared) > size:
        raise FetchTooLong(f"{shown} declares {offset + int(declared)} bytes, more than the {size} bytes "
                           "the file has", url=shown, received=offset)
    return offset


def _read_body(response, sink, offset: int, size: int, shown: str, limits: FetchLimits, deadline_at: float | None,
               write_chunk: int, on_bytes: Callable[[int], None] | None) -> None:
    pending = bytearray()
    written = offset
    window_start, window_bytes = time.monotonic(), 0

    def flush(count: int) -> None:
        """Write the first `count` pending bytes."""
        nonlocal written
        sink.write(pending[:count])
        sink.flush()
        written += count
        if on_bytes is not None:
            on_bytes(count)
        del pending[:count]

    for piece in response.iter_bytes():      # each piece as the network delivers it: the bounds see every one
        now = time.monotonic()
        room = size - written - len(pending)
        if len(piece) > room:
            pending += piece[:room]
            flush(len(pending))
            raise FetchTooLong(f"{shown} sent more than the {size} bytes the file has (the body went on past "
                               "its end)", url=shown, received=written)
        pending += piece
        window_bytes += len(piece)
        while len(pending) >= write_chunk:
            flush(write_chunk)
        if deadline_at is not None and now > deadline_at:
            raise FetchTimeout(f"{shown} did not finish by the deadline ({written + len(pending)} of {size} bytes)",
                               url=shown, received=written)
        if now - window_start >= limits.stall_window:
            if window_bytes < limits.stall_bytes:
                raise FetchStalled(f"{shown} stalled: {window_bytes} bytes in {now - window_start:.0f} s, less than "
                                   f"the {limits.stall_bytes} bytes per {limits.stall_window:g} s a download needs",
                                   url=shown, received=written)
            window_start, window_bytes = now, 0
    if pending:
        flush(len(pending))
    if written < size:
        raise FetchConnectionError(f"{shown} ended the body after {written} of {size} bytes", url=shown,
                                   received=written)


def call_with_deadline(call: Callable[[], T], seconds: float, what: str) -> T:
    """`call()` (a library's HTTP call that takes timeouts but no overall deadline, such as
    huggingface_hub's model_info) given at most `seconds`: after that FetchTimeout, and the call is
    left to end on its own timeouts in a daemon thread (it cannot hold the process's exit)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:       # handed to the caller's thread as it is
            outcome["error"] = error

    worker = threading.Thread(target=run, name=f"h3bridge-fetch {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise FetchTimeout(f"{what} did not answer within {seconds:g} s", url=what)
    if "error" in outcome:
        raise outcome["error"]            # type: ignore[misc]
    return outcome["value"]               # type: ignore[return-value]


__all__ = ["FetchConnectionError", "FetchError", "FetchLimits", "FetchStalled", "FetchStatusError", "FetchTimeout",
           "FetchTooLong", "call_with_deadline", "fetch_to_file", "shown_url"]
