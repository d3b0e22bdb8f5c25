"""The shared numerics of the tests: the bound of a sum rounded once to a low-precision dtype."""
import numpy as np
import pytest

from blocksparse.testing import rounded_once_bound


@pytest.mark.parametrize("dtype, value, half_ulp", [
    ("float16", 1.0, 2.0 ** -11), ("float16", 3.0, 2.0 ** -10), ("float16", -1000.0, 0.25),
    ("float16", 1e-6, 2.0 ** -25),                 # subnormal: the least normal exponent's ulp
    ("bfloat16", 1.0, 2.0 ** -8), ("bfloat16", 3e38, 2.0 ** 119), ("float32", 1.0, 2.0 ** -24)])
def test_half_an_ulp_where_the_sum_is_exact(dtype, value, half_ulp):
    assert rounded_once_bound(np.float64(value), np.float64(value), 0.0, 0, dtype) == half_ulp


def test_the_larger_of_exact_and_got_and_the_float32_sum_term():
    # a result across a binade boundary from the exact sum: half an ulp is taken at the larger one
    assert rounded_once_bound(np.array([0.999]), np.array([1.0]), np.array([0.0]), 0, "float16")[0] == 2.0 ** -11
    bound = rounded_once_bound(np.array([1.0]), np.array([1.0]), np.array([12.0]), 32, "bfloat16")[0]
    assert bound == 2.0 ** -8 + 32 * 2.0 ** -24 * 12.0


def test_a_second_rounding_fails_it(rng):
    """Where the sum has no slack (one term), float32 -> bfloat16 -> float16 lies up to half a
    bfloat16 ulp off: past the float16 bound."""
    exact = rng.standard_normal(4096)
    twice = exact.astype(np.float32)
    twice = (twice.view(np.uint32) + 0x8000 & 0xFFFF0000).view(np.float32).astype(np.float16).astype(np.float64)
    assert (np.abs(twice - exact) > rounded_once_bound(exact, twice, np.abs(exact), 1, "float16")).any()
    once = exact.astype(np.float32).astype(np.float16).astype(np.float64)
    assert (np.abs(once - exact) <= rounded_once_bound(exact, once, np.abs(exact), 1, "float16")).all()
