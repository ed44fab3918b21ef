"""Read and validate safetensors headers without touching tensor data.

The checks are a superset of upstream's `h3_st_read_header` (h3_safetensors.c at 8974cc0):

    upstream (h3_safetensors.c)                         here
    header length <= 256 MiB and <= file size - 8 (l.387)   same
    strict JSON, no trailing data (l.449)                   same, plus: UTF-8, no NaN/Infinity,
                                                            no duplicate names, integers only
    dtypes BOOL..F64 (h3_parse_dtype l.183), others         same; F8/F4/F6/complex and friends are
      rejected ("incomplete tensor descriptor")             named as quantized formats h3 cannot read
    rank <= 8 (h3_parse_shape l.251)                        same
    element/byte count overflow checks (l.329-336)          same (uint64 limits)
    byte count == shape * dtype size (l.339)                same
    data_end <= file size - data start (l.323)              same, reported as a truncated download
                                                            when the data section runs past the end

and, which upstream does not check (upstream issue 18: misaligned repacks render noise):
the data section starts on an 8-byte boundary, each tensor starts at a multiple of its element
size, tensors do not overlap, leave no gaps, and the file is exactly as long as the header says.

Every failure is an IntegrityError naming the file (and the tensor, when there is one).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..errors import IntegrityError
from ..runnable import command, h3bridge_command
from ..safeio.paths import format_size, open_regular, read_announced, symlink_note

# h3_safetensors.c: #define H3_ST_MAX_HEADER (256u * 1024u * 1024u)
MAX_HEADER_BYTES = 256 * 1024 * 1024
# h3_safetensors.c h3_parse_shape: "tensor rank exceeds 8"
MAX_RANK = 8
UINT64_MAX = 2**64 - 1
DATA_ALIGNMENT = 8

# h3_safetensors.c h3_parse_dtype / h3_dtype_size: the only dtypes upstream accepts.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
# Valid safetensors dtypes that upstream rejects: low-precision and packed formats of quantized
# repacks (fp8 "scaled" ComfyUI files, MXFP4/NVFP4), and complex numbers.
QUANTIZED_DTYPES = frozenset({
    "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",
    "I4", "U4",
})
OTHER_UNSUPPORTED_DTYPES = frozenset({"C64", "C128"})

GIT_LFS_POINTER_PREFIX = b"version https://git-lfs"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int           # byte offset of the first byte, relative to the data section
    end: int             # one past the last byte, relative to the data section

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ShardHeader:
    path: Path
    file_size: int
    header_size: int                      # the JSON length (the 8-byte prefix not included)
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_size

    @property
    def tensor_bytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors)

    @property
    def dtypes(self) -> frozenset[str]:
        return frozenset(tensor.dtype for tensor in self.tensors)


def _fail(path: Path, message: str, *, tensor: str | None = None, hint: str | None = None) -> IntegrityError:
    where = f"{path}: tensor {tensor!r}: " if tensor is not None else f"{path}: "
    return IntegrityError(where + message, path=path, tensor=tensor, hint=hint)


_REDOWNLOAD = (f"download this file again (the official MiniMaxAI BF16/F32 shards); "
               f"`{h3bridge_command('verify', '-d', 'DIR', '--checksums')}` confirms a good copy")


def not_a_file_error(path: Path, kind: str) -> IntegrityError:
    """The error for a weights path that is a FIFO, device, socket or directory."""
    return _fail(path, f"is {kind}{symlink_note(path)}, not a weights file: h3 would block or fail opening it",
                 hint=f"remove it (`rm {path}`) and put the real shard there, or {_REDOWNLOAD}")


def open_regular_file(path: str | Path, buffering: int = -1) -> BinaryIO:
    """Open a weights file for reading only if it is a regular file (symlinks followed, never
    waiting on a FIFO or reading a device: files.open_regular); IntegrityError naming what it is
    otherwise."""
    return open_regular(path, not_a_file_error, buffering=buffering)


def _reject_constant(name: str) -> object:
    raise ValueError(f"non-finite number {name} in JSON")


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _uint(value: object) -> int | None:
    """A JSON unsigned integer that fits uint64 (upstream h3_json_uint), else None."""
    if type(value) is not int or value < 0 or value > UINT64_MAX:
        return None
    return value


def _sniff_other_format(path: Path, prefix: bytes) -> IntegrityError | None:
    if prefix.startswith(GIT_LFS_POINTER_PREFIX[:8]):
        return _fail(path, "is a Git LFS pointer file, not the weights",
                     hint=f"run `git lfs pull` in the clone, or download with "
                          f"`{command('hf', 'download', 'MiniMaxAI/MiniMax-H3', '--local-dir', 'DIR')}`")
    if prefix.startswith(GGUF_MAGIC):
        return _fail(path, "is a GGUF file renamed to .safetensors; h3 reads only safetensors",
                     hint="use the official MiniMaxAI BF16/F32 safetensors shards")
    return None


def _parse_tensor(path: Path, name: str, entry: object) -> TensorInfo:
    if not isinstance(entry, dict):
        raise _fail(path, "descriptor is not a JSON object", tensor=name, hint=_REDOWNLOAD)
    missing = [key for key in ("dtype", "shape", "data_offsets") if key not in entry]
    if missing:
        # upstream h3_parse_tensor: "incomplete tensor descriptor"
        raise _fail(path, f"incomplete tensor descriptor (no {', '.join(missing)})", tensor=name, hint=_REDOWNLOAD)
    dtype = entry["dtype"]
    if not isinstance(dtype, str):
        raise _fail(path, "dtype is not a string", tensor=name, hint=_REDOWNLOAD)
    if dtype not in DTYPE_SIZES:
        if dtype in QUANTIZED_DTYPES:
            raise _fail(path, f"dtype {dtype} is a quantized format h3 cannot read (it needs BF16/F32)",
                        tensor=name, hint="use the official MiniMaxAI BF16 checkpoint, not a quantized repack")
        raise _fail(path, f"unknown or unsupported dtype {dtype!r} (h3 accepts {', '.join(DTYPE_SIZES)})",
                    tensor=name, hint=_REDOWNLOAD)
    shape_value = entry["shape"]
    if not isinstance(shape_value, list):
        raise _fail(path, "shape is not a JSON array", tensor=name, hint=_REDOWNLOAD)
    if len(shape_value) > MAX_RANK:
        raise _fail(path, f"tensor rank {len(shape_value)} exceeds {MAX_RANK}", tensor=name, hint=_REDOWNLOAD)
    shape: list[int] = []
    for dimension in shape_value:
        checked = _uint(dimension)
        if checked is None:
            raise _fail(path, f"shape entry {dimension!r} is not an unsigned 64-bit integer", tensor=name,
                        hint=_REDOWNLOAD)
        shape.append(checked)
    offsets = entry["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise _fail(path, "data_offsets is not a [begin, end] pair", tensor=name, hint=_REDOWNLOAD)
    begin, end = _uint(offsets[0]), _uint(offsets[1])
    if begin is None or end is None:
        raise _fail(path, "data_offsets are not unsigned 64-bit integers", tensor=name, hint=_REDOWNLOAD)
    if end < begin:
        raise _fail(path, f"data_offsets end {end} is before begin {begin}", tensor=name, hint=_REDOWNLOAD)
    elements = 1
    for dimension in shape:
        elements *= dimension
        if elements > UINT64_MAX:
            raise _fail(path, "tensor element count overflows 64 bits", tensor=name, hint=_REDOWNLOAD)
    expected = elements * DTYPE_SIZES[dtype]
    if expected > UINT64_MAX:
        raise _fail(path, "tensor byte count overflows 64 bits", tensor=name, hint=_REDOWNLOAD)
    if expected != end - begin:
        # upstream h3_validate_tensor: "tensor shape does not match byte offsets"
        raise _fail(path, f"shape {shape} of {dtype} needs {expected} bytes but data_offsets span {end - begin}",
                    tensor=name, hint=_REDOWNLOAD)
    if begin % DTYPE_SIZES[dtype]:
        raise _fail(path, f"starts at data offset {begin}, not a multiple of its {DTYPE_SIZES[dtype]}-byte element "
                          "size (a repacked file; h3 would read shifted values)", tensor=name, hint=_REDOWNLOAD)
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def read_header(path: str | Path, *, max_header_bytes: int = MAX_HEADER_BYTES) -> ShardHeader:
    """Read and validate one shard's header. Reads 8 + header-length bytes, never tensor data, and
    never a header longer than `max_header_bytes` (upstream's 256 MiB for a model shard; a caller
    that knows its files are smaller, a LoRA, states its own cap)."""
    path = Path(path)
    try:
        with open_regular_file(path) as handle:
            file_size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                other = _sniff_other_format(path, prefix)
                raise other or _fail(path, f"is {file_size} bytes, too short for a safetensors file "
                                           "(empty or interrupted download)", hint=_REDOWNLOAD)
            header_size = int.from_bytes(prefix, "little")
            if header_size > max_header_bytes or header_size > file_size - 8:
                other = _sniff_other_format(path, prefix)
                if other:
                    raise other
                if header_size > file_size - 8 and header_size <= max_header_bytes:
                    raise _fail(path, f"invalid header size {header_size}: the file has only {file_size} bytes "
                                      "(truncated download or not a safetensors file)", hint=_REDOWNLOAD)

            def too_large(path: Path, size: int, cap: int) -> IntegrityError:
                return _fail(path, f"invalid header size {size} (over the {format_size(cap)} limit): "
                                   "not a safetensors file, or its first bytes are damaged", hint=_REDOWNLOAD)
            raw = read_announced(handle, path, header_size, max_header_bytes, too_large)
    except IntegrityError:
        raise
    except OSError as error:
        raise _fail(path, f"cannot read: {error.strerror or error}",
                    hint="check the path and its permissions") from error
    if len(raw) != header_size:
        raise _fail(path, "file shrank while reading its header", hint=_REDOWNLOAD)
    try:
        text = raw.decode("utf-8")
        document = json.loads(text, object_pairs_hook=_unique_object, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise _fail(path, f"malformed safetensors JSON header ({error})", hint=_REDOWNLOAD) from None
    if not isinstance(document, dict):
        raise _fail(path, "header is not a JSON object", hint=_REDOWNLOAD)

    metadata: dict[str, str] = {}
    tensors: list[TensorInfo] = []
    for name, entry in document.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise _fail(path, "__metadata__ must map names to strings", hint=_REDOWNLOAD)
            metadata = dict(entry)  # type: ignore[arg-type]
            continue
        tensors.append(_parse_tensor(path, name, entry))

    data_start = 8 + header_size
    data_size = file_size - data_start
    if data_start % DATA_ALIGNMENT:
        # Not checked upstream; upstream issue 18 (Comfy-Org repacks, MLX-written files render noise).
        raise _fail(path, f"data section starts at byte {data_start}, not a multiple of {DATA_ALIGNMENT} "
                          "(a misaligned repack: h3 loads it but renders noise, upstream issue 18)",
                    hint="use the official MiniMaxAI shards, or re-save with the `safetensors` library")
    ordered = sorted(tensors, key=lambda t: (t.begin, t.end))
    cursor = 0
    previous: TensorInfo | None = None
    for tensor in ordered:
        if tensor.end > data_size:
            raise _fail(path, f"data ends at byte {data_start + tensor.end} but the file has {file_size} bytes: "
                              "the file is truncated (interrupted download)", tensor=tensor.name, hint=_REDOWNLOAD)
        if tensor.nbytes == 0:
            continue
        if tensor.begin < cursor and previous is not None:
            raise _fail(path, f"overlaps tensor {previous.name!r} (bytes {tensor.begin}..{tensor.end} vs "
                              f"{previous.begin}..{previous.end})", tensor=tensor.name, hint=_REDOWNLOAD)
        if tensor.begin > cursor:
            after = f"after tensor {previous.name!r}" if previous else "at the start of the data section"
            raise _fail(path, f"{tensor.begin - cursor} unindexed bytes {after} (a gap the safetensors format "
                              "forbids)", tensor=tensor.name, hint=_REDOWNLOAD)
        cursor = tensor.end
        previous = tensor
    if cursor != data_size:
        raise _fail(path, f"file has {data_size - cursor} bytes after its last tensor (header describes "
                          f"{data_start + cursor} bytes, file has {file_size})", hint=_REDOWNLOAD)
    return ShardHeader(path=path, file_size=file_size, header_size=header_size, tensors=tuple(tensors),
                       metadata=metadata)
