"""The fold's element-wise work for its default case (bf16 target, stochastic rounding) in one
compiled pass, when numba is installed (`pip install 'h3bridge[fast-fold]'`; the kernels are
_kernels.py).

Why: after the matrix product (BLAS), numpy needs about a dozen passes over each block of rows
(widen the weights, add, narrow, the dither's eight integer passes, the dithered rounding, the
stored change, the survival sums), each a trip through memory. The kernels do the same
arithmetic per element in tiles that stay in the CPU's first-level cache: about a third less CPU
per element, and the fold's throughput past half a plain copy's (bench/bench_lora.py, issue 21).

It is a second implementation of one rule, not a second rule: the bytes are the ones
`bf16.float64_to_bf16_stochastic` with `bf16.Dither` gives (the same float64 operations in the
same order: W + factor * term, narrowed once to float32; the same lowbias32 stream), and
tests/test_lora_compiled.py checks them equal, byte for byte, and against the independent
oracle of tests/lora_helpers.py; the fold's parity probe (numpy) checks the kernels' output on
every block. Without numba (or when it cannot load: numba supports a range of numpy versions,
and the kernels a little-endian machine), fold.py runs the numpy passes and writes the same bytes,
more slowly. H3BRIDGE_FOLD_KERNEL=numpy chooses those passes where numba is installed.

The survival sums are float32 within a tile of 2048 elements and float64 across tiles (the numpy
passes sum each block in float32 by BLAS): the reports agree to about 1e-5 relative, far below
the three digits shown.
"""
from __future__ import annotations

import os
import sys
from types import ModuleType

import numpy as np

# the sums stochastic_bf16 adds to, in this order (fold_survival.Tally's fields, then a flag)
SUMS = ("unchanged", "weight_sq", "update_sq", "stored_dot", "stored_sq", "overflowed")
UNCHANGED, WEIGHT_SQ, UPDATE_SQ, STORED_DOT, STORED_SQ, OVERFLOWED = range(len(SUMS))
ENVIRONMENT = "H3BRIDGE_FOLD_KERNEL"

_kernels: ModuleType | None = None
_unavailable: str | None = None           # why not, once tried


def _load() -> ModuleType | None:
    global _kernels, _unavailable
    if _kernels is None and _unavailable is None:
        try:
            if os.environ.get(ENVIRONMENT, "").strip().lower() == "numpy":
                raise ImportError(f"{ENVIRONMENT}=numpy")
            if sys.byteorder != "little":      # the kernels read a word's 16-bit halves in memory order
                raise ImportError("a big-endian machine")
            from . import _kernels as loaded
        except Exception as error:             # numba absent, or refusing this numpy (it checks at import)
            _unavailable = f"{type(error).__name__}: {error}"
        else:
            _kernels = loaded
    return _kernels


def available() -> bool:
    """True when the compiled kernels can run here (numba installed and loading)."""
    return _load() is not None


def name() -> str:
    """What folds a bf16 tensor's elements here, for the benchmark and `h3bridge doctor`."""
    kernels = _load()
    if kernels is None:
        return f"numpy (no compiled kernels: {_unavailable})"
    return f"numba {kernels.numba.__version__}"


def stochastic_bf16(raw: np.ndarray, term: np.ndarray, factor: float, first: int, offset: int, stride: int,
                    encoded: np.ndarray, sums: np.ndarray, prefix: np.ndarray | None = None) -> None:
    """Rows of a bf16 tensor, rounded stochastically: encoded = the bf16 bits of W + factor * term
    (or prefix + factor * term, prefix the float64 sum of W and the earlier LoRAs' terms), each
    element dithered by the stream of (offset, stride) at its index, the first one's `first`
    (bf16.Dither). raw: the rows' bf16 bits (uint16); term: the last LoRA's up @ down (float64);
    encoded: uint16, written; all C-contiguous, of one shape. Adds the rows' survival sums to
    `sums` (float64, indexed by SUMS; OVERFLOWED set to 1.0 when an infinity was written)."""
    kernels = _load()
    if kernels is None:
        raise RuntimeError(f"compiled.stochastic_bf16 without its kernels ({_unavailable}): check available() first")
    has_prefix = prefix is not None
    kernels.block(raw.reshape(-1), prefix.reshape(-1) if has_prefix else _NO_PREFIX, term.reshape(-1),
                  float(factor), has_prefix, int(first), np.uint32(offset), np.uint32(stride), encoded.reshape(-1),
                  sums)


_NO_PREFIX = np.empty(0, dtype=np.float64)
