"""Short fixed segments of one contiguous NumPy column, reduced as elementwise calls over the
columns of the ``(m, L)`` view (``linred.backends.numpy._chained``, ``_chain_rule``): max, min
and prod up to ``CHAIN_LONGEST`` elements, integer sums and means of few.  The results must be
those of ``ufunc.reduce`` along the segments (the same order of operations: bit for bit), and
for floating sums (a product with ones) those of the float64 reference within one rounding, the
sign of a zero sum included; every ``L`` across the constant."""

from __future__ import annotations

import numpy as np
import pytest

import linred
from linred.backends import numpy as numpy_backend

T = numpy_backend.CHAIN_LONGEST
LENGTHS = sorted({1, 2, 3, T - 1, T, T + 1})
REDUCE = {"max": np.maximum.reduce, "min": np.minimum.reduce, "prod": np.multiply.reduce}


def _data(dtype: str, n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    if dtype.startswith("int") or dtype.startswith("uint"):
        return rng.integers(0, 9, n).astype(dtype)
    x = rng.uniform(0.5, 1.5, n).astype(dtype)
    x[::97] = -x[::97]
    x[5::211] = np.nan  # (max and min propagate NaN, as ufunc.reduce does)
    return x


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "uint8"])
@pytest.mark.parametrize("reduction", ["max", "min", "prod"])
def test_ufunc_reductions_of_short_segments_are_those_of_reduce(reduction, dtype, L):
    m = 301
    x = _data(dtype, m * L)
    if reduction == "prod" and dtype.startswith("float"):
        x = np.abs(np.nan_to_num(x, nan=1.0)).astype(dtype)
    fn = getattr(linred, f"segmented_{reduction}")
    want = REDUCE[reduction](x.reshape(m, L), axis=1)
    got = fn(x, L, backend="numpy", dtype=want.dtype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    out = np.empty_like(want)
    assert fn(x, L, backend="numpy", dtype=want.dtype, out=out) is out
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_sums_of_one_or_two_elements_round_once(reduction, dtype, L):
    m = 1001
    x = np.random.default_rng(L).standard_normal(m * L).astype(dtype)
    fn = getattr(linred, f"segmented_{reduction}")
    got = fn(x, L, backend="numpy")
    ref = x.reshape(m, L).astype(np.float64)
    want = ref.sum(1) if reduction == "sum" else ref.mean(1)
    if L <= 2:  # one rounding of the exact value (and for the mean, the exact halving)
        np.testing.assert_array_equal(got, want.astype(dtype))
    else:  # (a BLAS product: linred's bound, 1e-6 of sum|x| plus two roundings of the sum)
        scale = np.abs(ref).sum(1) if reduction == "sum" else np.abs(ref).mean(1)
        bound = 1e-6 * scale + 2 * np.finfo(dtype).eps * np.abs(want)
        assert (np.abs(got - want) <= bound).all()


def test_a_batch_of_rows_along_the_last_axis():
    """``(B, n)`` data with ``axis=-1``: the same chained calls over each row's segments."""
    x = _data("float32", 3 * 40).reshape(3, 40)
    for L in (2, 5):
        got = linred.segmented_max(x, L, axis=-1, backend="numpy")
        np.testing.assert_array_equal(got, np.maximum.reduce(x.reshape(3, 40 // L, L), axis=2))


@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize(
    "dtype", ["int8", "int32", "int64", "uint8", "uint32", "bool", "float16", "float32", "float64"]
)
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod"])
def test_short_segments_of_a_strided_column(reduction, dtype, L):
    """A strided column (or data whose accumulator differs from it) takes the general fixed path,
    which chains the columns' elementwise calls where that is faster and exact (integer sums,
    means of one or two, max, min, prod): the results against NumPy's own reductions."""
    m = 257
    base = _data("int8" if dtype == "bool" else dtype, 2 * m * L)
    if dtype == "bool":
        base = base.astype(bool)
    if reduction == "prod" and base.dtype.kind == "f":
        base = np.abs(np.nan_to_num(base, nan=1.0)).astype(dtype)
    elif reduction in ("sum", "mean") and base.dtype.kind == "f":
        base = np.nan_to_num(base, nan=0.5).astype(dtype)
    x = base[::2]  # (strided: not the direct path)
    fn = getattr(linred, f"segmented_{reduction}")
    got = fn(x, L, backend="numpy")
    view = np.ascontiguousarray(x).reshape(m, L)
    if reduction in ("max", "min"):
        want = REDUCE[reduction](view, axis=1).astype(got.dtype)
        np.testing.assert_array_equal(got, want)
    elif reduction == "prod":
        np.testing.assert_array_equal(got, np.multiply.reduce(view, axis=1, dtype=got.dtype))
    elif got.dtype.kind in "iu":  # integer sums: exact
        np.testing.assert_array_equal(got, np.add.reduce(view, axis=1, dtype=got.dtype))
    else:
        ref = view.astype(np.float64)
        want = ref.sum(1) if reduction == "sum" else ref.mean(1)
        tol = {"float16": 1e-3, "float32": 1e-6}.get(str(got.dtype), 1e-14)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * np.abs(ref).sum(1).max())


@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_a_sum_of_negative_zeros_is_positive_zero(reduction, L):
    """As ``add.reduce`` (and the product with ones) gives it, for any layout: ``a + b`` alone would
    keep ``-0.0``."""
    x = np.full(2 * 4 * L, -0.0)
    for data in (x[: 4 * L], x[::2], x[: 4 * L].astype(np.float32)):
        got = getattr(linred, f"segmented_{reduction}")(data, L, backend="numpy")
        assert (got == 0).all() and not np.signbit(got).any(), (data.dtype, data.strides, got)
