"""The float64 reference of a segmented reduction and the check of a result against it.

:func:`reference` is a deliberately naive float64 (complex128, or exact Python-int) NumPy loop
over explicit segment bounds, written without any of linred's code; :func:`assert_reduction`
compares a result with it (type, device, dtype, shape and values, within :func:`error_bound`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from support.arrays import assert_same_kind, to_numpy
from support.dtypes import COMPLEX, INTEGER, accumulation, dtype_of, expected_dtype, finfo, np_dtype


def segment_bounds(
    n: int, segment_length: int | None = None, offsets: Any = None, lengths: Any = None
) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of a segment spec (given as plain Python/NumPy values)."""
    if segment_length is not None:
        return [(i * segment_length, (i + 1) * segment_length) for i in range(n // segment_length)]
    if lengths is not None:
        lengths = to_numpy(lengths) if hasattr(lengths, "shape") else lengths
        offsets = [0, *np.cumsum(np.asarray(lengths, dtype=np.int64)).tolist()]
    off = [int(v) for v in np.asarray(to_numpy(offsets) if hasattr(offsets, "shape") else offsets).tolist()]
    return list(itertools.pairwise(off))


def identity(reduction: str, name: str) -> Any:
    if reduction == "sum":
        return 0
    if reduction == "mean":
        return math.nan
    if name == "bool":
        return reduction == "min"
    if name in INTEGER:
        info = np.iinfo(name)
        return int(info.min) if reduction == "max" else int(info.max)
    return -math.inf if reduction == "max" else math.inf


def reference(
    reduction: str, x: Any, segments: Sequence[tuple[int, int]], axis: int = 0, dtype: Any = None
) -> np.ndarray:
    """The segmented reduction of NumPy array ``x``, segment by segment.

    Integer results are exact (Python ints, then the result dtype); floating
    results are float64 (complex128 for complex), not rounded to the result dtype.
    Complex sums and means are those of the real and imaginary parts, so an
    infinity gives ``inf+0j``, as ``numpy.sum`` does.
    """
    x = np.asarray(x)
    out_name = expected_dtype(reduction, x.dtype.name, dtype)
    xm = np.moveaxis(x, axis, 0)
    rest = xm.shape[1:]
    if out_name == "bool":  # max/min of bool
        work = xm.astype(bool)
    elif out_name in INTEGER:  # exact: Python ints
        work = (xm.astype(np.int64) if x.dtype.kind == "b" else xm).astype(object)
    elif x.dtype.name in COMPLEX or out_name in COMPLEX:
        work = xm.astype(np.complex128)
    else:
        work = xm.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as it should be
        pieces = [_reduce_segment(reduction, work[start:stop], rest, out_name) for start, stop in segments]
    result = np.stack(pieces) if pieces else np.empty((0, *rest), dtype=work.dtype)
    if out_name in INTEGER:
        result = result.astype(np.dtype(out_name))  # exact; raises if the true result overflows
    elif result.dtype == object:
        result = result.astype(np.float64)
    return np.moveaxis(result, 0, axis)


def _reduce_segment(reduction: str, seg: np.ndarray, rest: tuple[int, ...], out_name: str) -> np.ndarray:
    if seg.shape[0] == 0:
        return np.full(rest, identity(reduction, out_name), dtype=seg.dtype)
    if reduction == "sum":
        return np.asarray(seg.sum(axis=0), dtype=seg.dtype)
    if reduction == "mean" and seg.dtype.kind == "c":  # componentwise: (inf+0j)/4 is inf+0j, not inf+nanj
        total = seg.sum(axis=0)
        mean = np.empty(rest, dtype=seg.dtype)
        mean.real, mean.imag = total.real / seg.shape[0], total.imag / seg.shape[0]
        return mean
    if reduction == "mean":
        return np.asarray(seg.sum(axis=0) / seg.shape[0])
    if reduction == "max":
        return np.asarray(np.max(seg, axis=0), dtype=seg.dtype)
    return np.asarray(np.min(seg, axis=0), dtype=seg.dtype)


def _segment_lengths_like(ref: np.ndarray, segments: Sequence[tuple[int, int]], axis: int) -> np.ndarray:
    lengths = np.array([stop - start for start, stop in segments], dtype=np.float64)
    shape = [1] * ref.ndim
    shape[axis] = len(segments)
    return lengths.reshape(shape)


def error_bound(
    reduction: str, x: np.ndarray, segments: Sequence[tuple[int, int]], axis: int, out_name: str, ref: np.ndarray
) -> np.ndarray:
    """An honest elementwise bound on ``|result - exact|`` for a floating sum or mean.

    Any summation order in precision ``u`` (unit roundoff of the accumulation
    dtype) errs by at most ``gamma(L) * sum|x|`` with ``gamma(k) = k u / (1 - k u)``
    (Higham, Accuracy and Stability, 4.2); the input's conversion to the
    accumulation dtype adds one more ``u``, a mean's division and the rounding to
    the result dtype one ulp of the result each.  The factor 2 absorbs complex
    arithmetic and stays far below what accumulating in a narrower dtype (or TF32)
    would need.
    """
    u = finfo(accumulation(out_name)).eps / 2
    k = _segment_lengths_like(ref, segments, axis) + 1
    gamma = np.where(k * u < 0.5, k * u / (1 - k * u), np.inf)
    absx = np.abs(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))
    magnitude = reference(reduction, absx, segments, axis)
    eps_out = float(finfo(out_name).eps)
    tiny = float(finfo(out_name).smallest_normal)
    return 2 * gamma * magnitude + 2 * eps_out * np.abs(ref) + tiny


def assert_reduction(
    got: Any,
    reduction: str,
    x: Any,
    *,
    segments: Sequence[tuple[int, int]],
    axis: int = 0,
    dtype: Any = None,
    like: Any = None,
) -> None:
    """Check a result against :func:`reference`: type, device, dtype, shape and values.

    ``like`` is the array the call received (its kind and device must be the
    result's); ``x`` is its NumPy twin.  max/min and integer results must be exact,
    floating sums and means within :func:`error_bound`.
    """
    if like is not None:
        assert_same_kind(got, like)
    x = np.asarray(x)
    out_name = expected_dtype(reduction, x.dtype.name, dtype)
    assert dtype_of(got) == out_name, f"result dtype {dtype_of(got)}, expected {out_name}"
    ref = reference(reduction, x, segments, axis, dtype)
    res = to_numpy(got)
    assert res.shape == ref.shape, f"result shape {res.shape}, expected {ref.shape}"
    if out_name in INTEGER:
        np.testing.assert_array_equal(res, ref, strict=True)
        return
    res = res.astype(np.complex128 if out_name in COMPLEX else np.float64)
    if reduction in ("max", "min"):
        # an element of the input, so exact once rounded to the result dtype
        expected = ref.astype(np_dtype(out_name)).astype(res.dtype)
        np.testing.assert_array_equal(res, expected)
        return
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(np.isnan(res), np.isnan(ref), err_msg="NaN in the wrong places")
    np.testing.assert_array_equal(res[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)], err_msg="inf")
    bound = error_bound(reduction, x, segments, axis, out_name, ref)
    with np.errstate(invalid="ignore"):
        err = np.abs(res - ref)
    bad = finite & ~(err <= bound)
    if bad.any():
        i = tuple(int(v[0]) for v in np.nonzero(bad))
        raise AssertionError(
            f"{int(bad.sum())} of {ref.size} elements off the float64 reference beyond the bound; "
            f"first at {i}: got {res[i]!r}, reference {ref[i]!r}, error {err[i]:.3g} > bound {bound[i]:.3g}"
        )
