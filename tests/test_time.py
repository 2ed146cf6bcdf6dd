"""datetime64 and timedelta64 data (NumPy): reduced as int64 counts of their unit, NaT as NumPy does.

The reference is Python's own exact integer arithmetic on the int64 counts (fractions for
the mean, rounded half to even), segment by segment."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

import linred

NAT = np.iinfo(np.int64).min


def _segments(n: int, how: str):
    if how == "fixed":
        return {"segment_length": 3}, [(i, i + 3) for i in range(0, n, 3)]
    off = [0, 2, 2, 7, n]
    return {"offsets": off}, list(itertools.pairwise(off))


def _expected(reduction: str, counts: list[int]) -> int:
    values = [v for v in counts if v != NAT]
    if len(values) != len(counts):
        return NAT
    if reduction == "sum":
        return sum(values)
    if not values:
        return NAT
    if reduction == "max":
        return max(values)
    if reduction == "min":
        return min(values)
    return round(Fraction(sum(values), len(values)))  # Python rounds half to even


@pytest.mark.parametrize("how", ["fixed", "offsets"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", ["m8[s]", "m8[ns]", "M8[ns]", "M8[D]"])
def test_time_reductions_against_exact_integers(how, reduction, dtype):
    if reduction == "sum" and dtype.startswith("M"):
        pytest.skip("the sum of timestamps is refused (test_time_errors)")
    rng = np.random.default_rng(7)
    n = 12
    base = 1_700_000_000_000_000_000 if dtype == "M8[ns]" else 0  # 2023 in ns: past float64's 2^53
    counts = (base + rng.integers(-(10**6), 10**6, n)).astype(np.int64)
    counts[4] = NAT
    x = counts.view(dtype)
    kwargs, bounds = _segments(n, how)
    got = getattr(linred, f"segmented_{reduction}")(x, **kwargs)
    assert got.dtype == x.dtype
    expected = [_expected(reduction, counts[a:b].tolist()) if b > a or reduction == "sum" else NAT for a, b in bounds]
    if reduction == "sum":
        expected = [0 if a == b else e for (a, b), e in zip(bounds, expected, strict=True)]
    np.testing.assert_array_equal(got.view(np.int64), np.array(expected, dtype=np.int64))


def test_time_mean_rounds_to_the_nearest_unit_ties_to_even():
    x = np.array([1, 2, 5, 6, 0, 3], "m8[s]")
    np.testing.assert_array_equal(linred.segmented_mean(x, 2).view(np.int64), [2, 6, 2])
    day = np.array(["2024-06-01", "2024-06-03"], "M8[D]")
    assert linred.segmented_mean(day, 2)[0] == np.datetime64("2024-06-02")


@pytest.mark.parametrize("dtype", ["M8[ns]", "m8[ns]"])
def test_time_mean_of_sums_past_int64(dtype):
    """Means whose sums of offsets pass 2**63 (120,000 timestamps a day after the array's
    smallest), whose values span all of int64 (an offset past 2**63), and an old value elsewhere
    in the array beside a segment of ordinary ones: exact, as Python's integers give them."""
    rng = np.random.default_rng(3)
    day = 86_400 * 10**9
    cases = [
        (np.r_[0, np.full(120_000, day)] + 1_700_000_000 * 10**9, [0, 120_001]),
        (np.r_[631_152_000 * 10**9, np.full(10, 1_592_222_400 * 10**9)], [0, 1, 11]),
        (np.array([2**63 - 1, -(2**63) + 1]), [0, 2]),
        (
            np.r_[rng.integers(-(2**63) + 1, 2**63 - 1, 40), NAT, rng.integers(-(2**63) + 1, 2**63 - 1, 9)],
            [0, 7, 7, 30, 41, 50],
        ),
    ]
    for counts, bounds in cases:
        x = np.asarray(counts, dtype=np.int64).view(dtype)
        got = linred.segmented_mean(x, offsets=bounds)
        expected = [_expected("mean", x.view(np.int64)[a:b].tolist()) if b > a else NAT
                    for a, b in itertools.pairwise(bounds)]  # fmt: skip
        np.testing.assert_array_equal(got.view(np.int64), np.array(expected, dtype=np.int64))


def test_time_along_an_axis_with_features():
    x = np.arange(24, dtype=np.int64).reshape(4, 6).view("m8[ms]")
    got = linred.segmented_sum(x, 3, axis=1)
    np.testing.assert_array_equal(got.view(np.int64), x.view(np.int64).reshape(4, 2, 3).sum(2))


def test_time_errors():
    ts = np.array(["2024-01-01", "2024-01-02"], "M8[D]")
    with pytest.raises(TypeError, match=r"the sum of x's datetime64\[D\] values is undefined"):
        linred.segmented_sum(ts, 2)
    td = np.array([1, 2], "m8[s]")
    with pytest.raises(TypeError, match=r"out cannot be given for timedelta64\[s\] data"):
        linred.segmented_sum(td, 2, out=np.empty(1, "m8[s]"))
    with pytest.raises(ValueError, match=r"does not divide"):
        linred.segmented_sum(td, 3)
    for name in ("argmax", "argmin"):  # positions of time data: not served, and said so
        with pytest.raises(TypeError, match=rf"segmented_{name} does not take timedelta64\[s\] data \(sum, mean"):
            getattr(linred, f"segmented_{name}")(td, 2)
