"""LoRA files the tests make, and the independent float64 reference a fold must equal.

The reference never calls h3bridge's rounding: bf16 values are decoded with `struct`, and a
float64 result is rounded to bf16 by searching the sorted table of every finite bf16 value for
its two neighbours (nearest wins, a tie goes to the even bit pattern). The stochastic rounding's
dither is computed here from its rule as lora/bf16.py states it, element by element.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

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


# ----------------------------------------------------------------------------- the layout rule and bf16 neighbours
# Written from issue 21's statement of the rule, not from h3bridge/lora: the checkpoint h3 reads
# holds qkv row h*3*D + s*D + d for head h, slot s (Q, K, V), d < D; a flat LoRA's up/B row
# s*H*D + h*D + d is that same (s, h, d).


def flat_rows_to_per_head(up: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """A flat [Q | K | V] up/B matrix with its rows moved to the per-head rows, element by element."""
    placed = np.zeros_like(np.asarray(up, dtype=np.float64))
    for slot in range(3):
        for head in range(heads):
            for dim in range(head_dim):
                placed[head * 3 * head_dim + slot * head_dim + dim] = up[slot * heads * head_dim + head * head_dim + dim]
    return placed


def slot_rows_to_per_head(up: np.ndarray, slot: int, heads: int, head_dim: int) -> np.ndarray:
    """A separate Q (slot 0), K (1) or V (2) up/B [H*D, rank] placed on its rows of the per-head qkv."""
    placed = np.zeros((3 * heads * head_dim, up.shape[1]), dtype=np.float64)
    for head in range(heads):
        for dim in range(head_dim):
            placed[head * 3 * head_dim + slot * head_dim + dim] = up[head * head_dim + dim]
    return placed


def reference_exact(weight_raw: bytes, dtype: str, shape: tuple[int, ...],
                    updates: list[tuple[np.ndarray, np.ndarray, float]]) -> np.ndarray:
    """W + sum(factor * up @ down) in float64, not rounded."""
    value = decode(weight_raw, dtype, shape)
    for up, down, factor in updates:
        value = value + factor * (np.asarray(up, np.float64) @ np.asarray(down, np.float64))
    return value


def bf16_neighbour_bits(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bf16 bit patterns just below-or-at and just above-or-at each finite value (equal when
    the value is a bf16 value), by searching the table of every bf16 value."""
    values = np.asarray(values, dtype=np.float64)
    magnitude = np.abs(values).reshape(-1)
    at_or_above = np.searchsorted(_TABLE, magnitude, side="left")
    exact = (at_or_above < len(_TABLE)) & (_TABLE[np.minimum(at_or_above, len(_TABLE) - 1)] == magnitude)
    above = _TABLE_BITS[np.minimum(at_or_above, len(_TABLE) - 1)]
    below = np.where(exact, above, _TABLE_BITS[np.maximum(at_or_above - 1, 0)])
    sign = np.signbit(values.reshape(-1)).astype(np.uint32) << 15
    low, high = (below | sign).astype(np.uint16), (above | sign).astype(np.uint16)
    return low.reshape(values.shape), high.reshape(values.shape)


def assert_bf16_neighbours(written: bytes, exact: np.ndarray, what: str) -> None:
    """Every written bf16 value is one of the two bf16 neighbours of its exact float64 value."""
    bits = np.frombuffer(written, "<u2").reshape(exact.shape)
    low, high = bf16_neighbour_bits(exact)
    wrong = np.argwhere((bits != low) & (bits != high))
    assert wrong.size == 0, f"{what}: element {tuple(wrong[0])} is no bf16 neighbour of {exact[tuple(wrong[0])]!r}"


# ----------------------------------------------------------------------------- the dither, from its rule
# Written from the rule stated in lora/bf16.py's comment, not from its code (which draws two
# elements from each 32-bit word through uint16 views): element i's dither is the low 16 bits (i
# even) or the high 16 bits (i odd) of lowbias32((i // 2) * k1 + k0 mod 2**32), k0 = bits 0-31
# of the seed, k1 = bits 32-63 with bit 0 set; lowbias32: x ^= x >> 16; x *= 0x7FEB352D;
# x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16 (mod 2**32). Here in 64-bit integers, masked.


def reference_dither(seed: int, count: int, start: int = 0) -> np.ndarray:
    """The dither of elements start .. start+count-1 of the tensor whose seed is `seed` (uint16)."""
    word = np.uint64(0xFFFFFFFF)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(((seed >> 32) & 0xFFFFFFFF) | 1)
    index = np.arange(start, start + count, dtype=np.uint64)
    x = ((index // np.uint64(2)) * k1 + k0) & word
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & word
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & word
    x ^= x >> np.uint64(16)
    return ((x >> ((index % np.uint64(2)) * np.uint64(16))) & np.uint64(0xFFFF)).astype(np.uint16)


# ----------------------------------------------------------------------------- which code folds
# The fold's default case (bf16, stochastic) runs in compiled kernels where numba is installed
# (h3bridge/lora/compiled.py) and in numpy passes elsewhere; both must write the same bytes.

FOLD_KERNELS = ["compiled", "numpy"]


def use_fold_kernel(monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    """Fold with the compiled kernels (the test is skipped where they cannot load) or the numpy passes."""
    from h3bridge.lora import compiled
    if kernel == "numpy":
        monkeypatch.setattr(compiled, "available", lambda: False)
    elif not compiled.available():
        pytest.skip(f"the compiled fold kernels cannot load here: {compiled.name()}")


def set_block_elements(monkeypatch: pytest.MonkeyPatch, elements: int, product_elements: int | None = None) -> None:
    """Fold blocks of about `elements` elements (whole rows) whichever code folds, and with the
    compiled kernels take the matrix product `product_elements` at a time."""
    from h3bridge.lora import fold as fold_module
    monkeypatch.setattr(fold_module, "CHUNK_ELEMENTS", elements)
    monkeypatch.setattr(fold_module, "COMPILED_CHUNK_ELEMENTS", elements)
    if product_elements is not None:
        monkeypatch.setattr(fold_module, "COMPILED_ROWS_ELEMENTS", product_elements)
