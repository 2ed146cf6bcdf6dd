"""The numerical contract of segmented_sum/mean/max/min on every array kind and backend.

Each test runs on every ``(array_kind, backend)`` pair of ``conftest.py`` and
compares with the float64 reference; a named backend may refuse a call with a
proper BackendError for something it is documented to refuse (the test is then
reported as skipped, with the reason), ``auto`` never.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support import (
    ALL_DTYPES,
    COMPLEX,
    FUNCTIONS,
    HAS_TORCH,
    REAL,
    REDUCTIONS,
    assert_reduction,
    assert_same_kind,
    dtype_of,
    empty_like_kind,
    expected_dtype,
    make_data,
    np_dtype,
    run_or_refused,
    segment_bounds,
    to_kind,
    to_numpy,
    xp_of,
)

if HAS_TORCH:
    import torch

# Empty segments first, in the middle (two in a row) and last.
OFFSETS_24 = [0, 0, 5, 5, 5, 13, 24, 24]
LENGTHS_24 = np.diff(OFFSETS_24).tolist()


def spec(name: str, n: int, kind: str) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """The keyword arguments of a segment spec for ``n`` elements, and its bounds."""
    offsets = OFFSETS_24 if n == 24 else [0, 0, n // 3, n // 3, n, n]
    lengths = np.diff(offsets).tolist()
    kwargs: dict[str, Any] = {
        "fixed": {"segment_length": 4},
        "fixed-np-int": {"segment_length": np.int32(6)},
        "offsets-list": {"offsets": offsets},
        "offsets-np-int32": {"offsets": np.array(offsets, dtype=np.int32)},
        "offsets-np-int64": {"offsets": np.array(offsets, dtype=np.int64)},
        "offsets-kind": {"offsets": to_kind(np.array(offsets, dtype=np.int32), kind)},
        "offsets-kind-int64": {"offsets": to_kind(np.array(offsets, dtype=np.int64), kind)},
        "lengths-list": {"lengths": lengths},
        "lengths-np-uint8": {"lengths": np.array(lengths, dtype=np.uint8)},
        "lengths-kind": {"lengths": to_kind(np.array(lengths, dtype=np.int64), kind)},
    }[name]
    plain = {
        k: (int(v) if k == "segment_length" else v if isinstance(v, list) else to_numpy(v)) for k, v in kwargs.items()
    }
    return kwargs, segment_bounds(n, **plain)


ALL_SPECS = (
    "fixed",
    "fixed-np-int",
    "offsets-list",
    "offsets-np-int32",
    "offsets-np-int64",
    "offsets-kind",
    "offsets-kind-int64",
    "lengths-list",
    "lengths-np-uint8",
    "lengths-kind",
)
MATRIX_SPECS = ("fixed", "offsets-list", "offsets-kind", "lengths-list")


def call(reduction: str, x: Any, *, backend: str, **kwargs: Any) -> Any:
    return run_or_refused(FUNCTIONS[reduction], x, backend=backend, **kwargs)


# ---------------------------------------------------------------------------
# The seed example and every segment spec
# ---------------------------------------------------------------------------

SEED = {"sum": [10, 26, 42], "mean": [2.5, 6.5, 10.5], "max": [4, 8, 12], "min": [1, 5, 9]}
SEED_SPECS = {
    "L=4": {"segment_length": 4},
    "offsets-list": {"offsets": [0, 4, 8, 12]},
    "offsets-np-int32": {"offsets": np.array([0, 4, 8, 12], dtype=np.int32)},
    "offsets-np-int64": {"offsets": np.array([0, 4, 8, 12], dtype=np.int64)},
    "lengths-list": {"lengths": [4, 4, 4]},
    "lengths-tuple": {"lengths": (4, 4, 4)},
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("seed_spec", [*SEED_SPECS, "offsets-kind", "lengths-kind"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_seed_example(array_kind, backend, reduction, seed_spec, dtype):
    """[1..12] in three segments of four: sum [10, 26, 42], mean [2.5, 6.5, 10.5], max [4, 8, 12], min [1, 5, 9]."""
    x = to_kind(np.arange(1, 13, dtype=dtype), array_kind)
    if seed_spec == "offsets-kind":
        kwargs = {"offsets": to_kind(np.array([0, 4, 8, 12]), array_kind)}
    elif seed_spec == "lengths-kind":
        kwargs = {"lengths": to_kind(np.array([4, 4, 4]), array_kind)}
    else:
        kwargs = SEED_SPECS[seed_spec]
    got = call(reduction, x, backend=backend, **kwargs)
    assert_same_kind(got, x)
    assert dtype_of(got) == expected_dtype(reduction, dtype)
    np.testing.assert_array_equal(to_numpy(got), np.array(SEED[reduction], dtype=np.float64), strict=False)


def test_seed_example_from_a_list():
    """Array-likes become NumPy arrays: a list of ints sums to int64."""
    got = FUNCTIONS["sum"](list(range(1, 13)), 4)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, np.array([10, 26, 42], dtype=np.int64), strict=True)
    got = FUNCTIONS["mean"]([[1.0, 2.0], [3.0, 4.0]], lengths=(2,))
    np.testing.assert_array_equal(got, np.array([[2.0, 3.0]]), strict=True)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("spec_name", ALL_SPECS)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_segment_specs(array_kind, backend, reduction, spec_name, dtype, rng):
    x_np = make_data(dtype, 24, rng)
    x = to_kind(x_np, array_kind)
    kwargs, bounds = spec(spec_name, 24, array_kind)
    got = call(reduction, x, backend=backend, **kwargs)
    assert_reduction(got, reduction, x_np, segments=bounds, like=x)


# ---------------------------------------------------------------------------
# Every dtype
# ---------------------------------------------------------------------------


def _dtype_reduction_params():
    for dtype in ALL_DTYPES:
        for reduction in REDUCTIONS:
            if dtype in COMPLEX and reduction in ("max", "min"):
                continue  # refused: test_complex_max_min_refused
            yield pytest.param(dtype, reduction, id=f"{dtype}-{reduction}")


@pytest.mark.parametrize(("dtype", "reduction"), list(_dtype_reduction_params()))
@pytest.mark.parametrize("spec_name", MATRIX_SPECS)
def test_dtypes(array_kind, backend, dtype, reduction, spec_name, rng):
    """Result dtype per the contract and values against the reference, with empty segments first/middle/last."""
    x_np = make_data(dtype, 24, rng)
    x = to_kind(x_np, array_kind)
    kwargs, bounds = spec(spec_name, 24, array_kind)
    got = call(reduction, x, backend=backend, **kwargs)
    assert_reduction(got, reduction, x_np, segments=bounds, like=x)


@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_max_min_refused(array_kind, reduction, dtype):
    x = to_kind(np.ones(4, dtype=dtype), array_kind)
    with pytest.raises(TypeError, match=rf"segmented_{reduction} does not support complex input \({dtype}\)"):
        FUNCTIONS[reduction](x, 2)


def test_complex_literal(array_kind, backend):
    x = to_kind(np.array([1 + 1j, 2 - 1j, 3, 4j], dtype=np.complex64), array_kind)
    got = call("sum", x, backend=backend, segment_length=2)
    assert dtype_of(got) == "complex64"
    np.testing.assert_array_equal(to_numpy(got), np.array([3 + 0j, 3 + 4j], dtype=np.complex64))
    got = call("mean", x, backend=backend, offsets=[0, 0, 4])
    res = to_numpy(got)
    assert np.isnan(res[0])
    np.testing.assert_allclose(res[1], 1.5 + 1j, rtol=1e-6)


# ---------------------------------------------------------------------------
# Empty segments and degenerate shapes
# ---------------------------------------------------------------------------

EMPTY_EXPECTED = {
    # offsets [0, 0, 3, 3, 6, 6] over [1..6]: empty first, middle and last
    ("sum", "float32"): [0, 6, 0, 15, 0],
    ("mean", "float32"): [math.nan, 2, math.nan, 5, math.nan],
    ("max", "float32"): [-math.inf, 3, -math.inf, 6, -math.inf],
    ("min", "float32"): [math.inf, 1, math.inf, 4, math.inf],
    ("sum", "int32"): [0, 6, 0, 15, 0],
    ("mean", "int32"): [math.nan, 2, math.nan, 5, math.nan],
    ("max", "int32"): [-(2**31), 3, -(2**31), 6, -(2**31)],
    ("min", "int32"): [2**31 - 1, 1, 2**31 - 1, 4, 2**31 - 1],
    ("sum", "uint8"): [0, 6, 0, 15, 0],
    ("max", "uint8"): [0, 3, 0, 6, 0],
    ("min", "uint8"): [255, 1, 255, 4, 255],
    ("max", "float16"): [-math.inf, 3, -math.inf, 6, -math.inf],
    ("min", "bfloat16"): [math.inf, 1, math.inf, 4, math.inf],
}


@pytest.mark.parametrize(("reduction", "dtype"), list(EMPTY_EXPECTED), ids=[f"{r}-{d}" for r, d in EMPTY_EXPECTED])
@pytest.mark.parametrize("how", ["offsets", "lengths"])
def test_empty_segments_literal(array_kind, backend, reduction, dtype, how):
    """Empty segments: sum 0, mean NaN, max/min the identity of the result dtype."""
    x = to_kind(np.arange(1, 7).astype(np_dtype(dtype)), array_kind)
    kwargs = {"offsets": [0, 0, 3, 3, 6, 6]} if how == "offsets" else {"lengths": [0, 3, 0, 3, 0]}
    got = call(reduction, x, backend=backend, **kwargs)
    out_name = expected_dtype(reduction, dtype)
    assert dtype_of(got) == out_name
    res = to_numpy(got)
    expected = np.array(EMPTY_EXPECTED[reduction, dtype], dtype=object)
    if out_name in REAL:
        np.testing.assert_array_equal(res.astype(np.float64), expected.astype(np.float64))
    else:
        np.testing.assert_array_equal(res, expected.astype(np_dtype(out_name)), strict=True)


def test_empty_segments_bool(array_kind, backend):
    x = to_kind(np.array([True, False, True, True]), array_kind)
    offsets = [0, 0, 2, 2, 4, 4]
    got = call("max", x, backend=backend, offsets=offsets)
    np.testing.assert_array_equal(to_numpy(got), [False, True, False, True, False], strict=False)
    assert dtype_of(got) == "bool"
    got = call("min", x, backend=backend, offsets=offsets)
    np.testing.assert_array_equal(to_numpy(got), [True, False, True, True, True], strict=False)
    got = call("sum", x, backend=backend, offsets=offsets)
    np.testing.assert_array_equal(to_numpy(got), np.array([0, 1, 0, 2, 0], dtype=np.int64), strict=True)


DEGENERATE = {
    # name: (shape, axis, segment kwargs)
    "m=0 offsets=[0]": ((0,), 0, {"offsets": [0]}),
    "m=0 lengths=[]": ((0,), 0, {"lengths": []}),
    "m=0 L=3": ((0,), 0, {"segment_length": 3}),
    "n=0 m=2": ((0,), 0, {"offsets": [0, 0, 0]}),
    "n=0 m=2 lengths": ((0,), 0, {"lengths": [0, 0]}),
    "n=0 features": ((0, 3), 0, {"offsets": [0, 0]}),
    "n=0 batch": ((2, 0, 3), 1, {"lengths": [0, 0, 0]}),
    "batch=0": ((0, 6), 1, {"segment_length": 3}),
    "features=0": ((6, 0), 0, {"segment_length": 3}),
    "features=0 offsets": ((6, 0), 0, {"offsets": [0, 2, 2, 6]}),
    "all empty but one": ((5,), 0, {"offsets": [0, 0, 0, 5, 5, 5]}),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", list(DEGENERATE))
@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_degenerate(array_kind, backend, reduction, case, dtype, rng):
    shape, axis, kwargs = DEGENERATE[case]
    x_np = make_data(dtype, shape, rng)
    x = to_kind(x_np, array_kind)
    got = call(reduction, x, backend=backend, axis=axis, **kwargs)
    bounds = segment_bounds(shape[axis], **kwargs)
    assert_reduction(got, reduction, x_np, segments=bounds, axis=axis, like=x)


# ---------------------------------------------------------------------------
# Layouts: feature dims, axis, non-contiguous input
# ---------------------------------------------------------------------------


def _broadcast(a: Any, shape: tuple[int, ...]) -> Any:
    if HAS_TORCH and isinstance(a, torch.Tensor):
        return a.expand(*shape)
    xp = np if isinstance(a, np.ndarray) else __import__("cupy")
    return xp.broadcast_to(a, shape)


LAYOUTS = {
    # name: (base shape, view of the base, axis); the view is applied to the NumPy twin and to the kind's array
    "1d": ((24,), lambda a: a, 0),
    "features (n,d)": ((24, 3), lambda a: a, 0),
    "features (n,d1,d2)": ((24, 2, 3), lambda a: a, 0),
    "axis=1 of 3-D": ((2, 24, 3), lambda a: a, 1),
    "axis=-1 of 3-D": ((2, 3, 24), lambda a: a, -1),
    "axis=1 of 2-D": ((3, 24), lambda a: a, 1),
    "axis=-2 of 3-D": ((2, 24, 3), lambda a: a, -2),
    "step 2": ((48,), lambda a: a[::2], 0),
    "step 3 with features": ((72, 2), lambda a: a[::3], 0),
    "transposed": ((3, 24), lambda a: a.T, 0),
    "transposed axis=1": ((24, 3), lambda a: a.T, 1),
    "column": ((24, 3), lambda a: a[:, 1], 0),
    "inner slice": ((24, 5), lambda a: a[:, 1:4], 0),
    "reversed": ((24,), lambda a: a[::-1], 0),
    "broadcast features": ((1, 3), lambda a: _broadcast(a, (24, 3)), 0),
    "broadcast rows": ((24, 1), lambda a: _broadcast(a, (24, 3)), 0),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("how", ["fixed", "offsets"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_layouts(array_kind, backend, reduction, layout, how, dtype, rng):
    base_shape, view, axis = LAYOUTS[layout]
    if layout == "reversed" and array_kind.startswith("torch"):
        pytest.skip("torch tensors have no negative strides")
    base = make_data(dtype, base_shape, rng)
    x_np = view(base)
    x = view(to_kind(base, array_kind))
    n = x_np.shape[axis]
    kwargs = {"segment_length": 4} if how == "fixed" else {"offsets": [0, 0, 5, 5, 13, n, n]}
    got = call(reduction, x, backend=backend, axis=axis, **kwargs)
    assert_reduction(got, reduction, x_np, segments=segment_bounds(n, **kwargs), axis=axis, like=x)


# ---------------------------------------------------------------------------
# Special values
# ---------------------------------------------------------------------------


def _special_values(dtype: str) -> np.ndarray:
    """20 values; segments of 4: finite, one NaN, +inf, -inf, +inf and -inf together."""
    x = np.linspace(-1, 1, 20)
    x[5] = np.nan
    x[9] = np.inf
    x[14] = -np.inf
    x[17], x[18] = np.inf, -np.inf
    return x.astype(np_dtype(dtype))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [*REAL, "complex64"])
@pytest.mark.parametrize("how", ["fixed", "offsets", "features"])
def test_nan_and_inf_stay_in_their_segment(array_kind, backend, reduction, dtype, how):
    """A NaN poisons only its own segment; infinities add up to inf (or NaN with both signs), like NumPy."""
    if dtype in COMPLEX and reduction in ("max", "min"):
        pytest.skip("complex max/min is refused")
    x_np = _special_values(dtype)
    if how == "features":
        x_np = np.stack([x_np, np.ones_like(x_np)], axis=1)
    x = to_kind(x_np, array_kind)
    kwargs = {"segment_length": 4} if how != "offsets" else {"offsets": [0, 4, 8, 8, 12, 16, 20]}
    got = call(reduction, x, backend=backend, **kwargs)
    bounds = segment_bounds(20, **kwargs)
    assert_reduction(got, reduction, x_np, segments=bounds, like=x)
    nan_segments = np.isnan(to_numpy(got).astype(np.complex128))
    if how == "features":
        assert not nan_segments[:, 1].any(), "a NaN leaked into another feature column"
        nan_segments = nan_segments[:, 0]
    expected_nan = [s <= 5 < e or (reduction in ("sum", "mean") and s <= 17 < e) for s, e in bounds]
    if reduction == "mean":
        expected_nan = [nan or s == e for nan, (s, e) in zip(expected_nan, bounds, strict=True)]
    np.testing.assert_array_equal(nan_segments, expected_nan)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize(("L", "d"), [(2, 4), (3, 3), (16, 2)])
def test_nan_and_inf_stay_in_their_feature_of_many_short_segments(array_kind, backend, reduction, L, d):
    """Many short segments of narrow feature rows (the host sums them as one product with a
    stacked identity, whose zeros meet every value): an infinite or NaN value changes only its
    own segment's own feature, and warns only where that sum itself is invalid."""
    import warnings

    m = 2100
    x_np = np.random.default_rng(3).standard_normal((m * L, d)).astype(np.float32)
    x_np[5, 1] = np.inf  # segment 5 // L, feature 1: inf
    x_np[L * 40, 0] = np.nan  # segment 40, feature 0: NaN
    x_np[L * 70 + L - 1, d - 1] = -np.inf
    x = to_kind(x_np, array_kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call(reduction, x, backend=backend, segment_length=L, axis=0)
    assert_reduction(got, reduction, x_np, segments=segment_bounds(m * L, L), like=x)
    expected = np.isfinite(x_np.reshape(m, L, d).sum(axis=1, dtype=np.float64))
    np.testing.assert_array_equal(np.isfinite(to_numpy(got)), expected)
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []
    x_np[L * 90, 1], x_np[L * 90 + 1, 1] = np.inf, -np.inf  # one sum of inf and -inf: invalid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = to_numpy(call(reduction, to_kind(x_np, array_kind), backend=backend, segment_length=L, axis=0))
    assert np.isnan(got[90, 1]) and np.isfinite(got[90, 0]) and np.isfinite(got[91]).all()


# ---------------------------------------------------------------------------
# Integer exactness and widening
# ---------------------------------------------------------------------------

WIDE = {
    # name: (dtype, value, count per segment, result dtype)
    "int32 past 2**31": ("int32", 2**31 - 1, 4, "int64"),
    "int32 min": ("int32", -(2**31), 4, "int64"),
    "int8 past 2**15": ("int8", 127, 300, "int64"),
    "int16": ("int16", -(2**15), 70000, "int64"),
    "int64 large": ("int64", 2**61, 3, "int64"),
    "uint8": ("uint8", 255, 300, "uint64"),
    "uint32 past 2**32": ("uint32", 2**32 - 1, 5, "uint64"),
    "uint64 past 2**63": ("uint64", 2**62 + 1, 3, "uint64"),
    "bool": ("bool", True, 70000, "int64"),
}


@pytest.mark.parametrize("case", list(WIDE))
@pytest.mark.parametrize("how", ["fixed", "offsets", "features"])
def test_integer_sums_are_exact(array_kind, backend, case, how):
    dtype, value, count, out_name = WIDE[case]
    x_np = np.full(2 * count, value, dtype=dtype)
    if how == "features":
        x_np = np.stack([x_np, x_np], axis=1)
    x = to_kind(x_np, array_kind)
    kwargs = {"offsets": [0, count, count, 2 * count]} if how == "offsets" else {"segment_length": count}
    got = call("sum", x, backend=backend, **kwargs)
    assert_same_kind(got, x)
    assert dtype_of(got) == out_name
    total = int(value) * count
    expected = [total, 0, total] if how == "offsets" else [total, total]
    expected = np.array(expected, dtype=out_name)
    if how == "features":
        expected = np.stack([expected, expected], axis=1)
    np.testing.assert_array_equal(to_numpy(got), expected, strict=True)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool"])
def test_integer_mean_is_float64(array_kind, backend, dtype):
    x_np = np.array([2**31 - 1, 2**31 - 1, 1, 0] if dtype in ("int32", "int64") else [1, 1, 1, 0], dtype=dtype)
    x = to_kind(x_np, array_kind)
    got = call("mean", x, backend=backend, lengths=[2, 0, 2])
    assert dtype_of(got) == "float64"
    assert_reduction(got, "mean", x_np, segments=segment_bounds(4, lengths=[2, 0, 2]), like=x)
    assert to_numpy(got)[0] == float(x_np[0])


# ---------------------------------------------------------------------------
# Half precision accumulates in float32
# ---------------------------------------------------------------------------

HALF_CASES = {
    # 3000 float16 ones: float16 accumulation would stop at 2048
    "float16 fixed": ("float16", 3000, {"segment_length": 3000}),
    "float16 offsets": ("float16", 3000, {"offsets": [0, 0, 3000]}),
    "float16 lengths": ("float16", 3000, {"lengths": [3000, 0]}),
    # 1000 bfloat16 ones: bfloat16 accumulation would stop at 256; 1000 is representable
    "bfloat16 fixed": ("bfloat16", 1000, {"segment_length": 1000}),
    "bfloat16 offsets": ("bfloat16", 1000, {"offsets": [0, 1000, 1000]}),
}


@pytest.mark.parametrize("case", list(HALF_CASES))
@pytest.mark.parametrize("features", [None, 2])
def test_half_precision_accumulates_in_float32(array_kind, backend, case, features):
    dtype, count, kwargs = HALF_CASES[case]
    shape = (count,) if features is None else (count, features)
    x = to_kind(np.ones(shape, dtype=np_dtype(dtype)), array_kind)
    bounds = segment_bounds(count, **kwargs)
    got = call("sum", x, backend=backend, **kwargs)
    assert dtype_of(got) == dtype
    expected = np.array([float(e - s) for s, e in bounds])
    res = to_numpy(got).astype(np.float64)
    np.testing.assert_array_equal(res if features is None else res[:, 0], expected)
    got = call("mean", x, backend=backend, **kwargs)
    assert dtype_of(got) == dtype
    res = to_numpy(got).astype(np.float64)
    expected = np.array([1.0 if e > s else math.nan for s, e in bounds])
    np.testing.assert_array_equal(res if features is None else res[:, 1], expected)


# ---------------------------------------------------------------------------
# dtype=
# ---------------------------------------------------------------------------


def _dtype_forms(name: str, kind: str) -> list[Any]:
    forms = [name, np_dtype(name) if name != "bfloat16" else "bfloat16"]
    if name != "bfloat16":
        forms.append(np_dtype(name).type)
    if kind.startswith("torch"):
        forms.append(getattr(torch, name))
    return forms


@pytest.mark.parametrize("form", [0, 1, 2, 3])
def test_dtype_float64_accumulates_in_float64(array_kind, backend, form):
    """float32 input, dtype=float64: 1e8 + 1 - 1e8 + 1 is 2 only when accumulated in float64."""
    forms = _dtype_forms("float64", array_kind)
    if form >= len(forms):
        pytest.skip("no such dtype form for this kind")
    x = to_kind(np.array([1e8, 1, -1e8, 1] * 2, dtype=np.float32), array_kind)
    for kwargs in ({"segment_length": 4}, {"offsets": [0, 4, 8]}):
        got = call("sum", x, backend=backend, dtype=forms[form], **kwargs)
        assert_same_kind(got, x)
        assert dtype_of(got) == "float64"
        np.testing.assert_array_equal(to_numpy(got), [2.0, 2.0])
        got = call("mean", x, backend=backend, dtype=forms[form], **kwargs)
        np.testing.assert_array_equal(to_numpy(got), [0.5, 0.5])


DTYPE_ARG = {
    # name: (input dtype, reduction, dtype=)
    "int32 -> float32 sum": ("int32", "sum", "float32"),
    "int16 -> float64 sum": ("int16", "sum", "float64"),
    "int32 -> int32 sum": ("int32", "sum", "int32"),
    "uint8 -> int64 sum": ("uint8", "sum", "int64"),
    "bool -> float32 sum": ("bool", "sum", "float32"),
    "float64 -> float32 sum": ("float64", "sum", "float32"),
    "float16 -> float32 sum": ("float16", "sum", "float32"),
    "float32 -> float16 sum": ("float32", "sum", "float16"),
    "float32 -> bfloat16 sum": ("float32", "sum", "bfloat16"),
    "complex64 -> complex128 sum": ("complex64", "sum", "complex128"),
    "int32 -> float32 mean": ("int32", "mean", "float32"),
    "float32 -> float64 mean": ("float32", "mean", "float64"),
    "float16 -> float64 mean": ("float16", "mean", "float64"),
    "float32 -> float64 max": ("float32", "max", "float64"),
    "int8 -> int64 min": ("int8", "min", "int64"),
    "int32 -> float64 max": ("int32", "max", "float64"),
}


@pytest.mark.parametrize("case", list(DTYPE_ARG))
@pytest.mark.parametrize("how", ["fixed", "offsets"])
def test_dtype_argument(array_kind, backend, case, how, rng):
    in_dtype, reduction, dtype = DTYPE_ARG[case]
    x_np = make_data(in_dtype, (24, 2), rng)
    x = to_kind(x_np, array_kind)
    kwargs = {"segment_length": 6} if how == "fixed" else {"offsets": OFFSETS_24}
    got = call(reduction, x, backend=backend, dtype=dtype, **kwargs)
    assert_reduction(got, reduction, x_np, segments=segment_bounds(24, **kwargs), dtype=dtype, like=x)


@pytest.mark.parametrize("how", ["fixed", "offsets"])
def test_dtype_of_max_and_min_converts_the_extreme(array_kind, backend, how):
    """A narrower or other-kind dtype= of max and min converts the extreme found in the input's
    dtype (as ``x.max().astype(dtype)``): an element the conversion wraps or truncates does not
    change which one is the extreme (documented in api.md and the functions' dtype)."""
    x_np = np.array([200, 100, 3, 300, -7, 1000], dtype=np.int64)
    kwargs = {"segment_length": 2} if how == "fixed" else {"offsets": np.array([0, 2, 4, 6])}
    x = to_kind(x_np, array_kind)
    for reduction, dtype in (("max", "int8"), ("min", "uint8"), ("max", "int16")):
        fn = np.max if reduction == "max" else np.min
        want = np.array([fn(x_np[a : a + 2]) for a in (0, 2, 4)]).astype(dtype)
        got = call(reduction, x, backend=backend, dtype=dtype, **kwargs)
        np.testing.assert_array_equal(to_numpy(got), want, err_msg=f"{reduction} {dtype}")
    f = to_kind(np.array([2.7, -1.5, 9.9, 3.2, -0.5, -0.7]), array_kind)
    got = call("max", f, backend=backend, dtype="int32", **kwargs)
    np.testing.assert_array_equal(to_numpy(got), [2, 9, 0])


@pytest.mark.parametrize(
    ("reduction", "in_dtype", "dtype", "match"),
    [
        ("mean", "int32", "int64", "segmented_mean cannot return integer dtype int64"),
        ("sum", "complex64", "float32", r"cannot reduce complex input \(complex64\) into real dtype float32"),
        ("sum", "float32", "bool", "dtype=bool is not a valid result dtype for segmented_sum"),
        ("max", "float32", "complex64", "segmented_max cannot return complex dtype complex64"),
    ],
)
def test_dtype_argument_refused(array_kind, reduction, in_dtype, dtype, match):
    x = to_kind(np.ones(4, dtype=in_dtype), array_kind)
    with pytest.raises(TypeError, match=match):
        FUNCTIONS[reduction](x, 2, dtype=dtype)


# ---------------------------------------------------------------------------
# out=, input left alone, check=False
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("how", ["fixed", "offsets"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
def test_out(array_kind, backend, reduction, how, dtype, rng):
    x_np = make_data(dtype, (24, 3), rng)
    x = to_kind(x_np, array_kind)
    kwargs = {"segment_length": 4} if how == "fixed" else {"offsets": OFFSETS_24}
    bounds = segment_bounds(24, **kwargs)
    out = empty_like_kind(array_kind, (len(bounds), 3), expected_dtype(reduction, dtype))
    got = call(reduction, x, backend=backend, out=out, **kwargs)
    assert got is out
    assert_reduction(got, reduction, x_np, segments=bounds, like=x)
    # a second call into the same out overwrites every element
    x2_np = make_data(dtype, (24, 3), rng)
    got = call(reduction, to_kind(x2_np, array_kind), backend=backend, out=out, **kwargs)
    assert got is out
    assert_reduction(got, reduction, x2_np, segments=bounds, like=x)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("how", ["fixed", "offsets", "lengths"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "int32", "bool"])
def test_input_unmodified(array_kind, backend, reduction, how, dtype, rng):
    x_np = make_data(dtype, (24, 2), rng)
    x = to_kind(x_np, array_kind)[::2]  # strided, so no backend may compact it in place
    kwargs = {"segment_length": 3} if how == "fixed" else {}
    offsets = to_kind(np.array([0, 0, 5, 12, 12]), array_kind)
    lengths = to_kind(np.array([0, 5, 7, 0]), array_kind)
    if how == "offsets":
        kwargs = {"offsets": offsets}
    elif how == "lengths":
        kwargs = {"lengths": lengths}
    call(reduction, x, backend=backend, **kwargs)
    np.testing.assert_array_equal(to_numpy(x), x_np[::2], strict=True)
    np.testing.assert_array_equal(to_numpy(offsets), [0, 0, 5, 12, 12])
    np.testing.assert_array_equal(to_numpy(lengths), [0, 5, 7, 0])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("spec_name", ["offsets-list", "offsets-kind", "offsets-kind-int64", "lengths-kind"])
def test_check_false_gives_the_same_result(array_kind, backend, reduction, spec_name, rng):
    x_np = make_data("float32", (24, 2), rng)
    x = to_kind(x_np, array_kind)
    kwargs, bounds = spec(spec_name, 24, array_kind)
    checked = call(reduction, x, backend=backend, **kwargs)
    unchecked = call(reduction, x, backend=backend, check=False, **kwargs)
    assert_reduction(unchecked, reduction, x_np, segments=bounds, like=x)
    np.testing.assert_array_equal(to_numpy(unchecked), to_numpy(checked))


# ---------------------------------------------------------------------------
# torch tensors with autograd or lazy conjugation
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("how", ["fixed", "offsets"])
def test_torch_requires_grad(array_kind, backend, how):
    """A tensor that requires grad is reduced (linred does not record autograd history)."""
    if not array_kind.startswith("torch"):
        pytest.skip("torch only")
    x = to_kind(np.arange(1, 13, dtype=np.float32), array_kind).requires_grad_(True)
    kwargs = {"segment_length": 4} if how == "fixed" else {"offsets": [0, 4, 8, 12]}
    got = call("sum", x, backend=backend, **kwargs)
    np.testing.assert_array_equal(to_numpy(got), [10, 26, 42])


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_torch_lazy_conjugate(array_kind, backend):
    """A lazily conjugated tensor is summed as what it represents, or refused with a clear error."""
    if not array_kind.startswith("torch"):
        pytest.skip("torch only")
    x = to_kind(np.array([1 + 1j, 2 + 2j, 3 - 1j, 4j], dtype=np.complex64), array_kind).conj()
    assert x.is_conj()
    try:
        got = call("sum", x, backend=backend, segment_length=2)
    except (TypeError, ValueError) as e:
        assert "conj" in str(e)
        return
    np.testing.assert_array_equal(to_numpy(got), np.array([3 - 3j, 3 - 3j], dtype=np.complex64))


def test_result_is_fresh(array_kind, backend):
    """The result never aliases the input (summing segments of length 1 included)."""
    x_np = np.arange(6, dtype=np.float32)
    x = to_kind(x_np, array_kind)
    got = call("sum", x, backend=backend, segment_length=1)
    np.testing.assert_array_equal(to_numpy(got), x_np)
    xp = xp_of(array_kind) if not array_kind.startswith("torch") else None
    if xp is not None:
        assert not xp.shares_memory(got, x) if xp is np else got.data.ptr != x.data.ptr
    else:
        assert got.data_ptr() != x.data_ptr()
    got[...] = 0
    np.testing.assert_array_equal(to_numpy(x), x_np)
