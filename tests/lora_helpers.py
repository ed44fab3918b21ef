"""LoRA files the tests make, and the independent float64 reference a fold must equal.

The reference never calls h3bridge's rounding: bf16 values are decoded with `struct`, and a
float64 result is rounded to bf16 by searching the sorted table of every finite bf16 value for
its two neighbours (nearest wins, a tie goes to the even bit pattern).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from h3bridge.model.safetensors import DTYPE_SIZES, read_header

_STRUCT_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "F64": ("<f8", 8)}


def write_lora(path: Path, tensors: dict[str, np.ndarray], *, dtype: str = "F32",
               dtypes: dict[str, str] | None = None, metadata: dict[str, str] | None = None) -> Path:
    """A safetensors file as the `safetensors` library lays one out (8-aligned header, data in order)."""
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        kind = (dtypes or {}).get(name, dtype)
        if kind == "BF16":
            blob = (np.asarray(array, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        elif kind in _STRUCT_DTYPES:
            blob = np.asarray(array).astype(_STRUCT_DTYPES[kind][0]).tobytes()
        else:                              # a dtype the fold must refuse: bytes of the right size
            blob = bytes(int(np.prod(np.shape(array), dtype=np.int64)) * DTYPE_SIZES.get(kind, 1))
        header[name] = {"dtype": kind, "shape": list(np.shape(array)), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return path


def read_tensor_bytes(path: Path, name: str) -> bytes:
    header = read_header(path)
    tensor = next(t for t in header.tensors if t.name == name)
    with open(path, "rb") as handle:
        handle.seek(header.data_start + tensor.begin)
        return handle.read(tensor.nbytes)


def raw_header(path: Path) -> bytes:
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        handle.seek(0)
        return handle.read(8 + size)


def decode(raw: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """float64 values of BF16/F32 bytes, by `struct` (not h3bridge's decoder)."""
    if dtype == "BF16":
        count = len(raw) // 2
        values = [struct.unpack("<f", b"\0\0" + raw[2 * i:2 * i + 2])[0] for i in range(count)]
    else:
        values = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return np.array(values, dtype=np.float64).reshape(shape)


_TABLE_BITS = np.arange(0x0000, 0x7F80, dtype=np.uint32)      # every finite non-negative bf16
_TABLE = np.array([struct.unpack("<f", struct.pack("<I", int(b) << 16))[0] for b in _TABLE_BITS], dtype=np.float64)
_MAX = _TABLE[-1]
_OVERFLOW = _MAX + (2.0 ** 127 * 2.0 ** -8)                    # bf16 max + half its spacing: rounds to inf


def reference_bf16(values: np.ndarray) -> np.ndarray:
    """float64 -> bf16 bits by nearest-neighbour search with ties to even (finite inputs and inf)."""
    values = np.asarray(values, dtype=np.float64)
    magnitude = np.abs(values).reshape(-1)
    upper = np.clip(np.searchsorted(_TABLE, magnitude, side="left"), 1, len(_TABLE) - 1)
    lower = upper - 1
    below, above = _TABLE[lower], _TABLE[upper]
    pick_upper = (above - magnitude < magnitude - below) | (
        (above - magnitude == magnitude - below) & (_TABLE_BITS[upper] % 2 == 0))
    exact = _TABLE[np.clip(np.searchsorted(_TABLE, magnitude), 0, len(_TABLE) - 1)] == magnitude
    bits = np.where(exact, _TABLE_BITS[np.clip(np.searchsorted(_TABLE, magnitude), 0, len(_TABLE) - 1)],
                    np.where(pick_upper, _TABLE_BITS[upper], _TABLE_BITS[lower]))
    bits = np.where(magnitude > _MAX, np.where(magnitude >= _OVERFLOW, 0x7F80, 0x7F7F), bits)
    sign = np.signbit(values.reshape(-1)).astype(np.uint32) << 15
    return (bits | sign).astype(np.uint16).reshape(values.shape)


def reference_fold(weight_raw: bytes, dtype: str, shape: tuple[int, ...],
                   updates: list[tuple[np.ndarray, np.ndarray, float]]) -> bytes:
    """W + sum(factor * up @ down) in float64, then rounded once to the tensor's dtype."""
    value = decode(weight_raw, dtype, shape)
    for up, down, factor in updates:
        value = value + factor * (np.asarray(up, np.float64) @ np.asarray(down, np.float64))
    if dtype == "BF16":
        return reference_bf16(value).astype("<u2").tobytes()
    return struct.pack(f"<{value.size}f", *value.reshape(-1).tolist())   # struct rounds to nearest even


def tensor_shapes(model: Path, partition: str = "FL2VA") -> dict[str, tuple[Path, str, tuple[int, ...]]]:
    """The transformer's tensors: name -> (shard, dtype, shape)."""
    found = {}
    for shard in sorted((model / partition / "transformer").glob("*.safetensors")):
        for tensor in read_header(shard).tensors:
            found[tensor.name] = (shard, tensor.dtype, tensor.shape)
    return found


def low_rank(rng: np.random.Generator, out: int, inner: int, rank: int, scale: float = 0.05
             ) -> tuple[np.ndarray, np.ndarray]:
    """(up [out, rank], down [rank, inner]) as float32-representable values."""
    up = (rng.standard_normal((out, rank)) * scale).astype(np.float32)
    down = (rng.standard_normal((rank, inner)) * scale).astype(np.float32)
    return up, down
