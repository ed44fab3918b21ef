"""Receiving a `POST /v1/videos` body: JSON or multipart, streamed straight into the job's inputs
folder inside the server's data directory, within the server's size and count limits.

Nothing of the client's is used as a path: an upload is stored as `<n>.upload` (its position
in the form), plus a suffix only when the client's name ends in a known media suffix (FFmpeg
reads some formats by it). Each file is written under a temporary name, synced and renamed, so
an upload is either all there or not there at all. Starlette's own form parser would spool big
parts to the system's temporary folder; this one writes nowhere but the job's folder and stops
reading the moment a limit is passed.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

from ..errors import RequestError
from .wire import (
    UploadedFile,
    decode_data_url,
    inline_file_text,
    is_file_field,
    normalise_name,
    pairs_from_json,
)

MiB = 1024 * 1024
MEDIA_SUFFIXES = frozenset({
    ".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif", ".mp4", ".mov", ".m4v", ".mkv",
    ".webm", ".avi", ".wav", ".mp3", ".m4a", ".aac", ".flac", ".ogg", ".opus"})


@dataclass(frozen=True)
class UploadLimits:
    """What one request may send. The defaults fit h3's largest legal request (12 references of
    up to 15 s each) with room to spare."""

    max_file_bytes: int = 256 * MiB     # one file
    max_files: int = 16                 # file parts (12 references + anchors, with room)
    max_body_bytes: int = 1024 * MiB    # the whole body
    max_field_bytes: int = 64 * 1024    # one text field (the prompt)
    max_fields: int = 64                # text fields

    def too_large(self, what: str, limit: int, field_name: str | None) -> RequestError:
        return RequestError(f"{what} is over this server's limit of {_size(limit)}", field=field_name,
                            hint="send smaller files (or ask the server's owner to raise --max-upload-mb)")


def _size(count: int) -> str:
    return f"{count / MiB:g} MiB" if count >= MiB else f"{count} bytes"


@dataclass
class ReceivedBody:
    pairs: list[tuple[str, object]] = field(default_factory=list)
    uploads: list[UploadedFile] = field(default_factory=list)


def stored_name(index: int, filename: str | None) -> str:
    suffix = Path(filename or "").suffix.lower()
    return f"{index:02d}.upload" + (suffix if suffix in MEDIA_SUFFIXES else "")


class _UploadWriter:
    """Writes the body's files into `inputs`, one at a time, atomically."""

    def __init__(self, inputs: Path, limits: UploadLimits) -> None:
        self.inputs = inputs
        self.limits = limits
        self.uploads: list[UploadedFile] = []
        self._file = None
        self._temporary: Path | None = None
        self._final: Path | None = None
        self._field = ""
        self._filename: str | None = None
        self._written = 0

    def begin(self, field_name: str, filename: str | None) -> None:
        if len(self.uploads) >= self.limits.max_files:
            raise RequestError(f"more than {self.limits.max_files} files uploaded; this server takes at most "
                               f"{self.limits.max_files} per request", field=field_name,
                               hint=f"send at most {self.limits.max_files} files")
        self.inputs.mkdir(parents=True, exist_ok=True)
        index = len(self.uploads)
        self._final = self.inputs / stored_name(index, filename)
        self._temporary = self.inputs / f".{index:02d}.partial"
        self._file = open(self._temporary, "wb")
        self._field, self._filename, self._written = field_name, filename, 0

    def write(self, data: bytes) -> None:
        assert self._file is not None
        self._written += len(data)
        if self._written > self.limits.max_file_bytes:
            shown = f" ({self._filename!r})" if self._filename else ""
            raise self.limits.too_large(f"the {self._field} upload{shown}", self.limits.max_file_bytes, self._field)
        self._file.write(data)

    def end(self) -> None:
        assert self._file is not None and self._temporary is not None and self._final is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self._temporary, self._final)
        self.uploads.append(UploadedFile(self._field, self._final, self._filename))

    def add_bytes(self, field_name: str, data: bytes, filename: str | None) -> None:
        self.begin(field_name, filename)
        self.write(data)
        self.end()

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._temporary is not None:
            self._temporary.unlink(missing_ok=True)


async def receive_body(content_type: str, content_length: str | None, stream: AsyncIterator[bytes],
                       inputs: Path, limits: UploadLimits) -> ReceivedBody:
    """Read the whole body into (pairs, uploads); RequestError when it is malformed or over a
    limit (the caller removes `inputs` then)."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limits.max_body_bytes:
        raise limits.too_large(f"the request body ({_size(int(content_length))})", limits.max_body_bytes, None)
    media_type = content_type.split(";", 1)[0].strip().lower()
    writer = _UploadWriter(inputs, limits)
    try:
        if media_type == "multipart/form-data":
            return await _receive_multipart(content_type, stream, writer, limits)
        if media_type in ("application/json", ""):
            return await _receive_json(stream, writer, limits)
        raise RequestError(f"a body of type {media_type!r} cannot be read; send JSON or multipart/form-data",
                           field=None, hint="send Content-Type: application/json or multipart/form-data")
    finally:
        writer.abort()


async def _read_all(stream: AsyncIterator[bytes], limits: UploadLimits) -> bytes:
    chunks, total = [], 0
    async for chunk in stream:
        total += len(chunk)
        if total > limits.max_body_bytes:
            raise limits.too_large("the request body", limits.max_body_bytes, None)
        chunks.append(chunk)
    return b"".join(chunks)


async def _receive_json(stream: AsyncIterator[bytes], writer: _UploadWriter, limits: UploadLimits) -> ReceivedBody:
    raw = await _read_all(stream, limits)
    try:
        body = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(f"the body is not valid JSON ({error})", field=None,
                           hint="send a JSON object, e.g. {\"prompt\": \"...\"}") from None
    received = ReceivedBody()
    for name, value in pairs_from_json(body):
        _add_value(received, writer, name, value)
    received.uploads = writer.uploads
    return received


def _add_value(received: ReceivedBody, writer: _UploadWriter, name: str, value: object) -> None:
    inline = inline_file_text(name, value)
    if inline is not None:
        writer.add_bytes(normalise_name(name)[0], decode_data_url(normalise_name(name)[0], inline), None)
    else:
        received.pairs.append((name, value))


async def _receive_multipart(content_type: str, stream: AsyncIterator[bytes], writer: _UploadWriter,
                             limits: UploadLimits) -> ReceivedBody:
    from python_multipart.multipart import MultipartParser, parse_options_header

    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise RequestError("the multipart body has no boundary", field=None,
                           hint="let the HTTP library build the multipart body")
    received = ReceivedBody()
    state: dict[str, object] = {"headers": {}, "header": b"", "value": b"", "text": None, "name": None}
    problems: list[RequestError] = []
    text_fields = [0]

    def header_field(data: bytes, start: int, end: int) -> None:
        state["header"] = state["header"] + data[start:end]  # type: ignore[operator]

    def header_value(data: bytes, start: int, end: int) -> None:
        state["value"] = state["value"] + data[start:end]  # type: ignore[operator]

    def header_end() -> None:
        state["headers"][state["header"].lower()] = state["value"]  # type: ignore[index, union-attr]
        state["header"], state["value"] = b"", b""

    def headers_finished() -> None:
        disposition = state["headers"].get(b"content-disposition", b"")  # type: ignore[union-attr]
        _, params = parse_options_header(disposition)
        name = params.get(b"name", b"").decode("utf-8", "replace")
        filename = params.get(b"filename")
        state["name"] = name
        if not name:
            raise RequestError("a multipart part has no field name", field=None,
                               hint="name every part (Content-Disposition: form-data; name=...)")
        if filename is not None:
            if not is_file_field(name):
                raise RequestError(f"{name!r} was sent as a file; it is a text field", field=name,
                                   hint=f"send {name} as a plain form field")
            writer.begin(normalise_name(name)[0], filename.decode("utf-8", "replace"))
            state["text"] = None
        else:
            text_fields[0] += 1
            if text_fields[0] > limits.max_fields:
                raise RequestError(f"more than {limits.max_fields} form fields", field=None,
                                   hint="send fewer fields")
            state["text"] = bytearray()

    def part_data(data: bytes, start: int, end: int) -> None:
        text = state["text"]
        if text is None:
            writer.write(data[start:end])
            return
        text += data[start:end]  # type: ignore[operator]
        if len(text) > limits.max_field_bytes:  # type: ignore[arg-type]
            raise limits.too_large(f"the field {state['name']!r}", limits.max_field_bytes, str(state["name"]))

    def part_end() -> None:
        text = state["text"]
        if text is None:
            writer.end()
        else:
            try:
                value = bytes(text).decode("utf-8")  # type: ignore[arg-type]
            except UnicodeDecodeError:
                raise RequestError(f"the field {state['name']!r} is not UTF-8 text", field=str(state["name"]),
                                   hint="send form fields as UTF-8") from None
            _add_value(received, writer, str(state["name"]), value)
        state["headers"], state["text"] = {}, None

    def guarded(callback):
        def call(*args):
            if problems:
                return
            try:
                callback(*args)
            except RequestError as error:
                problems.append(error)
        return call

    parser = MultipartParser(boundary, {
        "on_header_field": guarded(header_field), "on_header_value": guarded(header_value),
        "on_header_end": guarded(header_end), "on_headers_finished": guarded(headers_finished),
        "on_part_data": guarded(part_data), "on_part_end": guarded(part_end)})
    total = 0
    async for chunk in stream:
        total += len(chunk)
        if total > limits.max_body_bytes:
            raise limits.too_large("the request body", limits.max_body_bytes, None)
        try:
            parser.write(chunk)
        except Exception as error:     # python-multipart raises its own errors for broken bodies
            raise RequestError(f"the multipart body is malformed ({error})", field=None,
                               hint="let the HTTP library build the multipart body") from None
        if problems:
            raise problems[0]
    parser.finalize()
    if problems:
        raise problems[0]
    received.uploads = writer.uploads
    return received
