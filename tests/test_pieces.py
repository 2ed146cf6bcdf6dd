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
from support.arrays import FakeDeviceAdapter

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


def test_what_the_pieces_serve(monkeypatch) -> None:
    """(No GPU needed.) var and std only, the kernel's own conditions (a bool check, real data, no
    gradient, one segment argument), rows longer than a piece; calls the kernel serves stay with
    it unless each lane of its workers would read more than LONG_LANE_VALUES values; no
    segments (an empty offsets array), rows, features or batch: not taken."""
    from linred.backends import nvrtc

    def shaped(*shape):
        return type("X", (), {"shape": shape, "dtype": np.dtype(np.float32)})()

    monkeypatch.setattr(linred.backends, "unavailable", lambda name: None)
    monkeypatch.setattr(nvrtc, "_compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(_softmax_kernel, "multiprocessors", lambda device: 132)
    monkeypatch.setattr(_pieces, "multiprocessors", lambda device: 132)

    def serves(x, segments, name="segmented_var", check=True, grad=False, in_name="float32", axis=0):
        return _pieces.serves(name, x, FakeDeviceAdapter(), in_name, in_name, segments, "auto", grad, check, axis)

    rows = _softmax_kernel.MAX_MEAN_ROWS
    long_ = shaped(4 * (rows + 1))
    assert serves(long_, {"segment_length": rows + 1}) and serves(long_, {"offsets": [0, 5, 4 * (rows + 1)]})
    assert serves(long_, {"lengths": [4 * (rows + 1)]}) and serves(long_, {}, name="segmented_std") is False
    assert serves(long_, {"offsets": [0, 4 * (rows + 1)]}, name="segmented_std")
    for name in ("segmented_logsumexp", "segmented_softmax", "segmented_log_softmax"):
        assert not serves(long_, {"offsets": [0, 4 * (rows + 1)]}, name=name)
    assert not serves(long_, {"offsets": [0, 4 * (rows + 1)]}, check=None)
    assert not serves(long_, {"offsets": [0, 4 * (rows + 1)]}, grad=True)
    assert not serves(long_, {"offsets": [0, 4 * (rows + 1)]}, in_name="int64")
    assert not serves(long_, {"offsets": [0, 4 * (rows + 1)], "segment_length": 3})
    assert not serves(long_, {"segment_ids": [0] * (4 * (rows + 1))})
    assert not serves(long_, {"offsets": []}) and not serves(shaped(0), {"offsets": [0]})
    assert not serves(shaped(3, 0), {"offsets": [0, 3]}) and not serves(shaped(0, 300_000), {"offsets": [0, 300_000]},
                                                                        axis=1)  # fmt: skip
    # many short segments: the kernel's (a warp of 16 values a lane)
    assert not serves(shaped(1 << 20), {"segment_length": 512})
    # a thread per feature of 64 reading 16,384 rows: more than LONG_LANE_VALUES a lane, pieces
    x = shaped(64 * rows, 64)
    assert _softmax_kernel.serves("segmented_var", x, FakeDeviceAdapter(), "float32", "float32",
                                  {"segment_length": rows}, "auto", False, True)  # fmt: skip
    assert serves(x, {"segment_length": rows})
    monkeypatch.setattr(_pieces, "LONG_LANE_VALUES", rows)
    assert not serves(x, {"segment_length": rows})
    monkeypatch.setattr(_pieces, "ENABLED", False)
    assert not serves(long_, {"segment_length": rows + 1})


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


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize(
    "dtype, result",
    [("float32", None), ("float32", "float64"), ("float16", None), ("float16", "float32"), ("bfloat16", None),
     ("float64", None)],
)  # fmt: skip
def test_gpu_longest_pieces_and_dtypes(monkeypatch, kind, dtype, result) -> None:
    """Pieces at their longest (4,096 rows of one feature: the GPU's fill not asked for), so
    16-bit data is read two rows a load where aligned; float32 data with a float64 result (the
    two-pass moments) and float16 with a float32 one (one pass, a wider result); a NaN and an
    infinity in two segments; against float64."""
    if kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16")
    calls = _taken(monkeypatch)
    monkeypatch.setattr(_pieces, "WORKERS_PER_SM", 0)
    # (6 segments of 3,414 rows on average: too long; 10 pieces of 2,048: not)
    monkeypatch.setattr(_softmax_kernel, "MAX_MEAN_ROWS", 3000)
    rng = np.random.default_rng(len(dtype) + (result is not None))
    n = 5 * 4096 + 3
    base = rng.standard_normal(n) * 2 + 30
    base[100] = np.nan
    base[3 * 4096 + 7] = np.inf
    offsets = np.array([0, 4095, 4096, 2 * 4096 + 1, 3 * 4096, 4 * 4096 - 1, n])
    x = _device_array(kind, base, dtype)
    host = to_numpy(x.float() if dtype == "bfloat16" else x).astype(np.float64)
    kw = {} if result is None else {"dtype": result}
    got = linred.segmented_std(x, offsets=offsets, ddof=1, **kw)
    want = _reference(host, offsets, 0, 1, True)
    out = to_numpy(got.float() if dtype == "bfloat16" else got).astype(np.float64)
    assert str(got.dtype).removeprefix("torch.") == (result or dtype)
    wide = 1e-12 if dtype == "float64" else 1e-9  # (float32 data, a float64 result)
    tolerance = TOLERANCE[result or dtype] if (result or dtype) != "float64" else wide
    np.testing.assert_allclose(out, want, rtol=tolerance, equal_nan=True)
    assert calls == ["segmented_std"]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_float64_sums_that_overflow(monkeypatch, kind) -> None:
    """float64 segments whose sum overflows: the composition's mean is infinite and so is its var
    (the pieces' own means are finite, or infinite for a piece whose sum overflows); a segment
    holding an infinity: NaN.  The same results through the composition."""
    calls = _taken(monkeypatch)
    monkeypatch.setattr(_softmax_kernel, "MAX_MEAN_ROWS", 1024)
    n = 32768
    cases = {
        "finite pieces": np.full(n, 2.0**1010),
        "an overflowing piece": np.concatenate([np.full(64, 1e308), np.zeros(n - 64)]),
        "an infinity": np.concatenate([np.full(64, 1e300), [np.inf], np.zeros(n - 65)]),
    }
    want = {"finite pieces": np.inf, "an overflowing piece": np.inf, "an infinity": np.nan}
    for label, values in cases.items():
        x = _device_array(kind, values, "float64")
        got = to_numpy(linred.segmented_var(x, offsets=np.array([0, n])))
        monkeypatch.setattr(_pieces, "ENABLED", False)
        composed = to_numpy(linred.segmented_var(x, offsets=np.array([0, n])))
        monkeypatch.setattr(_pieces, "ENABLED", True)
        np.testing.assert_array_equal(got, [want[label]], err_msg=label)
        np.testing.assert_array_equal(composed, [want[label]], err_msg=label)
    assert calls == ["segmented_var"] * 3


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_a_named_stream_and_broken_unchecked_offsets(monkeypatch, kind) -> None:
    """On a stream the call names (its results the same as on the current one); unchecked
    offsets that decrease or leave the data: a result of the right shape, and the next call right
    (the pieces stay inside the data)."""
    calls = _taken(monkeypatch)
    monkeypatch.setattr(_softmax_kernel, "MAX_MEAN_ROWS", 1024)
    n = 20_000
    base = np.random.default_rng(5).standard_normal(n) + 3
    x = _device_array(kind, base, "float32")
    offsets = np.array([0, 7000, 7000, 15_000, n])
    want = to_numpy(linred.segmented_var(x, offsets=offsets))
    stream = torch.cuda.Stream() if kind == "torch" else cupy.cuda.Stream(non_blocking=True)
    got = linred.segmented_var(x, offsets=offsets, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(to_numpy(got), want)
    for broken in ([0, 9000, 100, 15_000, n], [0, -50, 30_000, 5, n], [5, 2, 1, 0, 0]):
        got = linred.segmented_var(x, offsets=np.array(broken), check=False)
        assert tuple(got.shape) == (4,)
    np.testing.assert_allclose(to_numpy(linred.segmented_var(x, offsets=offsets)), want, rtol=0)
    np.testing.assert_allclose(want, _reference(base.astype(np.float32), offsets, 0, 0, False), rtol=2e-6)
    assert calls == ["segmented_var"] * 6
