"""h3bridge's one bf16 rounding (lora/bf16.py) against an independent nearest-neighbour search."""
from __future__ import annotations

import numpy as np

from h3bridge.lora.bf16 import bf16_to_float64, float64_to_bf16
from lora_helpers import _TABLE, reference_bf16


def test_random_values_over_every_magnitude_round_like_the_reference() -> None:
    rng = np.random.default_rng(7)
    mantissas = rng.uniform(1.0, 2.0, 200_000)
    exponents = rng.integers(-140, 128, 200_000)
    values = np.ldexp(mantissas, exponents) * rng.choice([-1.0, 1.0], 200_000)
    assert np.array_equal(float64_to_bf16(values), reference_bf16(values))


def test_exact_ties_go_to_even_and_near_ties_do_not() -> None:
    """Midpoints between neighbouring bf16 values (exact in float64) round to the even pattern; a
    hair above or below goes to the nearer one, which a float32 detour would get wrong
    (double rounding: 1 + 2**-8 + 2**-30 is a float64 above a tie that float32 rounds onto it)."""
    low, high = _TABLE[1000:30000], _TABLE[1001:30001]
    middle = (low + high) / 2
    for values in (middle, -middle, np.nextafter(middle, np.inf), np.nextafter(middle, -np.inf)):
        assert np.array_equal(float64_to_bf16(values), reference_bf16(values))
    tricky = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8 - 2**-30, 1 + 3 * 2**-8 + 2**-40])
    assert float64_to_bf16(tricky).tolist() == reference_bf16(tricky).tolist() == [0x3F81, 0x3F80, 0x3F82]
    assert float64_to_bf16(tricky.astype(np.float32)).tolist() != reference_bf16(tricky).tolist()


def test_subnormals_overflow_and_specials() -> None:
    bf16_max = float(_TABLE[-1])
    values = np.array([0.0, -0.0, 2.0**-133, 2.0**-134, 2.0**-134 * 1.5, 2.0**-127, bf16_max,
                       bf16_max + 2.0**119, np.nextafter(bf16_max + 2.0**119, 0), 3.4e38, 1e300, -1e300, np.inf, -np.inf])
    assert np.array_equal(float64_to_bf16(values), reference_bf16(values))
    assert float64_to_bf16(np.array([-0.0]))[0] == 0x8000
    nan = float64_to_bf16(np.array([np.nan, -np.nan, np.float64(np.float32(np.nan))]))
    assert all((bits & 0x7F80) == 0x7F80 and bits & 0x007F for bits in nan.tolist())     # NaN, never infinity
    assert nan[1] & 0x8000


def test_every_bf16_value_survives_a_round_trip() -> None:
    bits = np.arange(0, 0x10000, dtype=np.uint16)
    finite = bits[(bits & 0x7F80) != 0x7F80]
    assert np.array_equal(float64_to_bf16(bf16_to_float64(finite)), finite)


def test_the_dither_is_counter_based_and_stochastic_rounding_keeps_a_small_update() -> None:
    """Any block of indexes gives the same dither as the whole (so block size never changes the
    bytes); at rho = 3e-4 (a distillation LoRA) nearest rounding keeps a fraction of the update,
    stochastic rounding all of it on average (issue 21)."""
    from h3bridge.lora.bf16 import dither16, float64_to_bf16_stochastic
    whole = dither16(12345, 0, 1000)
    assert np.array_equal(np.concatenate([dither16(12345, 0, 7), dither16(12345, 7, 333), dither16(12345, 340, 660)]),
                          whole)
    assert not np.array_equal(dither16(12346, 0, 1000), whole)
    rng = np.random.default_rng(0)
    weight = bf16_to_float64(float64_to_bf16(rng.standard_normal(200_000) * 0.02))
    update = rng.standard_normal(200_000) * (3e-4 * np.linalg.norm(weight) / np.sqrt(200_000))
    exact = weight + update

    def kept(bits: np.ndarray) -> float:
        stored = bf16_to_float64(bits) - weight
        return float(stored @ update / (update @ update))

    assert kept(float64_to_bf16(exact)) < 0.3
    assert abs(kept(float64_to_bf16_stochastic(exact, dither16(7, 0, exact.size))) - 1) < 0.05
