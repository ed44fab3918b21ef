"""The fold's compiled kernels (h3bridge/lora/compiled.py) against the rule they implement: the
bytes of the numpy passes and of the independent oracle (tests/lora_helpers.py, written from the
rule in lora/bf16.py), for any tile boundary, element index parity, strength and number of LoRAs;
the survival sums against float64 sums over the written bytes; overflow flagged. Whole folds with
either code are compared in test_lora_speed.py, test_lora_fold.py and test_lora_rounding_fast.py
(parametrized by FOLD_KERNELS)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from lora_helpers import reference_dither
from h3bridge.lora import compiled
from h3bridge.lora.bf16 import Dither, float64_to_bf16_stochastic
from h3bridge.model.fold_survival import Tally

SEED = 0x9E3779B97F4A7C15F39CC0605CEDC834


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    # CI installs numba (the test extra) and sets H3BRIDGE_EXPECT_COMPILED_FOLD: there a kernel
    # that cannot load is a failure, not a skip
    if not compiled.available():
        if os.environ.get("H3BRIDGE_EXPECT_COMPILED_FOLD"):
            pytest.fail(f"the compiled fold kernels do not load: {compiled.name()}")
        pytest.skip(f"the compiled fold kernels cannot load here: {compiled.name()}")


def _case(rows: int, columns: int, seed: int, scale: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """bf16 weights (their bits) and a float64 low-rank term, at realistic magnitudes."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((rows, columns)) * 0.02).astype(np.float32)
    raw = (weight.view(np.uint32) >> 16).astype(np.uint16)
    term = (rng.standard_normal((rows, 8)) @ rng.standard_normal((8, columns))) * scale * 0.02
    return raw, term


def _numpy_fold(raw: np.ndarray, term: np.ndarray, factor: float, first: int,
                prefix: np.ndarray | None = None) -> np.ndarray:
    """What fold.py's numpy passes write for these rows (bf16.py's rule)."""
    weight = (raw.astype(np.uint32) << 16).view(np.float32)
    scaled = term * factor if factor != 1.0 else term
    base = weight.astype(np.float64) if prefix is None else prefix
    rounded = (base + scaled).astype(np.float32)
    dither = Dither(SEED).draw(first, raw.size).reshape(raw.shape)
    return float64_to_bf16_stochastic(rounded, dither)


def _oracle(raw: np.ndarray, term: np.ndarray, factor: float, first: int) -> np.ndarray:
    """The rule, from tests/lora_helpers.py: the float32 nearest W + factor * term, plus the dither
    of each element's index, high half kept."""
    exact = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64) + term * factor
    bits = exact.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits.reshape(-1) + reference_dither(SEED, raw.size, first)) >> 16).astype(np.uint16).reshape(raw.shape)


def _kernel(raw: np.ndarray, term: np.ndarray, factor: float, first: int,
            prefix: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    dither = Dither(SEED)
    encoded = np.empty(raw.shape, np.uint16)
    sums = np.zeros(len(compiled.SUMS))
    compiled.stochastic_bf16(raw, term, factor, first, dither.offset, dither.stride, encoded, sums, prefix)
    return encoded, sums


@pytest.mark.parametrize("rows, columns", [(1, 1), (1, 2047), (3, 683), (2, 1024), (5, 1025), (37, 768)])
@pytest.mark.parametrize("first", [0, 1, 2 * 2048 - 1, 123_456_789, (1 << 33) - 7])
@pytest.mark.parametrize("factor", [1.0, 0.37, -2.5])
def test_the_kernel_writes_the_bytes_of_the_numpy_passes_and_of_the_rule(rows: int, columns: int, first: int,
                                                                        factor: float) -> None:
    """Tile boundaries (2048 elements) inside and at the edges of the rows, odd and even first
    indexes (a word's two halves split across calls), indexes past 2**32, any strength."""
    raw, term = _case(rows, columns, seed=rows * 7919 + columns)
    encoded, _ = _kernel(raw, term, factor, first)
    assert np.array_equal(encoded, _numpy_fold(raw, term, factor, first))
    assert np.array_equal(encoded, _oracle(raw, term, factor, first))


def test_rows_folded_in_pieces_give_the_bytes_of_one_call() -> None:
    """The fold hands the kernel a block's rows a few at a time: any cut gives the same bytes."""
    raw, term = _case(9, 1000, seed=3)
    whole, whole_sums = _kernel(raw, term, 0.5, 4001)
    pieces = np.empty_like(whole)
    sums = np.zeros(len(compiled.SUMS))
    dither = Dither(SEED)
    for start, stop in ((0, 1), (1, 4), (4, 9)):
        compiled.stochastic_bf16(raw[start:stop], term[start:stop], 0.5, 4001 + start * 1000, dither.offset,
                                 dither.stride, pieces[start:stop], sums)
    assert np.array_equal(pieces, whole)
    assert sums[compiled.UNCHANGED] == whole_sums[compiled.UNCHANGED]
    assert np.allclose(sums, whole_sums, rtol=1e-6, atol=0)


def test_several_loras_add_up_in_float64_before_the_one_rounding() -> None:
    """prefix = W + the earlier LoRAs' terms (float64): the last term is added to it, not to W."""
    raw, term = _case(4, 3000, seed=4)
    _, earlier = _case(4, 3000, seed=5, scale=3e-3)
    weight = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    prefix = weight + earlier * 0.8
    encoded, _ = _kernel(raw, term, -0.6, 17, prefix)
    assert np.array_equal(encoded, _numpy_fold(raw, term, -0.6, 17, prefix))
    without, _ = _kernel(raw, term, -0.6, 17)
    assert not np.array_equal(encoded, without)                 # the earlier LoRA is really in the sum


@pytest.mark.parametrize("rho", [1e-4, 1e-2])
def test_the_sums_are_the_float64_sums_over_the_written_bytes(rho: float) -> None:
    raw, term = _case(11, 1500, seed=6, scale=rho)
    encoded, sums = _kernel(raw, term, 1.0, 99)
    weight = (raw.astype(np.uint32) << 16).view(np.float32)
    rounded = (weight.astype(np.float64) + term).astype(np.float32)
    stored = (encoded.astype(np.uint32) << 16).view(np.float32)
    expected = Tally.of_block(weight.astype(np.float64), (rounded - weight).astype(np.float64),
                              (stored - weight).astype(np.float64))
    assert sums[compiled.UNCHANGED] == expected.unchanged
    for index, value in ((compiled.WEIGHT_SQ, expected.weight_sq), (compiled.UPDATE_SQ, expected.update_sq),
                         (compiled.STORED_DOT, expected.stored_dot), (compiled.STORED_SQ, expected.stored_sq)):
        assert sums[index] == pytest.approx(value, rel=1e-5), compiled.SUMS[index]
    assert sums[compiled.OVERFLOWED] == 0.0
    assert 0.3 < sums[compiled.UNCHANGED] / raw.size < 1.0 if rho == 1e-4 else sums[compiled.UNCHANGED] / raw.size < 0.3


def test_an_infinity_written_is_flagged_and_huge_squares_still_sum() -> None:
    raw = np.full((2, 3000), 0x7F00, np.uint16)                 # 1.7e38: its square overflows float32
    term = np.zeros((2, 3000))
    encoded, sums = _kernel(raw, term, 1.0, 0)
    assert sums[compiled.OVERFLOWED] == 0.0 and np.isfinite(sums[compiled.WEIGHT_SQ])
    assert sums[compiled.WEIGHT_SQ] == pytest.approx(6000 * 1.7014118346046923e38 ** 2, rel=1e-6)
    term[1, 2999] = 3e38                                        # 1.7e38 + 3e38: past bf16's largest value
    encoded, sums = _kernel(raw, term, 1.0, 0)
    assert sums[compiled.OVERFLOWED] == 1.0 and encoded[1, 2999] & 0x7FFF == 0x7F80


def test_the_name_says_which_code_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compiled.name().startswith("numba ")
    monkeypatch.setattr(compiled, "_kernels", None)
    monkeypatch.setattr(compiled, "_unavailable", None)
    monkeypatch.setenv(compiled.ENVIRONMENT, "numpy")
    assert not compiled.available()
    assert compiled.name() == f"numpy (no compiled kernels: ImportError: {compiled.ENVIRONMENT}=numpy)"
