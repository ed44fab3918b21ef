"""A client that drops mid-body (issue 29 item 1: 35 `ClientDisconnect` tracebacks in a server's log):
the server notes it in one quiet line, logs no traceback, raises nothing out of the app and leaves
nothing of the body on disk. The ASGI app is called directly with a `receive` that gives part of the
body and then `http.disconnect`, as uvicorn does when the connection closes: no timing involved."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from h3bridge.server.app import ServeSettings, create_app
from h3bridge.server.jobs import JobStore
from h3bridge.server.worker import Worker

BOUNDARY = "h3bridgeboundary"


def _scope(content_type: str, length: int) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/videos", "raw_path": b"/v1/videos", "query_string": b"", "root_path": "",
            "headers": [(b"content-type", content_type.encode()), (b"content-length", str(length).encode())],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8765)}


def _drop_after(first: bytes):
    messages = [{"type": "http.request", "body": first, "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}
    return receive


MULTIPART_START = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na fox\r\n"
                   f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"input_reference\"; filename=\"a.png\"\r\n"
                   f"Content-Type: image/png\r\n\r\n").encode() + b"\x89PNG" + b"\0" * 4096


@pytest.mark.parametrize(("content_type", "first"), [
    (f"multipart/form-data; boundary={BOUNDARY}", MULTIPART_START),
    ("application/json", b'{"prompt": "a fox", "seed": 1'),
], ids=["multipart mid-file", "json"])
def test_a_client_dropping_mid_body_is_noted_quietly_and_leaves_nothing(tmp_path: Path, caplog, content_type: str,
                                                                        first: bytes) -> None:
    store = JobStore(tmp_path / "data")
    app = create_app(ServeSettings(data_dir=tmp_path / "data"), store, Worker(store, engine=None))  # type: ignore[arg-type]
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def post() -> None:
        await app(_scope(content_type, len(first) * 100), _drop_after(first), send)

    with caplog.at_level(logging.DEBUG):
        asyncio.run(post())          # the old code raised ClientDisconnect out of the app (a traceback)
    store.close()
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.WARNING], \
        [(record.levelname, record.getMessage()) for record in caplog.records]
    assert any("went away" in record.getMessage() for record in caplog.records)
    leftovers = [path for path in (tmp_path / "data").rglob("*") if path.is_file() and "upload" in path.name
                 or path.name.endswith(".partial")]
    assert leftovers == []
    assert store_jobs(tmp_path / "data") == []


def store_jobs(data_dir: Path) -> list:
    store = JobStore(data_dir)
    try:
        return store.list(after=None, limit=100, newest_first=True)[0]
    finally:
        store.close()
