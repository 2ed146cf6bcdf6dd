"""``remainder=``: a segment length that does not divide n, for time series cut into windows.

Every result is compared with a float64 NumPy reference of the same windows, on every host
array kind (and the GPU kinds where there is a GPU), along either axis with feature dims."""

from __future__ import annotations

import numpy as np
import pytest
from support import to_kind, to_numpy

import linred

REDUCE = {
    "sum": np.sum,
    "mean": np.mean,
    "max": np.max,
    "min": np.min,
}


def _windows(x: np.ndarray, L: int, axis: int, remainder: str) -> list[np.ndarray]:
    n = x.shape[axis]
    stops = list(range(L, n + 1, L))
    if remainder == "keep" and n % L:
        stops.append(n)
    starts = [s - L if s % L == 0 else s - n % L for s in stops]
    return [np.take(x, range(a, b), axis=axis) for a, b in zip(starts, stops, strict=True)]


@pytest.mark.parametrize("reduction", list(REDUCE))
@pytest.mark.parametrize("remainder", ["drop", "keep"])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("n, L", [(10, 4), (12, 4), (7, 8), (1, 1), (23, 5)])
def test_remainder_against_numpy(array_kind, reduction, remainder, axis, n, L):
    rng = np.random.default_rng(n * 100 + L)
    shape = (n, 3) if axis == 0 else (2, n)
    x = rng.standard_normal(shape)
    windows = _windows(x, L, axis, remainder)
    fn = getattr(linred, f"segmented_{reduction}")
    if not windows:  # remainder="drop" of fewer elements than one window
        got = fn(to_kind(x, array_kind), L, axis=axis, remainder=remainder)
        assert to_numpy(got).shape[axis] == 0
        return
    expected = np.stack([REDUCE[reduction](w, axis=axis) for w in windows], axis=axis)
    got = to_numpy(fn(to_kind(x, array_kind), L, axis=axis, remainder=remainder))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_remainder_argmax_positions_are_in_x(array_kind):
    x = np.array([3.0, 1.0, 2.0, 0.0, 5.0, 4.0, 9.0])
    got = to_numpy(linred.segmented_argmax(to_kind(x, array_kind), 3, remainder="keep"))
    np.testing.assert_array_equal(got, [0, 4, 6])
    got = to_numpy(linred.segmented_argmin(to_kind(x, array_kind), 3, remainder="drop"))
    np.testing.assert_array_equal(got, [1, 3])


def test_remainder_errors():
    x = np.arange(10.0)
    with pytest.raises(ValueError, match=r"does not divide the length of axis 0 \(n=10\); remainder='drop'"):
        linred.segmented_sum(x, 4)
    with pytest.raises(ValueError, match=r"remainder must be 'error', 'drop' or 'keep'; got 'pad'"):
        linred.segmented_sum(x, 4, remainder="pad")
    with pytest.raises(TypeError, match=r"remainder= applies to segment_length only"):
        linred.segmented_sum(x, offsets=[0, 10], remainder="keep")
    with pytest.raises(TypeError, match=r"segment_length must be an integer; got float"):
        linred.segmented_sum(x, 4.0, remainder="keep")
    with pytest.raises(ValueError, match=r"segment_length must be >= 1; got 0"):
        linred.segmented_sum(x, 0, remainder="drop")
    # a length that divides n: the same call as without remainder
    np.testing.assert_array_equal(linred.segmented_sum(x, 5, remainder="keep"), linred.segmented_sum(x, 5))


def test_remainder_drop_reads_a_view_and_writes_out():
    x = np.arange(11.0)
    out = np.empty(2)
    assert linred.segmented_sum(x, 5, remainder="drop", out=out) is out
    np.testing.assert_array_equal(out, [10.0, 35.0])
    out = np.empty(3)
    assert linred.segmented_mean(x, 5, remainder="keep", out=out) is out
    np.testing.assert_array_equal(out, [2.0, 7.0, 10.0])


def test_remainder_with_torch_autograd():
    torch = pytest.importorskip("torch")
    x = torch.arange(10.0, requires_grad=True)
    linred.segmented_sum(x, 4, remainder="drop").sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0] * 8 + [0.0] * 2)
    x.grad = None
    linred.segmented_mean(x, 4, remainder="keep").sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.25] * 8 + [0.5] * 2)
