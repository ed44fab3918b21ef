"""Safetensors header reading exactly as strict (and as lax) as upstream h3_safetensors.c.

This is deliberately NOT h3bridge's own safetensors reader (h3bridge/safetensors.py,
which checks more, e.g. data alignment): the simulator must accept what h3 accepts and
reject what h3 rejects, with h3's error texts, so a test against h3-sim says something
true about the real engine.

Mirrored (h3_safetensors.c at 8974cc0):
- `read_header` = `h3_st_read_header` (:367-460): 8-byte LE length, <= 256 MiB and <= file
  size - 8; a small hand-written JSON parser (strings with escapes and \\uXXXX, unsigned
  integers only, scalars skipped up to a delimiter, so `true`/`null`/garbage pass as
  `__metadata__` values); dtypes BOOL..F64 (anything else => "incomplete tensor
  descriptor"); rank <= 8; offsets within the data section; byte count = elements * size.
  Not checked, as upstream: alignment, overlaps, gaps, duplicate names.
- `inventory_dir` = `h3_st_inventory_dir` (:542-584): readdir order, skips names starting
  with '.', requires the `.safetensors` suffix, stops at the first bad header.
- `weight_store_paths` = `h3_weight_store_open` (h3_weights.c:41-114): does NOT skip
  dotfiles (so an AppleDouble `._x.safetensors` passes `--info` but fails when a stage
  opens its weights), needs a name longer than the suffix, sorts paths with strcmp.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from .libc import strerror

MAX_HEADER = 256 * 1024 * 1024        # H3_ST_MAX_HEADER, h3_safetensors.c:13
DETAIL_LIMIT = 383                    # char detail[384] in h3.c h3_inventory / h3_weights.c

DTYPE_SIZES = {                        # h3_parse_dtype / h3_dtype_size, :183-218
    "BOOL": 1, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
_UINT64_MAX = (1 << 64) - 1
_WHITESPACE = b" \n\r\t"
_SPECIAL = re.compile(rb"[\x00-\x1f\\]")


class HeaderError(Exception):
    """h3's error text for one header (already prefixed with the path where h3 does)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data_begin: int
    data_end: int


@dataclass(frozen=True)
class Header:
    path: str
    file_size: int
    header_size: int
    tensors: tuple[TensorEntry, ...]


@dataclass(frozen=True)
class ComponentInfo:
    """h3_component_info (h3.h:148-153)."""

    bytes: int = 0
    tensor_bytes: int = 0
    files: int = 0
    tensors: int = 0


class _Cursor:
    """h3_json_cursor: every failure message is upstream's, without the path."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        self.end = len(data)

    def fail(self, message: str) -> HeaderError:
        return HeaderError(message)

    def peek(self) -> int | None:
        return self.data[self.at] if self.at < self.end else None

    def ws(self) -> None:
        while self.at < self.end and self.data[self.at] in _WHITESPACE:
            self.at += 1

    def take(self, expected: str) -> None:
        self.ws()
        if self.at >= self.end or self.data[self.at] != ord(expected):
            raise self.fail("malformed safetensors JSON header")
        self.at += 1

    def string(self) -> str:
        self.ws()
        if self.at >= self.end or self.data[self.at] != ord('"'):
            raise self.fail("expected JSON string")
        self.at += 1
        # Fast path for the common case (no escapes, no control bytes); same result.
        close = self.data.find(b'"', self.at)
        if close >= 0 and _SPECIAL.search(self.data, self.at, close) is None:
            text = self.data[self.at:close]
            self.at = close + 1
            return text.decode("utf-8", errors="surrogateescape")
        out = bytearray()
        malformed = self.fail("malformed JSON string escape")
        while self.at < self.end and self.data[self.at] != ord('"'):
            value = self.data[self.at]
            self.at += 1
            if value == ord("\\"):
                if self.at >= self.end:
                    raise malformed
                value = self.data[self.at]
                self.at += 1
                simple = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b",
                          ord("f"): b"\f", ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}
                if value in simple:
                    out += simple[value]
                elif value == ord("u"):
                    digits = self.data[self.at:self.at + 4]
                    if len(digits) < 4:
                        raise malformed
                    try:
                        if not all(chr(d) in "0123456789abcdefABCDEF" for d in digits):
                            raise ValueError
                        code = int(digits.decode("ascii"), 16)
                    except ValueError:
                        raise malformed from None
                    self.at += 4
                    # Upstream encodes each \\u unit on its own (surrogates become 3 bytes).
                    if code < 0x80:
                        out.append(code)
                    elif code < 0x800:
                        out += bytes([0xC0 | (code >> 6), 0x80 | (code & 0x3F)])
                    else:
                        out += bytes([0xE0 | (code >> 12), 0x80 | ((code >> 6) & 0x3F),
                                      0x80 | (code & 0x3F)])
                else:
                    raise malformed
            else:
                if value < 0x20:
                    raise malformed
                out.append(value)
        if self.at >= self.end:
            raise malformed
        self.at += 1
        return out.decode("utf-8", errors="surrogateescape")

    def uint(self) -> int:
        self.ws()
        if self.at >= self.end or not (0x30 <= self.data[self.at] <= 0x39):
            raise self.fail("expected unsigned JSON integer")
        value = 0
        while self.at < self.end and 0x30 <= self.data[self.at] <= 0x39:
            digit = self.data[self.at] - 0x30
            if value > (_UINT64_MAX - digit) // 10:
                raise self.fail("integer overflow in safetensors header")
            value = value * 10 + digit
            self.at += 1
        return value

    def skip(self) -> None:
        self.ws()
        if self.at >= self.end:
            raise self.fail("missing JSON value")
        first = self.data[self.at]
        if first == ord('"'):
            self.string()
            return
        if first in (ord("{"), ord("[")):
            self.skip_compound(chr(first), "}" if first == ord("{") else "]")
            return
        start = self.at
        while self.at < self.end and self.data[self.at] not in b",}] \n\r\t":
            self.at += 1
        if self.at == start:
            raise self.fail("invalid JSON scalar")

    def skip_compound(self, open_char: str, close_char: str) -> None:
        self.take(open_char)
        self.ws()
        if self.peek() == ord(close_char):
            self.at += 1
            return
        while True:
            if open_char == "{":
                self.string()
                self.take(":")
            self.skip()
            self.ws()
            if self.at >= self.end:
                raise self.fail("unterminated JSON value")
            if self.data[self.at] == ord(close_char):
                self.at += 1
                return
            self.at += 1
            if self.data[self.at - 1] != ord(","):
                raise self.fail("expected JSON comma")


def _parse_tensor(cursor: _Cursor, name: str) -> TensorEntry:
    """h3_parse_tensor (:274-319)."""
    cursor.take("{")
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    offsets: tuple[int, int] | None = None
    while True:
        cursor.ws()
        if cursor.peek() == ord("}"):
            cursor.at += 1
            break
        key = cursor.string()
        cursor.take(":")
        if key == "dtype":
            value = cursor.string()
            dtype = value if value in DTYPE_SIZES else None
        elif key == "shape":
            shape = _parse_shape(cursor)
        elif key == "data_offsets":
            cursor.take("[")
            begin = cursor.uint()
            cursor.take(",")
            end = cursor.uint()
            cursor.take("]")
            offsets = (begin, end)
        else:
            cursor.skip()
        cursor.ws()
        if cursor.at >= cursor.end:
            raise cursor.fail("unterminated tensor entry")
        if cursor.data[cursor.at] == ord("}"):
            continue
        cursor.at += 1
        if cursor.data[cursor.at - 1] != ord(","):
            raise cursor.fail("expected tensor comma")
    if dtype is None or shape is None or offsets is None:
        raise cursor.fail("incomplete tensor descriptor")
    return TensorEntry(name, dtype, shape, offsets[0], offsets[1])


def _parse_shape(cursor: _Cursor) -> tuple[int, ...]:
    """h3_parse_shape (:240-263)."""
    cursor.take("[")
    cursor.ws()
    if cursor.peek() == ord("]"):
        cursor.at += 1
        return ()
    dims: list[int] = []
    while True:
        if len(dims) >= 8:
            raise cursor.fail("tensor rank exceeds 8")
        dims.append(cursor.uint())
        cursor.ws()
        if cursor.at >= cursor.end:
            raise cursor.fail("unterminated shape")
        cursor.at += 1
        if cursor.data[cursor.at - 1] == ord("]"):
            return tuple(dims)
        if cursor.data[cursor.at - 1] != ord(","):
            raise cursor.fail("expected shape comma")


def _validate(cursor: _Cursor, tensor: TensorEntry, data_start: int, file_size: int) -> None:
    """h3_validate_tensor (:321-344)."""
    if tensor.data_end < tensor.data_begin or tensor.data_end > file_size - data_start:
        raise cursor.fail("tensor data offsets exceed file")
    elements = 1
    for dim in tensor.shape:
        if dim and elements > _UINT64_MAX // dim:
            raise cursor.fail("tensor element count overflow")
        elements *= dim
    item = DTYPE_SIZES[tensor.dtype]
    if elements > _UINT64_MAX // item:
        raise cursor.fail("tensor byte count overflow")
    if elements * item != tensor.data_end - tensor.data_begin:
        raise cursor.fail("tensor shape does not match byte offsets")


def read_header(path: str) -> Header:
    """h3_st_read_header. Raises HeaderError with upstream's text."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError as error:
        raise HeaderError(f"{path}: {strerror(error.errno or 0)}") from None
    try:
        try:
            size = os.fstat(descriptor).st_size
            prefix = os.pread(descriptor, 8, 0) if size >= 8 else b""
        except OSError:
            prefix = b""
            size = 0
        if size < 8 or len(prefix) != 8:
            raise HeaderError(f"{path}: invalid file")
        header_size = int.from_bytes(prefix, "little")
        if header_size > MAX_HEADER or header_size > size - 8:
            raise HeaderError(f"{path}: invalid header size")
        try:
            data = os.pread(descriptor, header_size, 8)
        except OSError:
            data = b""
        if len(data) != header_size:
            raise HeaderError(f"{path}: cannot read header")
    finally:
        os.close(descriptor)
    return _parse_header(path, size, header_size, data)


# Every file is still opened and read as upstream reads it (so every I/O error is the same); only
# the parse of identical header bytes is not repeated. A job reads each shard's header twice
# (h3_st_inventory_dir, then h3_weight_store_open), and parsing was a third of a small job's time.
# The result is immutable (a frozen Header of tuples); a parse that fails is not kept.
@functools.lru_cache(maxsize=256)
def _parse_header(path: str, size: int, header_size: int, data: bytes) -> Header:
    cursor = _Cursor(data)
    tensors: list[TensorEntry] = []
    cursor.take("{")
    cursor.ws()
    if cursor.peek() == ord("}"):
        cursor.at += 1
    else:
        while True:
            name = cursor.string()
            cursor.take(":")
            if name == "__metadata__":
                cursor.skip()
            else:
                tensor = _parse_tensor(cursor, name)
                _validate(cursor, tensor, 8 + header_size, size)
                tensors.append(tensor)
            cursor.ws()
            if cursor.at >= cursor.end:
                raise cursor.fail("unterminated safetensors object")
            cursor.at += 1
            if cursor.data[cursor.at - 1] == ord("}"):
                break
            if cursor.data[cursor.at - 1] != ord(","):
                raise cursor.fail("expected top-level comma")
    cursor.ws()
    if cursor.at != cursor.end:
        raise cursor.fail("trailing data in safetensors header")
    return Header(path, size, header_size, tuple(tensors))


def _clip(message: str) -> str:
    """The detail buffers are char[384]: snprintf keeps 383 bytes."""
    raw = message.encode("utf-8", errors="surrogateescape")
    return raw[:DETAIL_LIMIT].decode("utf-8", errors="ignore") if len(raw) > DETAIL_LIMIT else message


def inventory_dir(directory: str) -> ComponentInfo:
    """h3_st_inventory_dir. Raises HeaderError with upstream's (clipped) text."""
    try:
        names = [entry.name for entry in os.scandir(directory)]
    except OSError as error:
        raise HeaderError(_clip(f"{directory}: {strerror(error.errno or 0)}")) from None
    info = ComponentInfo()
    for name in names:
        if name.startswith(".") or not name.endswith(".safetensors"):
            continue
        try:
            header = read_header(f"{directory}/{name}")
        except HeaderError as error:
            raise HeaderError(_clip(str(error))) from None
        info = ComponentInfo(
            bytes=info.bytes + header.file_size,
            tensor_bytes=info.tensor_bytes + sum(t.data_end - t.data_begin for t in header.tensors),
            files=info.files + 1,
            tensors=info.tensors + len(header.tensors))
    if not info.files:
        raise HeaderError(_clip(f"{directory}: no safetensors files"))
    return info


def weight_store_paths(directory: str) -> list[str]:
    """h3_weight_store_open: list, sort and read every shard header (dotfiles included).

    Returns the sorted shard paths; raises HeaderError with upstream's text.
    """
    try:
        names = [entry.name for entry in os.scandir(directory)]
    except OSError:
        raise HeaderError(f"cannot open weight directory: {directory}") from None
    suffix = ".safetensors"
    paths = sorted((f"{directory}/{name}" for name in names
                    if len(name) > len(suffix) and name.endswith(suffix)),
                   key=lambda p: p.encode("utf-8", errors="surrogateescape"))
    if not paths:
        raise HeaderError(f"no safetensors shards in {directory}")
    for path in paths:
        try:
            read_header(path)
        except HeaderError as error:
            raise HeaderError(_clip(str(error))) from None
    return paths
