"""The compiled kernels of compiled.py (numba): imported only when a fold first needs them, so
`import h3bridge` never loads numba. Read compiled.py first: it says what these compute and why.
"""
from __future__ import annotations

import numba
import numpy as np

TILE = 2048      # elements per tile: its working arrays (~50 KiB) stay in the CPU's nearest caches
UNCHANGED, WEIGHT_SQ, UPDATE_SQ, STORED_DOT, STORED_SQ, OVERFLOWED = range(6)   # compiled.SUMS


# numba widens integer arithmetic to 64 bits and a variable rebound to a wider type stays
# wide (and slow: no 32-bit SIMD lanes): every step below is cast back to uint32 into a
# variable of its own. That is also the arithmetic mod 2**32 the stream is defined by.
@numba.njit(nogil=True, cache=True)
def _dither(words, first_word, count, offset, stride):
    """Words first_word .. first_word+count-1 of the stream: lowbias32(j * stride + offset)
    mod 2**32 (bf16.py); word j's low 16 bits are element 2j's dither, its high 16 bits 2j+1's."""
    base = np.uint32((np.uint64(first_word) * np.uint64(stride) + np.uint64(offset)) & np.uint64(0xFFFFFFFF))
    for k in range(count):
        x = np.uint32(base + np.uint32(k) * stride)
        y = np.uint32(x ^ (x >> np.uint32(16)))
        y2 = np.uint32(y * np.uint32(0x7FEB352D))
        z = np.uint32(y2 ^ (y2 >> np.uint32(15)))
        z2 = np.uint32(z * np.uint32(0x846CA68B))
        words[k] = np.uint32(z2 ^ (z2 >> np.uint32(16)))

# The survival sums of a tile in float32 lanes: reassociation lets the loop run in SIMD lanes
# (their order is fixed by the compiled loop, not by the data or the thread: the same sums for
# the same tile); the tiles add up in float64. float32 over a tile's 2048 elements is good to
# about 1e-5, far below the report's three digits. Given float64 arrays (numba compiles a second
# version), the sums are float64.
@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "nsz"})
def _tile_sums(weight, rounded, stored, count):
    unchanged = np.float32(0.0)                # a count (exact in float32 up to 2**24)
    weight_sq = np.float32(0.0)
    update_sq = np.float32(0.0)
    stored_dot = np.float32(0.0)
    stored_sq = np.float32(0.0)
    for k in range(count):
        w = weight[k]
        change = stored[k] - w
        update = rounded[k] - w
        unchanged += np.float32(1.0) if change == np.float32(0.0) else np.float32(0.0)
        weight_sq += w * w
        update_sq += update * update
        stored_dot += change * update
        stored_sq += change * change
    return unchanged, weight_sq, update_sq, stored_dot, stored_sq


@numba.njit(nogil=True, cache=True)
def block(raw, prefix, term, factor, has_prefix, first, offset, stride, encoded, sums):
    """compiled.stochastic_bf16 on flat arrays (its argument checks and types done), a tile at a
    time: the tile's dither words; its weights widened to float32; the float64 sum narrowed once
    to float32; the dither added to those bits and the high halves kept (the bf16 written); the
    tile's survival sums."""
    scale = factor != 1.0
    wbits = np.empty(TILE, dtype=np.uint32)
    fbits = np.empty(TILE, dtype=np.uint32)
    sbits = np.empty(TILE, dtype=np.uint32)
    words = np.empty(TILE // 2 + 2, dtype=np.uint32)
    halves = words.view(np.uint16)                            # little-endian: a word's low half first
    weight = wbits.view(np.float32)
    rounded = fbits.view(np.float32)
    stored = sbits.view(np.float32)
    total = raw.size
    overflowed = False
    for tile in range(0, total, TILE):
        count = min(TILE, total - tile)
        index = first + tile                                  # the tile's first element index
        first_word = index >> 1                               # word j: elements 2j and 2j+1
        _dither(words, first_word, ((index + count + 1) >> 1) - first_word, offset, stride)
        # the tile's own views, indexed from 0 (an offset index defeats the SIMD loops)
        raw_tile = raw[tile:tile + count]
        term_tile = term[tile:tile + count]
        encoded_tile = encoded[tile:tile + count]
        for k in range(count):                                # bf16 bits are a float32's high half
            wbits[k] = np.uint32(np.uint32(raw_tile[k]) << np.uint32(16))
        if has_prefix:                                        # earlier LoRAs' float64 sum
            prefix_tile = prefix[tile:tile + count]
            for k in range(count):
                t = term_tile[k] * factor if scale else term_tile[k]
                rounded[k] = np.float32(prefix_tile[k] + t)
        else:
            for k in range(count):
                t = term_tile[k] * factor if scale else term_tile[k]
                rounded[k] = np.float32(np.float64(weight[k]) + t)   # the one rounding to float32
        phase = index & 1                                     # halves[0] is element 2 * first_word's
        largest = np.uint32(0)
        for k in range(count):                                # + dither, keep the high half
            top = np.uint32(np.uint32(fbits[k] + np.uint32(halves[phase + k])) >> np.uint32(16))
            encoded_tile[k] = np.uint16(top)
            sbits[k] = np.uint32(top << np.uint32(16))
            largest = np.uint32(max(largest, np.uint32(top & np.uint32(0x7FFF))))
        overflowed |= largest >= np.uint32(0x7F80)            # an infinity (NaN cannot arise: inputs are finite)
        unchanged, weight_sq, update_sq, stored_dot, stored_sq = _tile_sums(weight, rounded, stored, count)
        if not (np.isfinite(weight_sq) and np.isfinite(update_sq) and np.isfinite(stored_dot)
                and np.isfinite(stored_sq)):
            # squares past float32's range (weights near 1e19 and more): the same sums in float64
            unchanged, weight_sq, update_sq, stored_dot, stored_sq = _tile_sums(
                weight[:count].astype(np.float64), rounded[:count].astype(np.float64),
                stored[:count].astype(np.float64), count)
        sums[UNCHANGED] += np.float64(unchanged)
        sums[WEIGHT_SQ] += weight_sq
        sums[UPDATE_SQ] += update_sq
        sums[STORED_DOT] += stored_dot
        sums[STORED_SQ] += stored_sq
    if overflowed:
        sums[OVERFLOWED] = 1.0
