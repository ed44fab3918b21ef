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


def float64_to_bf16(values: np.ndarray) -> np.ndarray:
    """float64 (or float32) values -> bf16 bit patterns (uint16), round to nearest, ties to even."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = _float32_round_to_odd(values)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        sign = (np.signbit(values).astype(np.uint16) << np.uint16(15))
        rounded = np.where(nan, _QUIET_NAN | sign, rounded).astype(np.uint16)
    return rounded


def bf16_spacing(values: np.ndarray) -> np.ndarray:
    """The gap between consecutive bf16 values at the magnitude of each (finite) value:
    2**(exponent - 7), never below the subnormal spacing 2**-133."""
    _, exponent = np.frexp(np.abs(np.asarray(values, dtype=np.float64)))
    return np.ldexp(1.0, np.maximum(exponent - 1, -126) - 7)
