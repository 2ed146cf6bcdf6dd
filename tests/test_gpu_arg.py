"""segmented_argmax / argmin on the GPU through linred._arg_kernel, and the gradient of max and min
of CUDA tensors that uses it, against positions found by NumPy segment by segment.

The kernel walks tiles of ARG_ROWS rows with ARG_LOADS loads in flight, over (row of the batch,
tile, feature) threads in a grid-stride loop: the shapes cross each of those at k*T - 1, k*T and
k*T + 1, with empty segments (first, inside, last), segments that start and end inside a tile and
segments longer than several tiles, ties (small integers), NaN and infinities.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support import HAS_CUPY_GPU, HAS_TORCH_CUDA, to_kind, to_numpy
from support.dtypes import np_dtype

import linred
from linred import _arg_kernel
from linred.kernels.launch import multiprocessors

pytestmark = pytest.mark.gpu

KINDS = [
    pytest.param("cupy", marks=pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy and a GPU")),
    pytest.param("torch-cuda", marks=pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs PyTorch with CUDA")),
]
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
          "float32", "float64"]  # fmt: skip
T = _arg_kernel.ARG_ROWS


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Small integers (many ties); for floats also NaN, +inf and -inf here and there."""
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    a = rng.integers(0, 5, shape).astype(np.float64)
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        flat = a.reshape(-1)
        k = max(1, flat.size // 40)
        flat[rng.integers(0, flat.size, k)] = np.nan
        flat[rng.integers(0, flat.size, k)] = np.inf
        flat[rng.integers(0, flat.size, k)] = -np.inf
    return a.astype(np_dtype(dtype))


def _offsets(rng: np.random.Generator, n: int) -> np.ndarray:
    """Cuts at random rows and at tile edges, with empty segments first, inside and last."""
    cuts = set(rng.integers(0, n + 1, max(1, n // 20)).tolist())
    cuts |= {c for k in range(1, n // T + 1) for c in (k * T - 1, k * T, k * T + 1) if 0 < c < n and rng.random() < 0.5}
    inner = sorted(cuts - {0, n})
    middle = [inner[len(inner) // 2]] if inner else []  # (a cut twice: an empty segment inside)
    return np.array(sorted([0, 0, *inner, *middle, n, n]))


def _expected(which: str, x: np.ndarray, offsets: np.ndarray, axis: int) -> np.ndarray:
    """The first position of each segment's extreme along ``axis`` (n where a segment is empty)."""
    pick = np.argmax if which == "argmax" else np.argmin
    moved = np.moveaxis(x.astype(np.float64) if x.dtype.kind == "V" or x.dtype.name == "bfloat16" else x, axis, -1)
    n = moved.shape[-1]
    out = np.empty((*moved.shape[:-1], len(offsets) - 1), dtype=np.int64)
    for s, (a, b) in enumerate(itertools.pairwise(offsets)):
        out[..., s] = n if a == b else a + pick(moved[..., a:b], axis=-1)
    return np.moveaxis(out, -1, axis)


CASES = [
    # (shape, axis): 1-D across the tile and load edges, rows of features across a warp, a batch
    *[((n,), 0) for n in (1, 7, 8, 9, T - 1, T, T + 1, 2 * T - 1, 2 * T, 2 * T + 1, 8 * T + 1)],
    *[((n, d), 0) for n, d in ((T - 1, 3), (T + 1, 1), (2 * T, 31), (3 * T + 1, 32), (T + 1, 33), (5 * T - 1, 64))],
    ((3, 2 * T + 1, 5), 1),
    ((4, 3 * T - 1), 1),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["argmax", "argmin"])
def test_arg_kernel_positions(kind, dtype, which):
    rng = np.random.default_rng(DTYPES.index(dtype))
    fn = getattr(linred, f"segmented_{which}")
    for shape, axis in CASES:
        x = _values(rng, shape, dtype)
        n = shape[axis]
        offsets = _offsets(rng, n)
        xs = to_kind(x, kind)
        assert _arg_kernel.serves(_adapter(xs), xs, dtype, "auto")
        for spec, given in (("offsets", offsets), ("lengths", np.diff(offsets))):
            for index_dtype in (np.int32, np.int64):
                got = to_numpy(fn(xs, axis=axis, **{spec: to_kind(given.astype(index_dtype), kind)}))
                np.testing.assert_array_equal(got, _expected(which, x, offsets, axis), err_msg=f"{shape} {spec}")
        for length in sorted({1, 3, 8, T, T + 1, n}):
            if length > n:
                continue
            m = n // length
            given_x = to_kind(np.take(x, np.arange(m * length), axis=axis), kind)
            got = to_numpy(fn(given_x, length, axis=axis))
            expected = _expected(which, np.take(x, np.arange(m * length), axis=axis), np.arange(m + 1) * length, axis)
            np.testing.assert_array_equal(got, expected, err_msg=f"{shape} length {length}")


@pytest.mark.parametrize("kind", KINDS)
def test_arg_kernel_grid_stride_and_one_long_segment(kind):
    """More items than the grid's threads (the grid-stride loop), segments of thousands of tiles,
    and the extreme in the last row of a long segment."""
    assert _arg_kernel.ARG_ROWS == T
    rng = np.random.default_rng(5)
    d = 64
    threads = _arg_kernel.BLOCKS_PER_SM * multiprocessors(0) * _arg_kernel.THREADS
    n = -(-threads * 3 // 2 // d) * T  # tiles x features: half as many again as the grid's threads
    x = rng.standard_normal((n, d)).astype(np.float32)
    offsets = np.array([0, 3, 70_000, 70_000, 100_001, n])
    x[69_999, 5] = 100.0  # the last row of segment 1
    xs = to_kind(x, kind)
    got = to_numpy(linred.segmented_argmax(xs, offsets=to_kind(offsets, kind)))
    np.testing.assert_array_equal(got, _expected("argmax", x, offsets, 0))
    assert got[1, 5] == 69_999


@pytest.mark.parametrize("kind", KINDS)
def test_arg_kernel_matches_the_composition(kind, monkeypatch):
    """The same positions as the array-operation composition it replaces."""
    rng = np.random.default_rng(9)
    x = _values(rng, (1000, 12), "float32")
    offsets = _offsets(rng, 1000)
    xs, off = to_kind(x, kind), to_kind(offsets, kind)
    fast = to_numpy(linred.segmented_argmin(xs, offsets=off))
    monkeypatch.setattr(_arg_kernel, "serves", lambda *a: False)
    np.testing.assert_array_equal(fast, to_numpy(linred.segmented_argmin(xs, offsets=off)))


@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs PyTorch with CUDA")
@pytest.mark.parametrize("which", ["max", "min"])
@pytest.mark.parametrize(("shape", "axis"), [((3 * T + 1, 5), 0), ((T + 1,), 0), ((4, 2 * T - 1, 3), 1)])
@pytest.mark.parametrize("spec", ["offsets", "lengths", "fixed"])
def test_cuda_max_min_backward_goes_to_the_first_extreme(which, shape, axis, spec, monkeypatch):
    """Each segment's gradient goes to the first position of its extreme (ties: small integers),
    nothing from an empty segment; the kernel finds the positions."""
    import torch

    calls = []
    kernel = _arg_kernel.first_hit
    monkeypatch.setattr(_arg_kernel, "first_hit", lambda *a: calls.append(1) or kernel(*a))

    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, shape).astype(np.float64)
    n = shape[axis]
    offsets = _offsets(rng, n) if spec != "fixed" else np.arange(n // 3 + 1) * 3
    if spec == "fixed":
        x = np.take(x, np.arange(offsets[-1]), axis=axis)
    xt = torch.tensor(x, device="cuda", requires_grad=True)
    if spec == "fixed":
        result = getattr(linred, f"segmented_{which}")(xt, 3, axis=axis)
    else:
        given = offsets if spec == "offsets" else np.diff(offsets)
        result = getattr(linred, f"segmented_{which}")(xt, axis=axis, **{spec: torch.as_tensor(given, device="cuda")})
    g = torch.rand_like(result)
    result.backward(g)
    first = _expected(f"arg{which}", x, offsets, axis)
    expected = np.zeros(x.shape)
    moved_e, moved_f, moved_g = np.moveaxis(expected, axis, -1), np.moveaxis(first, axis, -1), np.moveaxis(
        g.cpu().numpy(), axis, -1)  # fmt: skip
    for idx in np.ndindex(moved_f.shape):
        if moved_f[idx] < x.shape[axis]:
            moved_e[(*idx[:-1], moved_f[idx])] += moved_g[idx]
    np.testing.assert_array_equal(xt.grad.cpu().numpy(), expected)
    assert calls == [1]


@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs PyTorch with CUDA")
def test_arg_reduction_inside_torch_compile_traces_the_composition():
    """Inside torch.compile(fullgraph=True) the kernel is not called (its launch cannot be traced):
    the composition of torch operations is, with the same positions."""
    import torch

    rng = np.random.default_rng(4)
    x = torch.tensor(rng.integers(0, 5, (300, 6)).astype(np.float32), device="cuda")
    ptr = torch.tensor(_offsets(rng, 300), device="cuda")
    eager = linred.segmented_argmax(x, offsets=ptr)
    compiled = torch.compile(lambda t, p: linred.segmented_argmax(t, offsets=p), fullgraph=True)
    torch.testing.assert_close(compiled(x, ptr), eager)


def _adapter(x):
    from linred.arrays import as_array

    return as_array(x)[1]
