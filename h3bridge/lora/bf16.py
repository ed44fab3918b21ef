"""bfloat16 <-> float64, the one place h3bridge rounds to bf16.

Rounding is to nearest, ties to even, computed from float64 without double rounding: float64 is
first narrowed to float32 with round-to-odd (truncate toward zero, set the last bit when
anything was dropped), which keeps 16 guard bits beyond bf16's 8-bit significand, so the final
float32 -> bf16 round-to-nearest-even is the correctly rounded float64 -> bf16 result (the usual
round-to-odd argument: the intermediate has at least two more bits than the target). Overflow
rounds to infinity, subnormals keep bf16's subnormal spacing, NaN stays a quiet NaN of the same
sign (a plain "add 0x7FFF and shift" turns some NaNs into infinities).
"""
from __future__ import annotations

import sys

import numpy as np

_QUIET_NAN = np.uint16(0x7FC0)


def bf16_to_float64(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16, any shape) -> the exact float64 values."""
    widened = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return widened.view(np.float32).astype(np.float64)


def _float32_round_to_odd(values: np.ndarray) -> np.ndarray:
    """float32 bit patterns of `values` rounded to odd. The nearest float32 is either the value
    truncated toward zero or one step beyond it; stepping back is subtracting 1 from the bit
    pattern (magnitude-ordered for either sign; from infinity it gives the largest float)."""
    nearest = values.astype(np.float32)                      # round to nearest even
    overshoot = nearest.astype(np.float64)
    overshoot -= values                                      # rounding error of `nearest`
    inexact = overshoot != 0
    overshoot *= values
    away = overshoot > 0                                     # error has the value's sign: away from 0
    bits = nearest.view(np.uint32)
    bits -= away.view(np.uint8)
    bits |= inexact.view(np.uint8)
    return bits                                               # float32 bit patterns


def _float64_to_bf16_via_odd(values: np.ndarray) -> np.ndarray:
    """The reference rounding (round to odd, then to nearest even): float64 -> bf16 bits."""
    with np.errstate(over="ignore", invalid="ignore"):
        bits = _float32_round_to_odd(values)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        sign = (np.signbit(values).astype(np.uint16) << np.uint16(15))
        rounded = np.where(nan, _QUIET_NAN | sign, rounded).astype(np.uint16)
    return rounded


# the high (bf16) half of each float32's bits in a uint16 view of a uint32 array
HIGH_HALF = 1 if sys.byteorder == "little" else 0


def float64_to_bf16(values: np.ndarray) -> np.ndarray:
    """float64 (or float32) values -> bf16 bit patterns (uint16), round to nearest, ties to even.

    Fast path: f = the nearest float32 (monotone; bf16 values and the midpoints between them are
    float32 values), rounded to bf16 by adding half a step to its bits. Unless f is itself a bf16
    midpoint, the exact value lies strictly between the same two midpoints as f, so its nearest
    bf16 value is f's. The few f that sit on a midpoint (a tie, or a value just off it) and NaN go
    through the round-to-odd reference (exact for every float64)."""
    values = np.asarray(values)
    if values.dtype != np.float32:
        values = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = values.astype(np.float32).reshape(-1)
    nan = np.flatnonzero(np.isnan(nearest))                  # before the add, which can carry out of one
    bits = nearest.view(np.uint32)
    bits += np.uint32(0x8000)                                # half a bf16 step (NaN: fixed below)
    low = bits.view(np.uint16)[1 - HIGH_HALF::2]
    rounded = bits.view(np.uint16)[HIGH_HALF::2].copy()
    unsure = np.flatnonzero(low == 0)                       # f on a midpoint: low bits were 0x8000
    if unsure.size:
        rounded[unsure] = _float64_to_bf16_via_odd(values.reshape(-1)[unsure].astype(np.float64))
    if nan.size:
        rounded[nan] = _float64_to_bf16_via_odd(values.reshape(-1)[nan].astype(np.float64))
    return rounded.reshape(values.shape)


def bf16_spacing(values: np.ndarray) -> np.ndarray:
    """The gap between consecutive bf16 values at the magnitude of each (finite) value:
    2**(exponent - 7), never below the subnormal spacing 2**-133."""
    _, exponent = np.frexp(np.abs(np.asarray(values, dtype=np.float64)))
    return np.ldexp(1.0, np.maximum(exponent - 1, -126) - 7)


# ----------------------------------------------------------------------------- stochastic rounding
#
# A LoRA's update is a few 1e-4 of a weight, a bf16 step ~4e-3 of it: rounded to nearest, most
# elements fall straight back to W and most of the update is lost (issue 21). Stochastic rounding
# rounds up with probability equal to the position between the two bf16 neighbours, so the
# stored change is unbiased. The dither is a counter-based random stream indexed by (seed, element
# index): the same fold gives the same bytes whatever the block size or the number of threads, and
# the parity probe can recompute any pick.
#
# The rule, exactly: f = the float32 nearest to the float64 result (bf16 values are float32
# values, and rounding to the nearest float32 is monotone, so f lies between the same two bf16
# neighbours as the exact result); r = dither16(seed, index) in [0, 65536); the stored bf16 is the
# top half of (float32 bits of f) + r. The 16 bits dropped are f's position between its two bf16
# neighbours in units of 2**-16 of a step; adding r carries into the kept half with probability
# position / 65536 (the bit pattern is magnitude-ordered for either sign, so this rounds the
# magnitude up, i.e. away from zero, with that probability).
#
# The stream, exactly (all arithmetic mod 2**32): k0 = bits 0-31 of the seed, k1 = bits 32-63 of
# it with bit 0 set (odd); element i's dither is the low 16 bits (i even) or the high 16 bits
# (i odd) of lowbias32((i // 2) * k1 + k0), where lowbias32(x) is Chris Wellons' integer hash
# (hash-prospector): x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16.
# It is a bijection of 32-bit words with full avalanche, so r is uniform and unrelated to the
# values it dithers; one 32-bit word gives two elements' dither, and numpy computes 32-bit words
# in SIMD lanes: about 0.8 ns per element where numpy's Philox4x64 stream (the earlier dither)
# cost 1.6-2.4 ns on the fold's machine, the largest cost after the matrix product. The stream
# repeats after 2**33 elements of one tensor (16 GiB of bf16; the largest released tensor has
# 1.5e8). bench/bench_lora.py measures that it keeps the update unbiased.

_MIX1, _MIX2 = np.uint32(0x7FEB352D), np.uint32(0x846CA68B)
_WORD = 0xFFFFFFFF


def _lowbias32(x: np.ndarray, scratch: np.ndarray) -> None:
    """lowbias32 of every uint32 word of x, in place (mod 2**32); scratch: a uint32 array of x's
    size, overwritten."""
    np.right_shift(x, np.uint32(16), out=scratch)
    x ^= scratch
    x *= _MIX1
    np.right_shift(x, np.uint32(15), out=scratch)
    x ^= scratch
    x *= _MIX2
    np.right_shift(x, np.uint32(16), out=scratch)
    x ^= scratch


class Dither:
    """The dither stream of one seed, drawn a block at a time into reusable buffers."""

    def __init__(self, seed: int, block: int = 0) -> None:
        self.offset = seed & _WORD
        self.stride = ((seed >> 32) & _WORD) | 1
        self._steps = np.empty(0, dtype=np.uint32)
        self._grow(block // 2 + 2)

    def _grow(self, words: int) -> np.ndarray:
        """j * k1 (mod 2**32) for j < words: a block's words are these plus one constant."""
        if len(self._steps) < words:
            steps = np.arange(words, dtype=np.uint32)
            steps *= np.uint32(self.stride)
            self._steps = steps
        return self._steps

    def draw(self, start: int, count: int, words: np.ndarray | None = None,
             scratch: np.ndarray | None = None) -> np.ndarray:
        """uint16 dither of elements start .. start+count-1. `words` and `scratch` (uint32, at
        least count // 2 + 2 long): working buffers, overwritten; the result is a view of `words`."""
        first = start >> 1
        needed = ((start + count + 1) >> 1) - first
        steps = self._grow(needed)[:needed]      # a local reference: another thread may grow a new one
        x = np.empty(needed, dtype=np.uint32) if words is None else words[:needed]
        t = np.empty(needed, dtype=np.uint32) if scratch is None else scratch[:needed]
        np.add(steps, np.uint32((first * self.stride + self.offset) & _WORD), out=x)
        _lowbias32(x, t)
        halves = x.astype("<u4", copy=False).view("<u2")       # low half first, on any byte order
        return halves[start & 1:(start & 1) + count]

    def at(self, indexes: np.ndarray) -> np.ndarray:
        """uint16 dither of the elements at these indexes (any shape; the result has it), each
        computed from its own index: the parity probe's few rows in one pass."""
        index = np.asarray(indexes, dtype=np.uint64)
        # mod 2**64 products keep their low 32 bits: the stream's arithmetic is mod 2**32
        x = (((index >> np.uint64(1)) * np.uint64(self.stride) + np.uint64(self.offset))
             & np.uint64(_WORD)).astype(np.uint32)
        _lowbias32(x, np.empty_like(x))
        return np.where(index & np.uint64(1), x >> np.uint32(16), x & np.uint32(0xFFFF)).astype(np.uint16)


def dither16(seed: int, start: int, count: int) -> np.ndarray:
    """uint16 dither values for element indexes start .. start+count-1 (the stream above). Any
    block of elements is computed directly, so the bytes do not depend on how a tensor is cut."""
    return Dither(seed).draw(start, count).copy()


def float64_to_bf16_stochastic(values: np.ndarray, dither: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float64 values (finite) -> bf16 bit patterns, rounded up or down by `dither` (same size,
    values in [0, 65536), from dither16). A result past bf16's largest finite value is infinity.
    float32 values are taken as the float64 values' nearest float32 (and overwritten). `out`: a
    uint16 array of the values' shape to write the result into."""
    values = np.asarray(values)
    bits = (values if values.dtype == np.float32 else values.astype(np.float32)).view(np.uint32)
    np.add(bits, dither.reshape(bits.shape), out=bits)
    if out is None:
        out = np.empty(bits.shape, dtype=np.uint16)
    return np.right_shift(bits, np.uint32(16), out=out, dtype=np.uint32, casting="unsafe")   # the high halves


def bf16_neighbours(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bf16 values just below-or-at and just above-or-at each finite float64 value (equal when
    the value is itself a bf16 value), as float64. Computed from the bf16 spacing, not by rounding."""
    values = np.asarray(values, dtype=np.float64)
    spacing = bf16_spacing(values)
    low = np.floor(values / spacing) * spacing
    high = np.where(low == values, low, low + spacing)
    return low, high
