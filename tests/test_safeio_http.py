"""h3bridge/safeio/http.py: what a server answers, judged without a network (httpx.MockTransport):
never a byte past the declared size, a Range ignored or answered wrongly, statuses, the part file
only a regular file, URLs shown without credentials. The bounds on time (timeouts, stall,
deadline) are exercised against the local test hub in tests/test_model_download_hostile.py."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from h3bridge.safeio.http import (FetchConnectionError, FetchError, FetchLimits, FetchStatusError, FetchTimeout,
                                  FetchTooLong, call_with_deadline, fetch_to_file, shown_url)

DATA = bytes(range(256)) * 40            # 10,240 bytes
URL = "https://user:secret@hub.example/org/repo/resolve/abc/file.bin?token=xyz"


def _client(answer) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(answer))


def _ranged(request: httpx.Request) -> httpx.Response:
    """A faithful server: the file, or the rest of it from a `bytes=N-` range."""
    wanted = request.headers.get("range")
    if wanted:
        start = int(wanted.removeprefix("bytes=").rstrip("-"))
        return httpx.Response(206, content=DATA[start:],
                              headers={"Content-Range": f"bytes {start}-{len(DATA) - 1}/{len(DATA)}"})
    return httpx.Response(200, content=DATA)


def test_a_fetch_continues_a_kept_prefix_with_a_range_request(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    part.write_bytes(DATA[:1000])
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("range"))
        assert request.headers["accept-encoding"] == "identity"
        return _ranged(request)

    fetch_to_file(URL, part, size=len(DATA), client=_client(answer), write_chunk=512)
    assert part.read_bytes() == DATA and seen == ["bytes=1000-"]
    fetch_to_file(URL, part, size=len(DATA), client=_client(answer))       # complete: nothing asked
    assert seen == ["bytes=1000-"]


def test_a_server_that_ignores_the_range_restarts_the_file(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    part.write_bytes(b"x" * 1000)             # not even a prefix: the 200 body replaces it
    fetch_to_file(URL, part, size=len(DATA), client=_client(lambda request: httpx.Response(200, content=DATA)))
    assert part.read_bytes() == DATA


def test_a_part_longer_than_the_file_is_not_a_prefix_and_is_dropped(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    part.write_bytes(DATA + b"junk")
    fetch_to_file(URL, part, size=len(DATA), client=_client(_ranged))
    assert part.read_bytes() == DATA


def test_a_wrong_content_range_is_refused_before_writing(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    part.write_bytes(DATA[:1000])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(206, content=DATA[500:],
                              headers={"Content-Range": f"bytes 500-{len(DATA) - 1}/{len(DATA)}"})

    with pytest.raises(FetchConnectionError) as caught:
        fetch_to_file(URL, part, size=len(DATA), client=_client(answer))
    assert "from byte 1000" in caught.value.message and part.read_bytes() == DATA[:1000]


def test_a_declared_length_over_the_size_is_refused_before_the_body(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    with pytest.raises(FetchTooLong) as caught:
        fetch_to_file(URL, part, size=100, client=_client(lambda request: httpx.Response(200, content=DATA)))
    assert f"declares {len(DATA)} bytes, more than the 100" in caught.value.message
    assert part.read_bytes() == b""


def test_a_body_past_the_size_writes_exactly_the_size_then_stops(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    handed: list[int] = []

    def endless():
        while True:                       # a chunked body that never ends
            handed.append(1)
            yield DATA[:1000]

    with pytest.raises(FetchTooLong) as caught:
        fetch_to_file(URL, part, size=2500, write_chunk=1000,
                      client=_client(lambda request: httpx.Response(200, content=endless())))
    assert "sent more than the 2500 bytes" in caught.value.message
    assert part.stat().st_size == 2500 and len(handed) == 3       # read no further than the size


def test_a_body_that_ends_short_is_a_connection_error_keeping_whole_chunks(tmp_path: Path) -> None:
    part = tmp_path / "f.part"
    with pytest.raises(FetchConnectionError) as caught:
        fetch_to_file(URL, part, size=len(DATA), write_chunk=4096,
                      client=_client(lambda request: httpx.Response(200, content=DATA[:5000],
                                                                    headers={"Content-Length": "5000"})))
    assert f"after 5000 of {len(DATA)} bytes" in caught.value.message and part.read_bytes() == DATA[:5000]


def test_an_http_error_status_names_the_status_and_hides_credentials(tmp_path: Path) -> None:
    with pytest.raises(FetchStatusError) as caught:
        fetch_to_file(URL, tmp_path / "f.part", size=10, client=_client(lambda request: httpx.Response(403)))
    assert caught.value.status == 403 and "HTTP 403" in caught.value.message
    assert "secret" not in str(caught.value) and "xyz" not in str(caught.value) and "user" not in str(caught.value)
    assert shown_url(URL) == "https://hub.example/org/repo/resolve/abc/file.bin"


def test_a_part_that_is_a_fifo_or_a_link_is_never_written_through(tmp_path: Path) -> None:
    fifo = tmp_path / "f.part"
    os.mkfifo(fifo)
    with pytest.raises(FetchError) as caught:
        fetch_to_file(URL, fifo, size=10, client=_client(_ranged))
    assert "is a named pipe (FIFO), not a regular file" in caught.value.message
    link = tmp_path / "l.part"
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    link.symlink_to(target)
    with pytest.raises(OSError):
        fetch_to_file(URL, link, size=10, client=_client(_ranged))
    assert target.read_bytes() == b""


def test_a_passed_deadline_is_a_timeout_before_asking(tmp_path: Path) -> None:
    asked: list[int] = []
    with pytest.raises(FetchTimeout):
        fetch_to_file(URL, tmp_path / "f.part", size=10, deadline_at=0.0,
                      client=_client(lambda request: asked.append(1) or httpx.Response(200, content=b"0" * 10)))
    assert not asked


def test_limits_refuse_values_that_are_no_bound() -> None:
    for bad in ({"read_timeout": float("inf")}, {"connect_timeout": 0}, {"stall_window": float("nan")},
                {"stall_bytes": -1}):
        with pytest.raises(ValueError):
            FetchLimits(**bad)


def test_call_with_deadline_returns_raises_or_times_out() -> None:
    import threading
    assert call_with_deadline(lambda: 7, 5.0, "seven") == 7
    with pytest.raises(KeyError):
        call_with_deadline(lambda: {}["x"], 5.0, "a lookup")
    never = threading.Event()
    with pytest.raises(FetchTimeout) as caught:
        call_with_deadline(lambda: never.wait(600), 0.05, "a silent hub")
    assert "a silent hub did not answer within 0.05 s" in caught.value.message
    never.set()


@pytest.mark.parametrize("what", ["headers", "body"])
def test_a_server_dripping_bytes_is_cut_off_by_the_watchdog(what: str, tmp_path: Path) -> None:
    """A real socket dripping a byte every 0.05 s: each read returns, so no read timeout ever
    fires. The headers must come within stall_window; the body is held to the deadline (and the
    stall rule) between and during reads. The server gives up by itself after HOLD seconds, so code
    without the bound ends with a wrong answer rather than hanging."""
    import socket
    import threading
    import time
    HOLD = 30.0
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nX-Padding: " + b"p" * 2000 + b"\r\n\r\n"

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            if what == "body":
                connection.sendall(head)
            until = time.monotonic() + HOLD
            try:
                for index in range(len(head) if what == "headers" else 100000):
                    if stop.wait(0.05) or time.monotonic() > until:
                        return
                    connection.sendall(head[index:index + 1] if what == "headers" else b"x")
            except OSError:
                return                                  # the client cut the connection

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/file"
    limits = FetchLimits(connect_timeout=5.0, read_timeout=HOLD * 4, stall_window=1.0 if what == "headers" else 600.0,
                         stall_bytes=0, deadline=None if what == "headers" else 1.0)
    try:
        with pytest.raises(FetchTimeout) as caught:
            fetch_to_file(url, tmp_path / "f.part", size=100000, limits=limits)
    finally:
        stop.set()
        server.join(HOLD * 2)
        listener.close()
    expected = "did not send its answer (status and headers) within 1 s" if what == "headers" \
        else "did not finish by the deadline"
    assert expected in caught.value.message
