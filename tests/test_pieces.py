"""var and std of long segments from the moments of their pieces (linred._pieces).

On the CPU: the merged bounds (the segments' and the multiples of the piece length) against a
sorted concatenation, for bounds at k * P - 1, k * P and k * P + 1, empty segments and lengths
that are and are not multiples of P; and the join of the pieces' moments, with the kernel's
moments computed here in float64 NumPy, against a float64 reference of every segment's
variance (NaN, infinities, empty segments, ddof past a segment's length, a batch and features).
On the GPU (``gpu``): CuPy arrays and CUDA tensors through the public functions, every dtype the
kernel reads, every segment specification, segments of lengths around the piece length, the
route asserted taken, against float64 NumPy; and checked calls' errors.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from support import HAS_CUPY_GPU, HAS_TORCH_CUDA, to_numpy

import linred
from linred import _pieces, _softmax_kernel
from linred.arrays import adapter_for

if HAS_TORCH_CUDA:
    import torch
if HAS_CUPY_GPU:
    import cupy


def _bounds(rng: np.random.Generator, n: int, m: int, rows: int) -> np.ndarray:
    """m + 1 sorted offsets from 0 to n, many of them at k * rows - 1, k * rows, k * rows + 1."""
    near = [k * rows + e for k in range(1, n // rows + 1) for e in (-1, 0, 1)]
    pool = np.array([v for v in near if 0 <= v <= n] + list(rng.integers(0, n + 1, size=m)), dtype=np.int64)
    inner = np.sort(rng.choice(pool, size=m - 1, replace=True))
    return np.concatenate([[0], inner, [n]]).astype(np.int64)


def merge_reference(offsets: np.ndarray, n: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """linred_pieces_bounds in NumPy: the bounds and the multiples of ``rows`` inside (0, n) in
    one sorted list (a bound equal to a multiple first), and where each bound lies in it."""
    inner = -(-n // rows) - 1
    grid = np.arange(1, inner + 1, dtype=np.int64) * rows
    places = np.clip((offsets + rows - 1) // rows - 1, 0, inner) + np.arange(len(offsets))
    merged = np.empty(len(offsets) + inner, dtype=np.int64)
    merged[places] = offsets
    merged[np.searchsorted(offsets, grid, side="right") + np.arange(inner)] = grid
    return merged, places


@pytest.mark.parametrize("n", [1, 7, 8, 9, 31, 32, 33, 100])
@pytest.mark.parametrize("m", [1, 2, 5, 17])
def test_merged_bounds(n: int, m: int) -> None:
    """The reference of the bounds kernel: the sorted concatenation, every segment's pieces
    inside it and inside one stretch of ``rows``."""
    rows = 8
    rng = np.random.default_rng(n * 100 + m)
    for _ in range(5):
        offsets = _bounds(rng, n, m, rows)
        merged, places = merge_reference(offsets, n, rows)
        grid = np.arange(1, -(-n // rows)) * rows
        np.testing.assert_array_equal(merged, np.sort(np.concatenate([offsets, grid])))
        np.testing.assert_array_equal(merged[places], offsets)
        assert (np.diff(places) >= 1).all()
        for s in range(m):
            pieces = merged[places[s] : places[s + 1] + 1]
            assert pieces[0] == offsets[s] and pieces[-1] == offsets[s + 1]
            for a, b in itertools.pairwise(pieces):
                assert b - a <= rows and (b == a or (a // rows) == ((b - 1) // rows))


def _reference(x: np.ndarray, offsets: np.ndarray, axis: int, ddof: float, root: bool) -> np.ndarray:
    v = np.moveaxis(x.astype(np.float64), axis, 0)
    rows = []
    with np.errstate(invalid="ignore"):
        for lo, hi in itertools.pairwise(offsets):
            seg = v[lo:hi]
            if hi - lo <= ddof:
                rows.append(np.full(v.shape[1:], math.nan))
                continue
            mean = seg.mean(axis=0)
            var = ((seg - mean) ** 2).sum(axis=0) / (hi - lo - ddof)
            rows.append(np.sqrt(var) if root else var)
    return np.moveaxis(np.stack(rows), 0, axis)


# --- on the GPU, through the public functions ---

GPU_KINDS = [
    pytest.param("cupy", marks=pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy and a GPU")),
    pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs PyTorch with CUDA")),
]
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 2e-6, "float64": 1e-12}


def _device_array(kind: str, a: np.ndarray, dtype: str):
    if kind == "torch":
        t = torch.from_numpy(a.astype(np.float32 if dtype == "bfloat16" else dtype)).cuda()
        return t.to(torch.bfloat16) if dtype == "bfloat16" else t
    return cupy.asarray(a.astype(dtype))


def _taken(monkeypatch) -> list:
    calls = []
    real = _pieces.run
    monkeypatch.setattr(_pieces, "run", lambda *a: calls.append(a[0]) or real(*a))
    return calls


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("spec", ["fixed", "offsets", "offsets32", "lengths"])
@pytest.mark.parametrize("features", [1, 3, 8, 64])
def test_gpu_long_segments(monkeypatch, kind, dtype, spec, features) -> None:
    if kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16")
    calls = _taken(monkeypatch)
    # (segments too long on average for the kernel's workers: 7,000 rows against 1,024)
    monkeypatch.setattr(_softmax_kernel, "MAX_MEAN_ROWS", 1024)
    rng = np.random.default_rng(features + len(spec) + len(dtype))
    rows = 4096
    # segments that end at k * P - 1, k * P and k * P + 1 for the longest pieces, and long ones
    n = 49153 if spec != "fixed" else 2 * 16385
    shape = (n,) if features == 1 else (n, features)
    base = rng.standard_normal(shape) * 2 + (50 if dtype in ("float16", "bfloat16") else 1e4)
    x = _device_array(kind, base, dtype)
    host = to_numpy(x.float() if kind == "torch" and dtype == "bfloat16" else x).astype(np.float64)
    if spec == "fixed":
        kw, offsets = {"segment_length": n // 2}, np.array([0, n // 2, n], dtype=np.int64)
    else:
        inner = [rows - 1, 2 * rows, 2 * rows, 3 * rows + 1, 3 * rows + 2, n - 1]
        offsets = np.array([0, *inner, n], dtype=np.int64)
        if spec == "offsets":
            kw = {"offsets": offsets}
        elif spec == "offsets32":
            kw = {"offsets": offsets.astype(np.int32)}
        else:
            kw = {"lengths": np.diff(offsets)}
    for name, ddof in (("var", 0), ("std", 1)):
        got = getattr(linred, f"segmented_{name}")(x, ddof=ddof, **kw)
        assert type(got) is type(x) and got.shape == (len(offsets) - 1, *shape[1:])
        want = _reference(host, offsets, 0, ddof, name == "std")
        np.testing.assert_allclose(to_numpy(got.float() if dtype == "bfloat16" else got).astype(np.float64), want,
                                   rtol=TOLERANCE[dtype], atol=0, equal_nan=True)  # fmt: skip
    assert calls == ["segmented_var", "segmented_std"]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("n_rows", [4095, 4096, 4097, 2 * 4096 + 1, 1 << 20])
def test_gpu_one_long_segment_in_a_batch(monkeypatch, kind, n_rows) -> None:
    """One segment of every row of a batch (axis 1), non-finite values in some rows, against
    float64; with the first value an outlier (what the one-pass sums are most sensitive to)."""
    calls = _taken(monkeypatch)
    monkeypatch.setattr(_softmax_kernel, "MAX_MEAN_ROWS", 1024)  # (so that short rows take the route too)
    rng = np.random.default_rng(n_rows)
    base = rng.standard_normal((3, n_rows)).astype(np.float32) + 7
    base[0, 0] = 3e4  # an outlier first
    base[1, n_rows // 2] = np.nan
    base[2, -1] = np.inf
    x = _device_array(kind, base, "float32")
    got = linred.segmented_var(x, n_rows, axis=1)
    want = _reference(base, np.array([0, n_rows]), 1, 0, False)
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), want, rtol=2e-6, equal_nan=True)
    assert calls == ["segmented_var"]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_checked_offsets(monkeypatch, kind) -> None:
    calls = _taken(monkeypatch)
    n = 4 * _softmax_kernel.MAX_MEAN_ROWS
    x = _device_array(kind, np.ones(n), "float32")
    for bad, message in (([0, 10, 5, n], "offsets"), ([0, 10, n - 1], "offsets"), ([3, n], "offsets")):
        with pytest.raises(ValueError, match=message):
            linred.segmented_var(x, offsets=np.array(bad))
    with pytest.raises(ValueError, match="lengths"):
        linred.segmented_std(x, lengths=np.array([5, n]))
    assert calls == ["segmented_var"] * 3 + ["segmented_std"]
    np.testing.assert_array_equal(to_numpy(linred.segmented_var(x, offsets=np.array([0, 5, n]))), [0, 0])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("index", [None, "int32", "int64"])
@pytest.mark.parametrize("n, rows", [(1, 256), (255, 256), (256, 256), (257, 256), (4097, 4096), (100_000, 256)])
def test_gpu_bounds_kernel(kind, index, n, rows) -> None:
    """linred_pieces_bounds against merge_reference: fixed lengths and offsets of both dtypes,
    bounds at k * rows - 1, k * rows and k * rows + 1, empty segments."""
    rng = np.random.default_rng(n + rows)
    for m in (1, 2, 9, 300):
        if index is None:
            length = max(1, n // m)
            if n % length:
                continue
            offsets = np.arange(0, n + 1, length, dtype=np.int64)
        else:
            offsets = _bounds(rng, n, m, rows)
        d = _device_array(kind, offsets, index or "int64")
        adapter = adapter_for(d)
        bounds, *_ = _pieces._launches(0, None if index is None else d.dtype, "float32", False)
        inner = -(-n // rows) - 1
        k = len(offsets) - 1
        merged, places = adapter.allocator("int64", 0)((k + 1 + inner,)), adapter.allocator("int64", 0)((k + 1,))
        stream = adapter.resolve_stream(None, 0)
        bounds(stream, 4, 256, 0, 0 if index is None else adapter.pointer(d), length if index is None else 0, n, k,
               rows, inner, adapter.pointer(merged), adapter.pointer(places))  # fmt: skip
        want_merged, want_places = merge_reference(offsets, n, rows)
        np.testing.assert_array_equal(to_numpy(merged), want_merged)
        np.testing.assert_array_equal(to_numpy(places), want_places)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("ddof", [0, 1, 5000])
@pytest.mark.parametrize("join", ["warp", "block"])
def test_gpu_batch_features_and_ddof(monkeypatch, kind, ddof, join) -> None:
    """A batch of two rows and three features (axis 1 of 3-D data), segments of 0, 1, 4,999 and
    5,000 rows and long ones, NaN and infinities in some (row, feature) columns, the pieces joined
    by a warp or by a block a segment; the same bits on a second call."""
    calls = _taken(monkeypatch)
    monkeypatch.setattr(_softmax_kernel, "MAX_MEAN_ROWS", 1024)
    monkeypatch.setattr(_pieces, "BLOCK_JOIN_PIECES", 10**9 if join == "warp" else 0)
    rng = np.random.default_rng(ddof)
    n = 60_000
    base = rng.standard_normal((2, n, 3)) * 5 + 300
    base[0, 7, 1] = np.nan
    base[1, 40_000, 2] = -np.inf
    offsets = np.array([0, 0, 1, 5000, 10_000, 10_000, 14_999, n])
    x = _device_array(kind, base, "float32")
    got = linred.segmented_var(x, offsets=offsets, axis=1, ddof=ddof)
    again = linred.segmented_var(x, offsets=offsets, axis=1, ddof=ddof)
    want = _reference(base.astype(np.float32), offsets, 1, ddof, False)
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), want, rtol=2e-6, equal_nan=True)
    np.testing.assert_array_equal(to_numpy(got), to_numpy(again))
    assert calls == ["segmented_var"] * 2
