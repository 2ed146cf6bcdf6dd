"""Algebraic properties, checked by hypothesis on random segmentations (host backends, NumPy input).

Each test first makes sure the backend serves the kind of call it generates (a
documented refusal ends the test as skipped, like in the contract tests), then lets
hypothesis search.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support import run_or_refused

import linred

FLOATS = ("float32", "float64")
SPECS = ("fixed", "lengths")


@st.composite
def segmented(draw, dtype: str, spec: str, *, elements: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """``(x, segment kwargs)``: x of shape (n,) or (n, d) and a fixed or variable segmentation of n."""
    if spec == "fixed":
        L = draw(st.integers(1, 9))
        m = draw(st.integers(0, 8))
        n = L * m
        kwargs: dict[str, Any] = {"segment_length": L}
    else:
        lengths = draw(st.lists(st.integers(0, 9), min_size=0, max_size=10))
        n = sum(lengths)
        kwargs = {"lengths": lengths}
    d = draw(st.sampled_from([None, 1, 3]))
    shape = (n,) if d is None else (n, d)
    if elements is None:
        elements = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=np.dtype(dtype).itemsize * 8)
    x = draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))
    return x, kwargs


def bounds_of(n: int, kwargs: dict[str, Any]) -> list[tuple[int, int]]:
    if "segment_length" in kwargs:
        L = kwargs["segment_length"]
        return [(i, i + L) for i in range(0, n, L)]
    off = np.concatenate([[0], np.cumsum(kwargs["lengths"], dtype=np.int64)]).tolist()
    return list(itertools.pairwise(off))


def eps(dtype: str) -> float:
    return float(np.finfo(dtype).eps)


def probe(reduction: str, backend: str, dtype: str, spec: str) -> None:
    """Ends the test as skipped (a declared refusal) if ``backend`` does not serve this kind of call."""
    kwargs = {"segment_length": 2} if spec == "fixed" else {"lengths": [1, 0, 3]}
    x = np.ones((4, 3), dtype=dtype)
    run_or_refused(getattr(linred, f"segmented_{reduction}"), x, backend=backend, **kwargs)


def segment_abs_sums(x: np.ndarray, kwargs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per segment: sum of |x| (float64) and the length, shaped like the result."""
    b = bounds_of(x.shape[0], kwargs)
    a = np.abs(x.astype(np.float64))
    sums = np.array([a[s:e].sum(axis=0) for s, e in b]).reshape((len(b), *x.shape[1:]))
    lengths = np.array([e - s for s, e in b], dtype=np.float64).reshape((len(b),) + (1,) * (x.ndim - 1))
    return sums, lengths


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("spec", SPECS)
def test_linearity(host_backend, dtype, spec):
    """sum(a x + b y) == a sum(x) + b sum(y) for the same segments, to rounding."""
    probe("sum", host_backend, dtype, spec)

    @given(data=st.data(), a=st.floats(-10, 10), b=st.floats(-10, 10))
    def check(data, a, b):
        x, kwargs = data.draw(segmented(dtype, spec))
        y = data.draw(hnp.arrays(x.dtype, x.shape, elements=st.floats(-1e3, 1e3, width=x.dtype.itemsize * 8)))
        a, b = x.dtype.type(a), x.dtype.type(b)
        combined = (a * x + b * y).astype(dtype)
        left = linred.segmented_sum(combined, backend=host_backend, **kwargs)
        right = a * linred.segmented_sum(x, backend=host_backend, **kwargs) + b * linred.segmented_sum(
            y, backend=host_backend, **kwargs
        )
        sx, lengths = segment_abs_sums(x, kwargs)
        sy, _ = segment_abs_sums(y, kwargs)
        sc, _ = segment_abs_sums(combined, kwargs)
        # both sides err by at most (L + 3) eps times the magnitudes involved
        bound = 2 * (lengths + 3) * eps(dtype) * (abs(a) * sx + abs(b) * sy + sc) + np.finfo(dtype).tiny
        np.testing.assert_array_less(np.abs(left.astype(np.float64) - right.astype(np.float64)), bound + 0.0)

    check()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("spec", SPECS)
def test_sum_of_segment_sums_is_the_total(host_backend, dtype, spec):
    probe("sum", host_backend, dtype, spec)

    @given(data=segmented(dtype, spec))
    def check(data):
        x, kwargs = data
        sums = linred.segmented_sum(x, backend=host_backend, **kwargs)
        total = x.astype(np.float64).sum(axis=0)
        n = x.shape[0]
        bound = 2 * (n + 2) * eps(dtype) * np.abs(x.astype(np.float64)).sum(axis=0) + np.finfo(dtype).tiny
        np.testing.assert_array_less(np.abs(sums.astype(np.float64).sum(axis=0) - total), bound)

    check()


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("spec", SPECS)
def test_integer_sums_are_exact(host_backend, dtype, spec):
    probe("sum", host_backend, dtype, spec)

    @given(data=segmented(dtype, spec, elements=st.integers(-(2**31), 2**31 - 1)))
    def check(data):
        x, kwargs = data
        got = linred.segmented_sum(x, backend=host_backend, **kwargs)
        assert got.dtype == np.int64
        expected = [x[s:e].astype(object).sum(axis=0) for s, e in bounds_of(x.shape[0], kwargs)]
        expected = np.array([np.asarray(v, dtype=np.int64) for v in expected], dtype=np.int64).reshape(got.shape)
        np.testing.assert_array_equal(got, expected)

    check()


@pytest.mark.parametrize("reduction", ["sum", "max", "min"])
@pytest.mark.parametrize("spec", SPECS)
def test_permutation_within_segments(host_backend, reduction, spec):
    """Shuffling elements inside each segment changes a sum only by rounding, and max/min not at all."""
    dtype = "float32"
    probe(reduction, host_backend, dtype, spec)
    fn = getattr(linred, f"segmented_{reduction}")

    @given(data=segmented(dtype, spec), seed=st.integers(0, 2**32 - 1))
    def check(data, seed):
        x, kwargs = data
        rng = np.random.default_rng(seed)
        y = x.copy()
        for s, e in bounds_of(x.shape[0], kwargs):
            y[s:e] = x[s:e][rng.permutation(e - s)]
        a = fn(x, backend=host_backend, **kwargs)
        b = fn(y, backend=host_backend, **kwargs)
        if reduction != "sum":
            np.testing.assert_array_equal(a, b)
            return
        sums, lengths = segment_abs_sums(x, kwargs)
        bound = 4 * (lengths + 1) * eps(dtype) * sums + np.finfo(dtype).tiny
        np.testing.assert_array_less(np.abs(a.astype(np.float64) - b.astype(np.float64)), bound)

    check()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("spec", SPECS)
def test_mean_times_length_is_the_sum(host_backend, dtype, spec):
    probe("mean", host_backend, dtype, spec)
    probe("sum", host_backend, dtype, spec)

    @given(data=segmented(dtype, spec))
    def check(data):
        x, kwargs = data
        means = linred.segmented_mean(x, backend=host_backend, **kwargs).astype(np.float64)
        sums = linred.segmented_sum(x, backend=host_backend, **kwargs).astype(np.float64)
        abs_sums, lengths = segment_abs_sums(x, kwargs)
        empty = np.broadcast_to(lengths == 0, means.shape)
        assert np.isnan(means[empty]).all()
        assert not np.isnan(means[~empty]).any()
        bound = 4 * (lengths + 2) * eps(dtype) * abs_sums + np.finfo(dtype).tiny
        diff = np.abs(means * lengths - sums)
        np.testing.assert_array_less(diff[~empty], np.broadcast_to(bound, diff.shape)[~empty])

    check()


@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "int16"])
@pytest.mark.parametrize("spec", SPECS)
def test_max_min_are_attained_bounds(host_backend, reduction, dtype, spec):
    """max >= every element of its segment and equals one of them (min likewise); empty: the identity."""
    probe(reduction, host_backend, dtype, spec)
    fn = getattr(linred, f"segmented_{reduction}")
    elements = st.integers(-(2**15), 2**15 - 1) if dtype == "int16" else None

    @given(data=segmented(dtype, spec, elements=elements))
    def check(data):
        x, kwargs = data
        got = fn(x, backend=host_backend, **kwargs)
        assert got.dtype == x.dtype
        for i, (s, e) in enumerate(bounds_of(x.shape[0], kwargs)):
            if e == s:
                info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
                identity = (-np.inf if reduction == "max" else np.inf) if dtype.startswith("float") else None
                if identity is None:
                    identity = info.min if reduction == "max" else info.max
                assert (got[i] == identity).all()
                continue
            seg = x[s:e]
            if reduction == "max":
                assert (got[i] >= seg).all()
            else:
                assert (got[i] <= seg).all()
            assert (seg == got[i]).any(axis=0).all()

    check()


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
def test_fixed_length_equals_its_offsets(host_backend, reduction):
    """segment_length=L and the equivalent offsets give the same result."""
    probe(reduction, host_backend, "float64", "fixed")
    probe(reduction, host_backend, "float64", "lengths")
    fn = getattr(linred, f"segmented_{reduction}")

    @given(data=segmented("float64", "fixed"))
    def check(data):
        x, kwargs = data
        L = kwargs["segment_length"]
        fixed = fn(x, L, backend=host_backend)
        variable = fn(x, offsets=np.arange(0, x.shape[0] + 1, L), backend=host_backend)
        if reduction in ("max", "min"):
            np.testing.assert_array_equal(fixed, variable)
        else:
            np.testing.assert_allclose(fixed, variable, rtol=4 * (L + 1) * eps("float64"), atol=1e-9)

    check()
