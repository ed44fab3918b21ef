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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

from ..errors import RequestError, shown_value
from ..request import MAX_PROMPT_BYTES
from ..safeio.outputs import publish
from ..wire.videos import (
    PEER_INLINE_FILE_FIELDS,
    LongNumber,
    UploadedFile,
    decode_data_url,
    inline_file_text,
    is_file_field,
    json_int,
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
    up to 15 s each) with room to spare.

    A JSON body is parsed whole in memory (about three times its size at the peak: the bytes, the
    text, the decoded data URLs), so it has its own, smaller cap: it is for fields and small inline
    images; files go as multipart parts, which stream to disk."""

    max_file_bytes: int = 256 * MiB     # one file
    max_files: int = 16                 # file parts (12 references + anchors, with room)
    max_body_bytes: int = 1024 * MiB    # the whole body
    max_json_bytes: int = 32 * MiB      # a whole JSON body (its inline files included)
    max_field_bytes: int = 256 * 1024   # one text field: the longest prompt h3 takes (MAX_PROMPT_BYTES), with room
    max_fields: int = 64                # text fields (a repeated field's items each count)

    def too_large(self, what: str, limit: int, field_name: str | None, *, fix: str | None = None) -> RequestError:
        return RequestError(f"{what} is over this server's limit of {_size(limit)}", field=field_name,
                            hint=fix or "send smaller files (or ask the server's owner to raise --max-upload-mb)")

    def field_too_large(self, name: str) -> RequestError:
        return self.too_large(f"the field {name!r}", self.max_field_bytes, name,
                              fix=f"shorten it (a prompt takes at most {MAX_PROMPT_BYTES:,} bytes)")

    def too_many_fields(self) -> RequestError:
        return RequestError(f"more than {self.max_fields} form fields (a list's items each count)", field=None,
                            hint=f"send at most {self.max_fields} fields")


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
        self._file.close()
        self._file = None
        # fsynced and renamed into place by the one output writer (only ever over a regular file)
        publish(self._temporary, self._final, overwrite=True, field=self._field)
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


def store_bytes(inputs: Path, limits: UploadLimits, stored: list[UploadedFile], field_name: str, data: bytes,
                filename: str | None) -> UploadedFile:
    """Store one more file of a body (a peer's data URL, dialects.py) beside the uploads already
    `stored`, under the same rules: numbered after them, atomic, within the file size and count."""
    writer = _UploadWriter(inputs, limits)
    writer.uploads = list(stored)
    try:
        writer.add_bytes(field_name, data, filename)
    finally:
        writer.abort()
    return writer.uploads[-1]


async def receive_body(content_type: str, content_length: str | None, stream: AsyncIterator[bytes],
                       inputs: Path, limits: UploadLimits) -> ReceivedBody:
    """Read the whole body into (pairs, uploads); RequestError when it is malformed or over a
    limit (the caller removes `inputs` then)."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    is_json = media_type in ("application/json", "")
    body_limit = limits.max_json_bytes if is_json else limits.max_body_bytes
    declared = content_length.strip() if content_length is not None else ""
    if declared.isdigit() and (len(declared) > 18 or int(declared) > body_limit):
        shown = _size(int(declared)) if len(declared) <= 18 else f"{len(declared)} digits of bytes"
        raise _body_too_large(limits, is_json, f"the request body ({shown})")
    writer = _UploadWriter(inputs, limits)
    try:
        if media_type == "multipart/form-data":
            return await _receive_multipart(content_type, stream, writer, limits)
        if is_json:
            return await _receive_json(stream, writer, limits)
        raise RequestError(f"a body of type {media_type!r} cannot be read; send JSON or multipart/form-data",
                           field=None, hint="send Content-Type: application/json or multipart/form-data")
    finally:
        writer.abort()


def _body_too_large(limits: UploadLimits, is_json: bool, what: str) -> RequestError:
    if is_json:
        return limits.too_large(f"{what}, as JSON,", limits.max_json_bytes, None,
                                fix="send files as multipart/form-data parts (the openai client does), not as "
                                    "data URLs in JSON")
    return limits.too_large(what, limits.max_body_bytes, None)


async def _read_json_bytes(stream: AsyncIterator[bytes], limits: UploadLimits) -> bytearray:
    raw = bytearray()       # one growing buffer: no list of chunks joined into a second copy
    async for chunk in stream:
        if len(raw) + len(chunk) > limits.max_json_bytes:
            raise _body_too_large(limits, True, "the request body")
        raw += chunk
    return raw


def parse_json_body(raw: bytes | bytearray) -> object:
    """The JSON value of a body; RequestError for anything json.loads refuses, however it refuses
    it (a JSONDecodeError, RecursionError for arrays nested thousands deep). Integer literals
    past Python's digit limit stay text (wire.LongNumber), refused later naming their field."""
    try:
        return json.loads(raw or b"{}", parse_int=json_int)
    except RecursionError:
        field = _too_deep_field(raw)
        where = f"the field {field!r}" if field is not None else "the JSON body"
        raise RequestError(f"{where} is nested too deeply to read (lists or objects inside one another "
                           f"hundreds of levels deep)", field=field,
                           hint='send a flat JSON object, e.g. {"prompt": "...", "seed": 1}') from None
    except (UnicodeDecodeError, ValueError) as error:      # json.JSONDecodeError is a ValueError
        raise RequestError(f"the body is not valid JSON ({shown_value(str(error), limit=200)})", field=None,
                           hint="send a JSON object, e.g. {\"prompt\": \"...\"}") from None


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _too_deep_field(raw: bytes | bytearray) -> str | None:
    """Which top-level member of a JSON object json.loads could not read for its nesting: the
    object's members are walked here and each value read by json's own raw_decode (only on this
    rare path, to name the field)."""
    try:
        text = bytes(raw).decode(json.detect_encoding(raw))
    except (UnicodeDecodeError, LookupError):
        return None
    decoder = json.JSONDecoder(parse_int=json_int)
    at = _JSON_SPACE.match(text).end()
    if text[at:at + 1] != "{":
        return None
    at = _JSON_SPACE.match(text, at + 1).end()
    while True:
        try:
            key, at = decoder.raw_decode(text, at)
            at = _JSON_SPACE.match(text, at).end()
            if not isinstance(key, str) or text[at:at + 1] != ":":
                return None
            _, at = decoder.raw_decode(text, _JSON_SPACE.match(text, at + 1).end())
        except RecursionError:
            return normalise_name(key)[0]
        except ValueError:
            return None
        at = _JSON_SPACE.match(text, at).end()
        if text[at:at + 1] != ",":
            return None
        at = _JSON_SPACE.match(text, at + 1).end()


async def _receive_json(stream: AsyncIterator[bytes], writer: _UploadWriter, limits: UploadLimits) -> ReceivedBody:
    raw = await _read_json_bytes(stream, limits)
    body = parse_json_body(raw)
    del raw
    received = ReceivedBody()
    pairs = pairs_from_json(body)
    if len(pairs) > limits.max_fields + limits.max_files:
        raise limits.too_many_fields()
    for name, value in pairs:
        _add_value(received, writer, name, value)
    if len(received.pairs) > limits.max_fields:
        raise limits.too_many_fields()
    for name, value in received.pairs:
        # The multipart parser stops a text field at max_field_bytes; a JSON field is held to the same.
        size = len(value.text) if isinstance(value, LongNumber) else len(value) if isinstance(value, str) else 0
        if size > limits.max_field_bytes:
            raise limits.field_too_large(normalise_name(name)[0])
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
                raise limits.too_many_fields()
            state["text"] = bytearray()

    def part_data(data: bytes, start: int, end: int) -> None:
        text = state["text"]
        if text is None:
            writer.write(data[start:end])
            return
        text += data[start:end]  # type: ignore[operator]
        # A peer's JSON-text file field (a data URL) is held to the JSON body's cap, not a text field's.
        cap = limits.max_json_bytes if normalise_name(str(state["name"]))[0] in PEER_INLINE_FILE_FIELDS \
            else limits.max_field_bytes
        if len(text) > cap:  # type: ignore[arg-type]
            raise limits.field_too_large(str(state["name"]))

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
            raise _body_too_large(limits, False, "the request body")
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
