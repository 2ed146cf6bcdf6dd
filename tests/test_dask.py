"""Dask arrays: lazy, chunk-wise reductions (linred.dask), against the single-array call and the float64 reference."""

from __future__ import annotations

import doctest
import itertools
import os
import re
import subprocess
import sys
import textwrap
import threading
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import HAS_CUPY_GPU, assert_reduction, error_bound, expected_dtype, reference, segment_bounds

import linred

da = pytest.importorskip("dask.array")
import linred.dask as ldask  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VALUE_REDUCTIONS = ["sum", "mean", "max", "min"]
ARG_REDUCTIONS = ["argmax", "argmin"]
REDUCTIONS = VALUE_REDUCTIONS + ARG_REDUCTIONS + (["prod"] if hasattr(linred, "segmented_prod") else [])
METHODS = ["auto", "carry", "rechunk"]
SPECS = ["fixed", "offsets", "lengths", "keep", "drop"]
#: (ndim, axis) of the data
LAYOUTS = [(1, 0), (2, 0), (2, -1), (3, 1)]
DTYPES = ["float32", "float64", "int64", "float16"]


# --- data: random chunkings, segments across 3+ chunks, empty segments at edges and ends ---


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, reduction: str = "") -> np.ndarray:
    if reduction == "prod":  # (products of long segments stay in range)
        values = rng.choice([-1, 1, 2], size=shape) if dtype.startswith("int") else rng.uniform(0.7, 1.3, shape)
        return values.astype(dtype)
    if dtype.startswith(("int", "uint")):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    if x.size > 3:
        x.flat[rng.integers(0, x.size)] = np.nan  # a NaN in one segment (its max/min/argmax is the NaN)
    return x


def _chunks(rng: np.random.Generator, n: int, k: int) -> tuple[int, ...]:
    """``k`` chunks summing to ``n``, some of them empty."""
    cuts = np.sort(rng.integers(0, n + 1, size=k - 1))
    if k > 3:
        cuts[rng.integers(0, k - 1)] = cuts[rng.integers(0, k - 1)]  # a zero-size chunk, most of the time
        cuts = np.sort(cuts)
    return tuple(int(c) for c in np.diff(np.concatenate([[0], cuts, [n]])))


def _offsets(rng: np.random.Generator, n: int, chunks: tuple[int, ...]) -> np.ndarray:
    """Offsets with short and empty segments, empty ones at chunk edges and at both ends, segment
    edges on some chunk edges, and one segment that spans three chunks or more."""
    bounds = np.cumsum((0, *chunks))
    points = set(rng.integers(1, max(n, 2), size=max(1, n // 4)).tolist()) | set(rng.choice(bounds, 3).tolist())
    nonempty = np.flatnonzero(np.asarray(chunks) > 0)
    if len(nonempty) >= 4:  # from inside one chunk to inside the fourth chunk after it
        lo, hi = bounds[nonempty[0]] + chunks[nonempty[0]] // 2, bounds[nonempty[3]] + chunks[nonempty[3]] // 2
        points = {p for p in points if not lo < p < hi} | {lo, hi}
    offsets = sorted(p for p in points if 0 < p < n)
    edges = [int(b) for b in bounds[1:-1] if 0 < b < n]
    offsets += [int(rng.choice(edges))] * 2 if edges else []  # empty segments on a chunk edge
    return np.array(sorted([0, 0, *offsets, n, n]), dtype=np.int64)  # and at both ends


def make_case(seed: int, ndim: int, axis: int, dtype: str, spec: str, k: int = 7, reduction: str = "") -> tuple:
    """``(x, dx, kwargs, segments)``: NumPy data, the same as a Dask array, the segment arguments
    and the segments' bounds."""
    rng = np.random.default_rng(seed)
    ax = axis % ndim
    L = int(rng.choice([1, 3, 24]))  # many segments per chunk, and segments across three chunks
    m = int(rng.integers(2, 5)) if L == 24 else int(rng.integers(15, 30))
    n = L * m + (int(rng.integers(1, L)) if spec in ("keep", "drop") and L > 1 else 0)
    if spec in ("keep", "drop") and L == 1:
        L, n = 4, 4 * m + 3
    shape = [int(rng.integers(2, 4)) for _ in range(ndim)]
    shape[ax] = n
    x = _data(rng, tuple(shape), dtype, reduction)
    chunks = [(s,) if i != ax else _chunks(rng, n, k) for i, s in enumerate(shape)]
    if ndim > 1:  # the other axes chunked too
        other = (ax + 1) % ndim
        chunks[other] = (1, shape[other] - 1)
    dx = da.from_array(x, chunks=tuple(chunks))
    if spec == "fixed":
        return x, dx, {"segment_length": L}, segment_bounds(n, segment_length=L)
    if spec == "drop":
        return x, dx, {"segment_length": L, "remainder": "drop"}, segment_bounds(n - n % L, segment_length=L)
    if spec == "keep":
        lengths = [L] * (n // L) + [n % L]
        return x, dx, {"segment_length": L, "remainder": "keep"}, segment_bounds(n, lengths=lengths)
    offsets = _offsets(rng, n, chunks[ax])
    if spec == "offsets":
        return x, dx, {"offsets": offsets}, segment_bounds(n, offsets=offsets)
    return x, dx, {"lengths": np.diff(offsets)}, segment_bounds(n, offsets=offsets)


def arg_reference(reduction: str, x: np.ndarray, segments: list[tuple[int, int]], axis: int) -> np.ndarray:
    """Positions of the first maximum (minimum; the first NaN) of each segment, ``n`` for an empty one."""
    xm = np.moveaxis(np.asarray(x), axis, 0)
    n, rest = xm.shape[0], xm.shape[1:]
    pick = np.argmax if reduction == "argmax" else np.argmin
    rows = [np.full(rest, n) if a == b else pick(xm[a:b], axis=0) + a for a, b in segments]
    return np.moveaxis(np.stack(rows) if rows else np.empty((0, *rest), dtype=np.int64), 0, axis)


def check(got, reduction: str, x: np.ndarray, kwargs: dict, segments, axis: int, dtype=None) -> None:
    """``got`` (a Dask array) against linred's single call on ``x`` and against the float64 reference."""
    assert isinstance(got, da.Array)
    assert type(got._meta) is np.ndarray
    result = got.compute(scheduler="sync")
    assert result.shape == got.shape
    extra = {} if reduction in ARG_REDUCTIONS else {"dtype": dtype}
    single = getattr(linred, f"segmented_{reduction}")(x, axis=axis, **kwargs, **extra)
    assert result.dtype == single.dtype == got.dtype
    if reduction in ARG_REDUCTIONS:
        np.testing.assert_array_equal(result, single)
        np.testing.assert_array_equal(result, arg_reference(reduction, x, segments, axis))
        return
    if reduction == "prod":  # (no float64 reference for products here: the single call is the reference)
        np.testing.assert_allclose(result.astype(float), single.astype(float), rtol=1e-3, equal_nan=True)
        return
    assert_reduction(result, reduction, x, segments=segments, axis=axis, dtype=dtype)
    if result.dtype.kind in "fc" and reduction in ("sum", "mean"):
        # The order of additions may differ from the single call's (carry adds a segment's pieces):
        # both are within the accuracy bound of the exact result, so within twice of each other.
        out_name = expected_dtype(reduction, x.dtype.name, dtype)
        ref = reference(reduction, x, segments, axis, dtype)
        bound = error_bound(reduction, x, segments, axis, out_name, ref)
        diff = np.abs(result.astype(np.float64) - single.astype(np.float64))
        assert np.all((diff <= 2 * bound) | (np.isnan(result) & np.isnan(single)))
    else:
        np.testing.assert_array_equal(result, single)


def is_carry(y) -> bool:
    return any("-pieces" in str(key) for key in dict(y.__dask_graph__()))


# --- the reductions: every method, segment spec, layout and dtype ---

_GRID = [
    (reduction, method, spec, layout, DTYPES[(i + j) % len(DTYPES)])
    for reduction, method in itertools.product(REDUCTIONS, METHODS)
    for (i, spec), (j, layout) in itertools.product(enumerate(SPECS), enumerate(LAYOUTS))
]


@pytest.mark.parametrize(
    "reduction, method, spec, layout, dtype",
    _GRID,
    ids=[f"{r}-{m}-{s}-{nd}d{ax}-{d}" for r, m, s, (nd, ax), d in _GRID],
)
def test_matches_single_call_and_reference(reduction, method, spec, layout, dtype):
    ndim, axis = layout
    seed = zlib.crc32(repr((reduction, method, spec, layout)).encode())
    x, dx, kwargs, segments = make_case(seed, ndim, axis, dtype, spec, reduction=reduction)
    function = getattr(linred.dask, f"segmented_{reduction}", None)
    if function is None:
        got = ldask.segmented_reduce(reduction, dx, axis=axis, method=method, **kwargs)
    else:
        got = function(dx, axis=axis, method=method, **kwargs)
    check(got, reduction, x, kwargs, segments, axis)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "float16"])
def test_blockwise_when_chunk_edges_are_segment_edges(reduction, dtype):
    """Chunks cut at segment edges (empty segments on the edges, zero-size chunks, a chunk of
    many segments, one of no segment): one call per chunk, no carry step; ``auto`` picks it."""
    if dtype == "bool" and reduction == "prod":
        pytest.skip("no product of bools")
    rng = np.random.default_rng(5)
    offsets = np.array([0, 0, 3, 3, 3, 4, 9, 9, 10, 17, 20, 20, 30, 30], dtype=np.int64)
    x = _data(rng, (30, 2), dtype, reduction)
    dx = da.from_array(x, chunks=((3, 0, 6, 0, 1, 10, 10, 0), 1))
    segments = segment_bounds(30, offsets=offsets)
    for method in ("auto", "blockwise"):
        got = ldask.segmented_reduce(reduction, dx, offsets=offsets, method=method)
        assert not is_carry(got)
        assert got.chunks[0] == (2, 0, 4, 0, 2, 2, 2, 1)  # the segments that start in each chunk (the last: at n)
        check(got, reduction, x, {"offsets": offsets}, segments, 0)
    fixed = ldask.segmented_reduce(reduction, da.from_array(x, chunks=(6, 2)), 3)
    assert not is_carry(fixed) and fixed.chunks[0] == (2,) * 5
    check(fixed, reduction, x, {"segment_length": 3}, segment_bounds(30, 3), 0)


def test_blockwise_refuses_chunk_edges_inside_segments():
    dx = da.ones(10, chunks=4)
    with pytest.raises(ValueError, match=r"method='blockwise' needs every chunk edge along axis 0 to be a segment "
                                         r"edge; the edge at 4 cuts a segment"):  # fmt: skip
        ldask.segmented_sum(dx, 5, method="blockwise")
    assert is_carry(ldask.segmented_sum(dx, 5))  # auto: carry


@given(
    n=st.integers(0, 60),
    data=st.data(),
    reduction=st.sampled_from(["sum", "mean", "max", "argmin"]),
    method=st.sampled_from([*METHODS, "blockwise"]),
    features=st.integers(0, 3),
)
def test_random_chunkings(n, data, reduction, method, features):
    """Any chunking (zero-size chunks included) and any segments (empty ones included)."""
    sizes = data.draw(st.lists(st.integers(0, 20), min_size=1, max_size=8))
    chunks = (*sizes[:-1], n - sum(sizes[:-1])) if sum(sizes[:-1]) <= n else (n,)
    lengths = data.draw(st.lists(st.integers(0, 25), max_size=12))
    lengths = [*lengths, 0] if sum(lengths) > n else [*lengths, n - sum(lengths)]
    while sum(lengths) > n:
        lengths.pop(0)
    lengths[-1] += n - sum(lengths)
    shape = (n,) if features == 0 else (n, features)
    x = _data(np.random.default_rng(n), shape, "float64")
    dx = da.from_array(x, chunks=(chunks,) + ((features,) if features else ()))
    segments = segment_bounds(n, lengths=lengths)
    try:
        got = ldask.segmented_reduce(reduction, dx, lengths=lengths, method=method)
    except ValueError as e:
        assert method == "blockwise" and "cuts a segment" in str(e)
        return
    check(got, reduction, x, {"lengths": lengths}, segments, 0)


def test_one_segment_across_every_chunk_and_a_shallow_graph():
    """One segment over 60 chunks: the graph's depth does not grow with the number of chunks."""
    x = np.random.default_rng(1).standard_normal((600, 2))
    dx = da.from_array(x, chunks=(10, 1))
    depths = []
    for reduction in ("sum", "mean", "max", "argmax"):
        got = ldask.segmented_reduce(reduction, dx, offsets=[0, 600])
        check(got, reduction, x, {"offsets": [0, 600]}, [(0, 600)], 0)
        depths.append(_depth(dict(got.__dask_graph__())))
    assert max(depths) <= 10, depths
    shallow = _depth(dict(ldask.segmented_sum(da.from_array(x, chunks=(300, 1)), offsets=[0, 600]).__dask_graph__()))
    assert max(depths) <= shallow + 2


def _depth(graph: dict) -> int:
    from dask.core import get_dependencies

    depth: dict = {}
    for key in graph:  # (a key's dependencies come before it in this order only by chance: iterate)
        stack = [key]
        while stack:
            k = stack[-1]
            deps = [d for d in get_dependencies(graph, k) if d not in depth]
            if deps:
                stack.extend(deps)
                continue
            depth[k] = 1 + max((depth[d] for d in get_dependencies(graph, k)), default=0)
            stack.pop()
    return max(depth.values())


def test_half_precision_pieces_are_added_in_float32():
    """float16 pieces of 80 values of 1000 (80000 > float16's 65504) are carried in float32."""
    x = np.full(240, 1000.0, dtype=np.float16)
    dx = da.from_array(x, chunks=80)
    mean = ldask.segmented_mean(dx, 240, method="carry")
    assert is_carry(mean)
    np.testing.assert_array_equal(mean.compute(), np.array([1000.0], dtype=np.float16))
    np.testing.assert_array_equal(ldask.segmented_sum(dx, 240, dtype=np.float32).compute(), [240000.0])
    with pytest.warns(RuntimeWarning, match="overflow encountered in a segmented reduction"):  # (as the single call)
        overflowed = ldask.segmented_sum(dx, 240).compute()
    with pytest.warns(RuntimeWarning, match="overflow encountered in a segmented reduction"):
        np.testing.assert_array_equal(overflowed, linred.segmented_sum(x, 240))  # inf, as the single call


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_empty_segments_take_the_identity_of_the_result_dtype(reduction):
    x = np.arange(12, dtype=np.int32)
    dx = da.from_array(x, chunks=5)
    offsets = [0, 3, 3, 12, 12]
    for method in METHODS:
        got = ldask.segmented_reduce(reduction, dx, offsets=offsets, dtype=np.float64, method=method).compute()
        single = getattr(linred, f"segmented_{reduction}")(x, offsets=offsets, dtype=np.float64)
        np.testing.assert_array_equal(got, single)
        assert np.isinf(got[1]) and np.isinf(got[3])


# --- rechunk: the single call's bits ---


@pytest.mark.parametrize("chunks", [13, 100, 999, 4096])
def test_rechunk_gives_the_single_calls_bits(chunks):
    """1-D host offsets reduce each segment with one ``reduceat`` whatever the array around it: the
    rechunked calls give the single call's bits (float64 sums and means included)."""
    rng = np.random.default_rng(chunks)
    x = rng.standard_normal(10_000)
    lengths = rng.geometric(1 / 40, size=400)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    offsets = np.append(offsets[offsets < 10_000], 10_000)
    dx = da.from_array(x, chunks=chunks)
    for reduction in ("sum", "mean", "max", "argmin"):
        got = ldask.segmented_reduce(reduction, dx, offsets=offsets, method="rechunk", backend="numpy")
        edges = np.cumsum((0, *got.chunks[0]))
        assert not is_carry(got)
        single = getattr(linred, f"segmented_{reduction}")(dx.compute(), offsets=offsets, backend="numpy")
        np.testing.assert_array_equal(got.compute(), single, strict=True)
    rechunked = ldask._rechunked(dx, 0, ldask._Segments(10_000, offsets=offsets))
    edges = np.cumsum((0, *rechunked.chunks[0]))
    assert np.isin(edges, offsets).all()  # every edge a segment edge, near an old one
    if chunks >= 999:
        old = np.append(np.arange(0, 10_000, chunks), 10_000)
        assert np.abs(edges[:, None] - old[None, :]).min(axis=1).max() <= lengths.max()


def test_rechunk_of_a_fixed_length():
    """Edges move to the nearest multiple of the length.  Float sums with a fixed length are BLAS
    products whose blocking can depend on the number of rows: within the accuracy bound, not bit
    for bit; integer sums and max are exact."""
    x = np.random.default_rng(2).standard_normal((1000, 3))
    dx = da.from_array(x, chunks=(130, 2))
    rechunked = ldask._rechunked(dx, 0, ldask._Segments(1000, length=40))
    assert rechunked.chunks[0] == (120, 120, 160, 120, 120, 120, 160, 80)  # 130, 260 (a tie), 390, ... -> 120, 240, 400
    got = ldask.segmented_sum(dx, 40, method="rechunk")
    assert got.chunks[0] == (3, 3, 4, 3, 3, 3, 4, 2)
    check(got, "sum", x, {"segment_length": 40}, segment_bounds(1000, 40), 0)
    ints = (x * 100).astype(np.int64)
    got = ldask.segmented_sum(da.from_array(ints, chunks=(130, 2)), 40, method="rechunk").compute()
    np.testing.assert_array_equal(got, linred.segmented_sum(ints, 40))


# --- the functions dispatch Dask arrays here ---


def test_the_functions_return_lazy_dask_arrays():
    x = np.arange(1.0, 13.0)
    dx = da.from_array(x, chunks=5)
    for name in ("segmented_sum", "segmented_mean", "segmented_max", "segmented_min", "segmented_argmax",
                 "segmented_argmin"):  # fmt: skip
        got = getattr(linred, name)(dx, offsets=[0, 3, 3, 12])
        assert isinstance(got, da.Array)
        np.testing.assert_array_equal(got.compute(), getattr(linred, name)(x, offsets=[0, 3, 3, 12]))
    np.testing.assert_array_equal(linred.segmented_sum(dx, 5, remainder="drop").compute(), [15.0, 40.0])
    np.testing.assert_array_equal(linred.segmented_sum(dx, 5, remainder="keep").compute(), [15.0, 40.0, 23.0])
    np.testing.assert_array_equal(linred.segmented_argmax(dx, 5, remainder="keep").compute(), [4, 9, 11])
    np.testing.assert_array_equal(linred.segmented_sum(dx.reshape(6, 2), 3, axis=-2).compute(), [[9, 12], [27, 30]])


def test_nothing_is_computed_at_call_time():
    """A call builds a graph: no task runs, no chunk is made (the offsets' graph runs, once)."""
    from dask.callbacks import Callback

    made = []

    def chunk(block, block_info=None):
        made.append(block_info[None]["chunk-location"])
        return block

    base = da.from_array(np.arange(40.0), chunks=7)
    dx = base.map_blocks(chunk, dtype=base.dtype, meta=np.empty(0))
    ran = []
    offsets_made = []

    def offsets_chunk(block):
        offsets_made.append(1)
        return block

    offsets = da.from_array(np.array([0, 5, 5, 33, 40]), chunks=2)
    lazy_offsets = offsets.map_blocks(offsets_chunk, dtype=np.int64, meta=np.empty(0, dtype=np.int64))
    with Callback(pretask=lambda key, dsk, state: ran.append(key)):
        results = [
            linred.segmented_sum(dx, 8),
            linred.segmented_mean(dx, offsets=[0, 5, 5, 33, 40]),
            ldask.segmented_max(dx, lengths=[3, 37], method="rechunk"),
            linred.segmented_argmin(dx, 3, remainder="keep"),
        ]
        assert not made and not ran
        lazy = linred.segmented_sum(dx, offsets=lazy_offsets)
    assert not made and len(offsets_made) == 3  # the offsets' three chunks, computed once
    offsets_made.clear()
    np.testing.assert_array_equal(lazy.compute(), linred.segmented_sum(np.arange(40.0), offsets=[0, 5, 5, 33, 40]))
    assert not offsets_made  # the graph holds the offsets it read, not their graph
    assert made
    for result in results:
        result.compute()


def test_offsets_given_as_lists_and_other_arrays():
    x = np.arange(10.0)
    dx = da.from_array(x, chunks=3)
    expected = linred.segmented_sum(x, offsets=[0, 4, 10])
    for offsets in ([0, 4, 10], np.array([0, 4, 10], dtype=np.int32), da.from_array(np.array([0, 4, 10]))):
        np.testing.assert_array_equal(linred.segmented_sum(dx, offsets=offsets).compute(), expected)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(linred.segmented_sum(dx, lengths=torch.tensor([4, 6])).compute(), expected)


# --- errors: the functions' messages ---

_BAD = [
    ({"offsets": [1, 5, 10]}, ValueError),
    ({"offsets": [0, 6, 5, 10]}, ValueError),
    ({"offsets": [0, 5, 9]}, ValueError),
    ({"offsets": [[0, 10]]}, ValueError),
    ({"offsets": [0.0, 10.0]}, TypeError),
    ({"lengths": [3, -1, 8]}, ValueError),
    ({"lengths": [3, 3]}, ValueError),
    ({"segment_length": 3}, ValueError),
    ({"segment_length": 0}, ValueError),
    ({"segment_length": 2.0}, TypeError),
    ({}, TypeError),
    ({"segment_length": 5, "offsets": [0, 10]}, TypeError),
    ({"segment_length": 3, "remainder": "bad"}, ValueError),
    ({"offsets": [0, 10], "remainder": "drop"}, TypeError),
    ({"segment_length": 5, "axis": 1}, np.exceptions.AxisError),
    ({"segment_length": 5, "dtype": "bool"}, TypeError),
    ({"segment_length": 5, "backend": "nope"}, ValueError),
    ({"segment_length": 5, "check": "yes"}, TypeError),
]


@pytest.mark.parametrize("kwargs, error", _BAD, ids=[repr(k) for k, _ in _BAD])
def test_bad_arguments_raise_as_the_functions_do(kwargs, error):
    x = np.arange(10.0)
    with pytest.raises(error) as single:
        linred.segmented_sum(x, **kwargs)
    with pytest.raises(error) as chunked:
        linred.segmented_sum(da.from_array(x, chunks=3), **kwargs)
    assert str(chunked.value) == str(single.value)


def test_complex_max_and_zero_dimensions_raise_as_the_functions_do():
    z = np.ones(4, dtype=np.complex64)
    with pytest.raises(TypeError) as single:
        linred.segmented_max(z, 2)
    with pytest.raises(TypeError) as chunked:
        linred.segmented_max(da.from_array(z, chunks=2), 2)
    assert str(chunked.value) == str(single.value)
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        linred.segmented_sum(da.from_array(np.float64(1.0)), 1)


def test_refusals_of_dask_input():
    dx = da.ones(10, chunks=3)
    with pytest.raises(TypeError, match=r"^out cannot be given for Dask arrays \(the result is a new lazy Dask"):
        linred.segmented_sum(dx, 5, out=np.empty(2))
    with pytest.raises(TypeError, match=r"^stream cannot be given for Dask arrays"):
        linred.segmented_mean(dx, 5, stream=0)
    with pytest.raises(TypeError, match=r"^out and stream cannot be given"):
        linred.segmented_max(dx, 5, out=np.empty(2), stream=0)
    with pytest.raises(TypeError, match=r"^stream cannot be given for Dask arrays"):
        linred.segmented_argmax(dx, 5, stream=0)
    with pytest.raises(ValueError, match=r"^method must be one of 'auto', 'blockwise', 'carry', 'rechunk'; got 'x'"):
        ldask.segmented_sum(dx, 5, method="x")
    with pytest.raises(ValueError, match=r"^reduction must be one of"):
        ldask.segmented_reduce("median", dx, 5)
    with pytest.raises(TypeError, match=r"^dtype cannot be given for segmented_argmax"):
        ldask.segmented_reduce("argmax", dx, 5, dtype=np.float64)
    with pytest.raises(TypeError, match=r"^x must be a dask.array.Array; got numpy.ndarray"):
        ldask.segmented_sum(np.ones(10), 5)
    with pytest.raises(ValueError, match=r"unknown chunk sizes along axis 0; call x.compute_chunk_sizes\(\)"):
        linred.segmented_sum(dx[dx > 0], 1)
    for name in ("sum", "softmax"):  # (segment ids are read against the axis's length, which is unknown)
        with pytest.raises(ValueError, match=r"unknown chunk sizes along axis 0; call x.compute_chunk_sizes\(\)"):
            getattr(linred, "segmented_" + name)(dx[dx > 0], segment_ids=[0] * 10)
    with pytest.raises(TypeError, match=r"^x must be a Dask array of NumPy or CuPy chunks; got chunks of numpy.ma"):
        linred.segmented_sum(da.ma.masked_array(dx), 5)


def test_time_data_is_rechunked_not_carried():
    t = np.datetime64("2024-01-01T00:00", "s") + np.arange(12) * np.timedelta64(7, "s")
    dt = da.from_array(t, chunks=5)
    got = linred.segmented_max(dt, 4)
    assert not is_carry(got) and got.dtype == t.dtype
    np.testing.assert_array_equal(got.compute(), linred.segmented_max(t, 4))
    np.testing.assert_array_equal(linred.segmented_mean(dt, 6).compute(), linred.segmented_mean(t, 6))
    with pytest.raises(TypeError, match=r"method='carry' does not take datetime64\[s\] data"):
        ldask.segmented_max(dt, 4, method="carry")
    with pytest.raises(TypeError, match=r"cannot be given for datetime64\[s\] data"):
        linred.segmented_max(dt, 4, dtype=np.int64)


# --- schedulers, threads, the plan cache ---


def test_threaded_scheduler():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5000, 3)).astype(np.float32)
    offsets = np.unique(np.concatenate([[0, 5000], rng.integers(0, 5000, 300)]))
    dx = da.from_array(x, chunks=(97, 2))
    for reduction in ("sum", "max", "argmax"):
        got = ldask.segmented_reduce(reduction, dx, offsets=offsets)
        single = getattr(linred, f"segmented_{reduction}")(x, offsets=offsets)
        threaded = got.compute(scheduler="threads", num_workers=4)
        if reduction == "sum":
            np.testing.assert_allclose(threaded, single, rtol=1e-5, atol=1e-4)
        else:
            np.testing.assert_array_equal(threaded, single)
        np.testing.assert_array_equal(threaded, got.compute(scheduler="sync"))  # the same bits on any thread


def test_tasks_do_not_start_the_host_thread_pool(monkeypatch):
    """Inside a task the numpy backend reduces on the task's thread; outside, its pool still serves."""
    from linred.backends import numpy as host

    monkeypatch.setattr(host, "THREAD_ELEMENTS", 64)  # cut even small inputs across threads
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)  # three CPUs
    monkeypatch.delenv("LINRED_NUM_THREADS", raising=False)
    pooled = []
    real = host._executor
    monkeypatch.setattr(host, "_executor", lambda workers: pooled.append(threading.get_ident()) or real(workers))
    x = np.random.default_rng(4).standard_normal(40_000)
    offsets = np.arange(0, 40_001, 100)
    linred.clear_plan_cache()
    got = ldask.segmented_sum(da.from_array(x, chunks=10_000), offsets=offsets).compute(scheduler="threads")
    assert not pooled
    with ldask._one_thread():
        assert host.num_threads() == 1
    assert host.num_threads() == 3
    np.testing.assert_array_equal(got, linred.segmented_sum(x, offsets=offsets))  # (this one uses the pool)
    assert pooled


def test_odd_pieces_do_not_fill_the_plan_cache(clean_plan_cache):
    """200 chunks whose edges cut segments of a fixed length at 40 different places: the whole segments
    share a few cached plans; the pieces' plans are used once and dropped."""
    x = np.random.default_rng(5).standard_normal(200 * 37)
    got = ldask.segmented_sum(da.from_array(x, chunks=37), 40, remainder="drop", method="carry")
    got.compute(scheduler="sync")
    assert linred.plan_cache_info()["size"] <= 8


# --- other schedulers and dask's modes ---

_EXPR_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import dask.array as da
    assert da.array_expr_enabled()
    import linred, linred.dask

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 3))
    offsets = np.array([0, 0, 7, 150, 151, 151, 299, 300, 300])
    for chunks in ((40, 2), (30, 3)):
        dx = da.from_array(x, chunks=chunks)
        for reduction in ("sum", "mean", "max", "min", "argmax", "argmin"):
            for method in ("auto", "carry", "rechunk"):
                for kwargs in ({"offsets": offsets}, {"segment_length": 30}):
                    got = linred.dask.segmented_reduce(reduction, dx, method=method, **kwargs)
                    assert type(got).__module__.startswith("dask.array._array_expr"), type(got)
                    single = getattr(linred, "segmented_" + reduction)(x, **kwargs)
                    np.testing.assert_allclose(got.compute(), single, rtol=1e-12, atol=1e-12)
    # unsorted ids move the elements first (not by integer-array indexing, which this mode lacks)
    ids = rng.integers(0, 7, 300)
    for chunks in ((40, 2), (300, 3), (1, 3)):
        dx = da.from_array(x, chunks=chunks)
        for name in ("sum", "max", "argmin", "softmax", "var"):
            got = getattr(linred, "segmented_" + name)(dx, segment_ids=ids, num_segments=8)
            single = getattr(linred, "segmented_" + name)(x, segment_ids=ids, num_segments=8)
            np.testing.assert_allclose(got.compute(), single, rtol=1e-12, atol=1e-12, equal_nan=True)
    # few segments by unsorted ids, 1-D data in 20 chunks: each chunk's parts combined by a tree
    # of reductions whose meta this mode computes from an empty block
    x1 = rng.standard_normal(40)
    for name in ("sum", "mean", "prod", "max", "min", "argmax", "argmin"):
        got = getattr(linred, "segmented_" + name)(da.from_array(x1, chunks=2), segment_ids=np.arange(40) % 2)
        single = getattr(linred, "segmented_" + name)(x1, segment_ids=np.arange(40) % 2)
        np.testing.assert_allclose(got.compute(), single, rtol=1e-12)
    print("ok")
    """
)


def test_array_expression_mode():
    """dask's array-expression mode (query planning), where this dask has it: in a fresh process,
    since the mode is chosen when dask.array is first imported."""
    if not hasattr(da, "array_expr_enabled"):
        pytest.skip("this dask has no array-expression mode")
    # (linred's root first, then the caller's path: dask may be installed there, not in site-packages)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "DASK_ARRAY__QUERY_PLANNING": "True", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", _EXPR_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


def test_distributed_local_cluster():
    """Two worker processes: the graph's functions and parameters travel by pickle."""
    distributed = pytest.importorskip("distributed")
    x = np.random.default_rng(6).standard_normal((3000, 2))
    dx = da.from_array(x, chunks=(250, 1))
    offsets = np.array([0, 5, 1500, 1500, 2600, 3000])
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster),
    ):
        for reduction, method in (("mean", "carry"), ("argmax", "carry"), ("max", "rechunk"), ("sum", "auto")):
            got = ldask.segmented_reduce(reduction, dx, offsets=offsets, method=method).compute()
            single = getattr(linred, f"segmented_{reduction}")(x, offsets=offsets)
            np.testing.assert_allclose(got, single, rtol=1e-12, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy and a GPU")
def test_cupy_chunks():
    import cupy

    x = np.random.default_rng(7).standard_normal((4000, 2)).astype(np.float32)
    dx = da.from_array(cupy.asarray(x), chunks=(333, 2), asarray=False)
    offsets = np.array([0, 0, 10, 2000, 2001, 4000])
    for reduction in REDUCTIONS:
        for method in METHODS:
            got = ldask.segmented_reduce(reduction, dx, offsets=offsets, method=method)
            assert type(got._meta) is cupy.ndarray
            result = got.compute()
            assert type(result) is cupy.ndarray
            single = getattr(linred, f"segmented_{reduction}")(x, offsets=offsets)
            np.testing.assert_allclose(cupy.asnumpy(result), single, rtol=1e-5, atol=1e-4)
    ids = np.random.default_rng(8).integers(0, 9, 4000)  # unsorted ids of few segments: map-reduce
    for reduction in ("sum", "mean", "max", "min", "prod"):
        got = getattr(linred, f"segmented_{reduction}")(dx, segment_ids=ids, num_segments=10)
        assert "by-ids" in _tasks(got) and type(got._meta) is cupy.ndarray
        result = got.compute()
        assert type(result) is cupy.ndarray
        single = getattr(linred, f"segmented_{reduction}")(x, segment_ids=ids, num_segments=10)
        np.testing.assert_allclose(cupy.asnumpy(result), single, rtol=1e-5, atol=1e-4, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy and a GPU")
def test_cupy_chunks_on_a_local_cuda_cluster():
    """dask_cuda's LocalCUDACluster with one worker: the chunks are made on the worker's GPU,
    reduced there by linred, and the results stay CuPy arrays (no host round trip of the data)."""
    import cupy

    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    n = 1_000_000
    offsets = np.concatenate([[0], np.sort(np.random.default_rng(8).integers(0, n, 300)), [n]])
    with (
        dask_cuda.LocalCUDACluster(n_workers=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        state = da.random.RandomState(seed=3, RandomState=cupy.random.RandomState)
        dx = state.standard_normal(n, chunks=n // 7).astype(np.float32)  # made on the worker
        assert type(dx._meta) is cupy.ndarray
        on_worker = dx.persist()
        distributed.wait(on_worker)

        def stored(dask_worker: object) -> list[str]:  # the array libraries of what the worker holds
            return sorted({type(v).__module__.split(".")[0] for v in dask_worker.data.values()})

        kinds = client.run(stored)
        assert all(k == ["cupy"] for k in kinds.values()), kinds
        whole = on_worker.compute()  # (for the single-array reference, on this process's GPU)
        assert type(whole) is cupy.ndarray
        for reduction, method in (("sum", "carry"), ("mean", "rechunk"), ("max", "carry"), ("argmin", "auto")):
            got = ldask.segmented_reduce(reduction, on_worker, offsets=offsets, method=method)
            assert type(got._meta) is cupy.ndarray
            result = got.compute()
            assert type(result) is cupy.ndarray
            single = getattr(linred, f"segmented_{reduction}")(whole, offsets=offsets)
            np.testing.assert_allclose(cupy.asnumpy(result), cupy.asnumpy(single), rtol=1e-5, atol=1e-4)


def _cupy_workers_check(client: Any, n_workers: int) -> None:
    """Chunks made on the workers' GPUs, reduced there, results CuPy and right, on ``n_workers``."""
    import cupy

    distributed = pytest.importorskip("distributed")
    n = 2_000_000
    edges = np.arange(0, n + 1, n // 8)  # the chunk edges are segment edges too: blockwise applies
    offsets = np.union1d(np.random.default_rng(9).integers(0, n, 500), edges)
    state = da.random.RandomState(seed=4, RandomState=cupy.random.RandomState)
    dx = state.standard_normal(n, chunks=n // 8).astype(np.float32).persist()
    distributed.wait(dx)
    holders = {w for w, keys in client.has_what().items() if keys}
    assert len(holders) == n_workers, holders  # the chunks are spread over every worker
    whole = dx.compute()
    for reduction, method in (("sum", "carry"), ("max", "blockwise"), ("mean", "rechunk")):
        got = ldask.segmented_reduce(reduction, dx, offsets=offsets, method=method).compute()
        assert type(got) is cupy.ndarray
        single = getattr(linred, f"segmented_{reduction}")(whole, offsets=offsets)
        np.testing.assert_allclose(cupy.asnumpy(got), cupy.asnumpy(single), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy and a GPU")
def test_cupy_chunks_on_two_workers_sharing_one_gpu():
    """The multi-worker path of the two-GPU run, on one GPU: two worker processes, CuPy chunks."""
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        _cupy_workers_check(client, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy and a GPU")
def test_cupy_chunks_on_two_gpus():
    """dask_cuda's LocalCUDACluster with one worker per GPU, on a machine with two or more."""
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs (the nvidia-h200-x2 machine)")
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    with (
        dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,1", dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        _cupy_workers_check(client, 2)


def test_docstring_examples():
    result = doctest.testmod(ldask, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False, report=True)
    assert result.failed == 0 and result.attempted > 0


# --- the composed functions (logsumexp, softmax, log_softmax, var, std) ---

COMPOSED = ("logsumexp", "softmax", "log_softmax", "var", "std")


@pytest.mark.parametrize("name", COMPOSED)
@pytest.mark.parametrize(
    "spec",
    [{"offsets": [0, 10, 10, 300, 301, 650, 1000]}, {"lengths": [1000]}, {"segment_length": 8},
     {"segment_length": 7, "remainder": "keep"}, {"segment_length": 7, "remainder": "drop"}],
)  # fmt: skip
@pytest.mark.parametrize("layout", ["1d", "rows", "columns"])
def test_composed_functions_match_the_single_call(name, spec, layout):
    """Chunk edges moved to segment edges, each chunk computed by linred's function: the single
    call's result (1-D, axis 0 of feature rows, and axis 1), lazily, with NaN and infinities."""
    rng = np.random.default_rng(len(name))
    x = rng.normal(size=(1000, 3)) * 3
    x[5, 0], x[400, 1], x[20:40, 2] = np.nan, np.inf, -np.inf
    if layout == "1d":
        x, chunks, axis = x[:, 0], 128, 0
    elif layout == "rows":
        chunks, axis = (128, 3), 0
    else:
        x, chunks, axis = x.T.copy(), (3, 128), 1
    kw = {"ddof": 1} if name in ("var", "std") else {}
    fn = getattr(linred, f"segmented_{name}")
    got = fn(da.from_array(x, chunks=chunks), axis=axis, **spec, **kw)
    assert ldask.is_dask(got)
    want = fn(x, axis=axis, **spec, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("name", [*VALUE_REDUCTIONS, *ARG_REDUCTIONS, "prod", *COMPOSED])
@pytest.mark.parametrize("layout", ["1d", "rows"])
def test_sorted_segment_ids(name, layout):
    """Sorted ids (a batch vector, with empty segments and trailing empty ones from num_segments)
    become offsets: the single call's result with the same ids."""
    if not hasattr(linred, f"segmented_{name}"):
        pytest.skip(f"no segmented_{name}")
    rng = np.random.default_rng(1)
    ids = np.sort(rng.integers(0, 30, 1000))
    ids[ids == 7] = 8  # an empty segment
    x = rng.normal(size=(1000, 3))
    if layout == "1d":
        x = x[:, 0]
    fn = getattr(linred, f"segmented_{name}")
    chunks = 128 if layout == "1d" else (128, 3)
    got = fn(da.from_array(x, chunks=chunks), segment_ids=ids, num_segments=33)
    assert ldask.is_dask(got)
    want = fn(x, segment_ids=ids, num_segments=33)
    np.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-12, equal_nan=True)
    got = fn(da.from_array(x, chunks=chunks), segment_ids=da.from_array(ids, chunks=100))  # ids as a Dask array
    np.testing.assert_allclose(got.compute(), fn(x, segment_ids=ids), rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("name", [*VALUE_REDUCTIONS, *ARG_REDUCTIONS, "prod", *COMPOSED])
@pytest.mark.parametrize("layout", ["1d", "rows", "columns"])
def test_unsorted_segment_ids(name, layout):
    """Unsorted ids (graph edges by target node): the data moved into the ids' stable order, the
    sorted path, per-element results moved back and positions mapped back (ties: the first
    occurrence, as the single call's); the single call's result, with empty segments, ties,
    NaN and infinities, whatever ids_sorted says."""
    if not hasattr(linred, f"segmented_{name}"):
        pytest.skip(f"no segmented_{name}")
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 30, 1000)
    ids[ids == 7] = 8  # an empty segment; 30..32 are empty too (num_segments=33)
    x = np.round(rng.normal(size=(1000, 3)), 1)  # (ties for the arg-reductions)
    x[5, 0], x[400, 1], x[20:40, 2] = np.nan, np.inf, -np.inf
    axis = 0
    if layout == "1d":
        x, chunks = x[:, 1], 128
    elif layout == "rows":
        chunks = (128, 3)
    else:
        x, chunks, axis = x.T.copy(), (3, 128), 1
    kw = {"ddof": 1} if name in ("var", "std") else {}
    fn = getattr(linred, f"segmented_{name}")
    want = fn(x, segment_ids=ids, num_segments=33, axis=axis, **kw)
    for ids_sorted in (None, False, True):  # (read on the host: the ids say whether they are sorted)
        got = fn(da.from_array(x, chunks=chunks), segment_ids=ids, num_segments=33, axis=axis,
                 ids_sorted=ids_sorted, **kw)  # fmt: skip
        assert ldask.is_dask(got)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-12, equal_nan=True)
    got = fn(da.from_array(x, chunks=chunks), segment_ids=da.from_array(ids, chunks=300), axis=axis, **kw)
    np.testing.assert_allclose(got.compute(), fn(x, segment_ids=ids, axis=axis, **kw), rtol=1e-12, atol=1e-12,
                               equal_nan=True)  # fmt: skip


def _tasks(a: Any) -> str:
    return " ".join(str(k) for k in dict(a.__dask_graph__()))


@pytest.mark.parametrize("name", [*VALUE_REDUCTIONS, "prod"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "bool", "complex64", "float64"])
def test_unsorted_segment_ids_of_few_segments_map_reduce(name, dtype):
    """Unsorted ids of few segments (at most a chunk's length of them across all chunks): each
    chunk reduced by its own ids into every segment, the chunks' results combined (no element
    moves, as flox's map-reduce); within linred's accuracy of the float64 reference (16-bit parts
    in float32, rounded once), empty chunks and segments, NaN and infinities, dtype=, and no
    warning for an empty segment's mean.  More segments than that: the elements move."""
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    if dtype == "complex64" and name in ("max", "min"):
        pytest.skip("complex numbers have no order")
    rng = np.random.default_rng(11)
    n = 3000
    values = rng.random((n, 2)) + 0.5 if name != "prod" else np.exp(rng.normal(0, 0.01, (n, 2)))
    if np.dtype(dtype).kind in "iub":
        values = rng.integers(0, 3, (n, 2))
    x = values.astype(dtype)
    if np.dtype(dtype).kind in "fcV":
        x[17, 0], x[2100, 1] = np.nan, np.inf
    ids = rng.integers(0, 6, n)
    ids[ids == 4] = 5  # segment 4 empty, and 6 (num_segments=7)
    fn = getattr(linred, f"segmented_{name}")
    want = fn(x, segment_ids=ids, num_segments=7)
    for chunks in ((100, 2), ((0, 1000, 0, 2000), (1, 1)), (3000, 2)):
        got = fn(da.from_array(x, chunks=chunks), segment_ids=ids, num_segments=7)
        # (complex products move the elements: see test_map_reduce_edges)
        assert ("by-ids" in _tasks(got)) == (name != "prod" or "complex" not in str(dtype)), chunks
        with warnings.catch_warnings():
            if name == "mean":  # (empty segments: 0 / 0, without a warning, as linred's)
                warnings.simplefilter("error")
            result = got.compute()
        assert result.dtype == want.dtype and result.shape == want.shape
        if name != "prod":  # (the float64 reference of the segments the ids make, in the ids' order)
            order = np.argsort(ids, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=7))])
            assert_reduction(result, name, x[order], segments=list(itertools.pairwise(bounds.tolist())), axis=0)
        np.testing.assert_allclose(result.astype(np.complex128), want.astype(np.complex128), equal_nan=True,
                                   rtol=1e-2 if np.dtype(dtype).itemsize == 2 else 1e-5)  # fmt: skip
    if name == "sum" and dtype == "float32":  # dtype= (a float64 result of float32 data)
        got = fn(da.from_array(x, chunks=(100, 2)), segment_ids=ids, num_segments=7, dtype="float64").compute()
        np.testing.assert_allclose(got, fn(x, segment_ids=ids, num_segments=7, dtype="float64"), rtol=1e-12)
    spread = rng.integers(0, 1100, n)  # 3 chunks x 1100 segments > 3000 elements: they move
    many = fn(da.from_array(x, chunks=(1000, 2)), segment_ids=spread)
    assert "by-ids" not in _tasks(many)
    np.testing.assert_allclose(many.compute().astype(np.complex128), fn(x, segment_ids=spread).astype(np.complex128),
                               equal_nan=True, rtol=1e-2 if np.dtype(dtype).itemsize == 2 else 1e-5)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
def test_map_reduce_parts_wider_than_the_result(dtype):
    """The chunks' parts of a float32 (complex64) result are float64 (complex128): a part that
    would overflow or underflow in the result's dtype does not make the combination inf - inf or
    0 * inf; an empty segment's complex mean is nan + 0j.  Against float64 references."""
    ids = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    cases = (
        ("prod", [1e-30, 1, 1e-30, 1, 1e30, 1, 1e30, 1], [1.0, 1.0]),
        ("prod", [1e30, 2, 1e30, 1, 1e-30, 1, 1e-30, 1], [1.0, 2.0]),
        ("sum", [3e38, 1, 3e38, 1, -3e38, 1, -3e38, 1], [0.0, 4.0]),
        ("mean", [3e38, 1, 3e38, 1, -3e38, 1, -3e38, 1], [0.0, 1.0]),
    )
    for name, values, want in cases:
        if dtype == "complex64" and name == "prod":
            continue  # (complex products move the elements: test_map_reduce_edges)
        x = da.from_array(np.array(values, dtype=dtype), chunks=4)
        fn = getattr(linred, f"segmented_{name}")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no overflow or invalid value in the combination)
            got = fn(x, segment_ids=ids).compute()
        assert "by-ids" in _tasks(fn(x, segment_ids=ids)) and got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, np.array(want, dtype=np.float64), rtol=1e-6, err_msg=name)
    x = np.array([1 + 1j, 1, 2, 1, 3, 1, 5, 1], dtype=np.complex128)
    got = linred.segmented_mean(da.from_array(x, chunks=4), segment_ids=ids, num_segments=3).compute()
    np.testing.assert_allclose(got[:2], [x[0::2].mean(), x[1::2].mean()], rtol=1e-15)
    assert np.isnan(got[2].real) and got[2].imag == 0


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("chunks", [((1, 0), (1, 2)), ((0, 1, 0), (1, 1, 1)), ((1, 0, 1), (2, 1))], ids=str)
def test_arg_reductions_by_unsorted_ids_with_empty_chunks(name, chunks):
    """Positions by unsorted ids (the data moved into the ids' order, the positions mapped back)
    where another axis has empty chunks: the single call's positions, shape and all (Dask's
    blockwise gave an empty chunk a whole block's values, a row too many)."""
    rows = sum(chunks[0])
    x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3)[:, [2, 0, 1]]
    ids = [1, 0, 1]
    fn = getattr(linred, f"segmented_{name}")
    lazy = fn(da.from_array(x, chunks=chunks), segment_ids=ids, axis=1)
    got = lazy.compute()
    assert lazy.shape == got.shape == (rows, 2)
    np.testing.assert_array_equal(got, fn(x, segment_ids=ids, axis=1))
    assert int(lazy.sum().compute()) == int(fn(x, segment_ids=ids, axis=1).sum())


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize(
    "spec", ["fixed 256 in chunks of 128", "offsets in chunks of 2", "lengths in chunks of 3", "ids in chunks of 2"]
)
def test_cut_segments_pieces_wider_than_the_result(dtype, name, spec):
    """A segment cut across chunks (the carry strategy) whose sum fits the float32 range, where its
    pieces, or the runs inside one piece, do not (3e38, 3e38, -3e38, -2e38): the sum or mean, as
    the in-memory call gives it, without a warning (the pieces are float64 or complex128, and a
    host chunk's run past the range is summed again); a segment whose own sum passes the range
    is inf with the cast's overflow warning.  Against float64 references."""
    head = np.array([3e38, 3e38, -3e38, -2e38])
    if spec.startswith("fixed"):
        values, chunks, kwargs = np.concatenate([head, np.zeros(252)]), 128, {"segment_length": 256}
    else:
        values, chunks = np.concatenate([head, np.ones(4)]), int(spec[-1])
        kwargs = {"offsets": [0, 8]} if spec.startswith("offsets") else {"lengths": [8]}
        if spec.startswith("ids"):
            kwargs = {"segment_ids": np.zeros(8, np.int64), "num_segments": 1}
    x = np.stack([values, values / 2], axis=1).astype(dtype)
    want = values.sum() if name == "sum" else values.mean()
    fn = getattr(linred, f"segmented_{name}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(da.from_array(x, chunks=(chunks, 2)), **kwargs).compute()
        alone = fn(x, **kwargs)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.complex128), [[want, want / 2]], rtol=1e-6)
    np.testing.assert_allclose(alone.astype(np.complex128), [[want, want / 2]], rtol=1e-6)
    if name == "sum":
        huge = np.full_like(x, 3e38)
        with pytest.warns(RuntimeWarning, match="overflow"):
            over = fn(da.from_array(huge, chunks=(chunks, 2)), **kwargs).compute()
        assert np.all(np.isinf(over.real))


@pytest.mark.parametrize("name", ARG_REDUCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool", "float64"])
def test_unsorted_segment_ids_of_few_segments_map_reduce_positions(name, dtype):
    """argmax and argmin by unsorted ids of few segments: each chunk's positions (in the caller's
    order) with their values, combined chunk by chunk: the single call's positions, ties at the
    first occurrence, the first NaN, an infinity, empty segments (n) and empty chunks; 3-D data
    chunked along every axis, reduced along the middle one."""
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    rng = np.random.default_rng(13)
    x = np.round(rng.standard_normal((3, 900, 4)), 0).astype(dtype)  # (many ties)
    if np.dtype(dtype).kind in "fV":
        x[0, 5, 0], x[0, 700, 0], x[1, 50:90, 1], x[2, 10, 3] = np.nan, np.nan, np.inf, -np.inf
    ids = rng.integers(0, 9, 900)
    ids[ids == 4] = 5  # segments 4 and 9 empty (num_segments=10)
    fn = getattr(linred, f"segmented_{name}")
    want = fn(x, segment_ids=ids, num_segments=10, axis=1)
    for chunks in ((2, 100, 3), ((3,), (0, 450, 0, 450), (4,)), (1, 89, 1)):
        got = fn(da.from_array(x, chunks=chunks), segment_ids=ids, num_segments=10, axis=1)
        assert "by-ids" in _tasks(got), chunks
        result = got.compute()
        assert result.dtype == want.dtype
        np.testing.assert_array_equal(result, want)


def test_unsorted_ids_of_time_data_as_the_single_call():
    """datetime64 and timedelta64 data by unsorted ids keep their own rules (NaT, a mean's unit,
    the arg-reductions' refusal of datetimes): the elements move, as before map-reduce."""
    rng = np.random.default_rng(14)
    ids = rng.integers(0, 5, 300)
    for x in (np.datetime64("2020-01-01") + rng.integers(0, 100, 300).astype("timedelta64[D]"),
              rng.integers(0, 100, 300).astype("timedelta64[s]")):  # fmt: skip
        x[[3, 150]] = x.dtype.type("NaT")
        for name in ("max", "min", "sum", "mean", "argmax"):
            fn = getattr(linred, f"segmented_{name}")
            try:
                want = fn(x, segment_ids=ids, num_segments=6)
            except TypeError as e:
                with pytest.raises(TypeError, match=re.escape(str(e)[:40])):
                    fn(da.from_array(x, chunks=50), segment_ids=ids, num_segments=6).compute()
                continue
            got = fn(da.from_array(x, chunks=50), segment_ids=ids, num_segments=6)
            assert "by-ids" not in _tasks(got)
            got = got.compute()
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def test_map_reduce_edges():
    """What map-reduce must give as the eager call gives it: complex products with an infinity
    (a chunk's 1 + 0j times inf + 0j would make inf + nanj NaN: they move the elements instead),
    and the warnings of an overflow or an inf - inf across chunks' parts (linred's, not NumPy's
    reduce's), none for an infinity in the data."""
    ids = np.array([0, 1, 2, 1, 0, 1, 2, 1])
    x = np.array([np.inf, 2, 1, 1, 2, 1, 1e200 + 1e200j, 1], dtype=complex)
    x[6] = 1e200 + 1e200j
    x[2] = 1e200 + 1e200j
    got = linred.segmented_prod(da.from_array(x, chunks=4), segment_ids=ids).compute()
    want = linred.segmented_prod(x, segment_ids=ids)
    np.testing.assert_array_equal(got.real, want.real)
    np.testing.assert_array_equal(got.imag, want.imag)
    ids = np.array([0, 1, 0, 1])
    for values, message in (([1e308, 1.0, 1e308, 1.0], "overflow"), ([np.inf, 1, -np.inf, 1.0], "invalid value"),
                            ([np.inf, 1, 2, 3.0], None)):  # fmt: skip
        x = np.array(values)
        for call in (lambda x=x: linred.segmented_sum(da.from_array(x, chunks=2), segment_ids=ids).compute(),
                     lambda x=x: linred.segmented_sum(x, segment_ids=ids)):  # fmt: skip
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                call()
            assert [str(w.message) for w in seen] == ([] if message is None else
                                                      [f"{message} encountered in a segmented reduction"])  # fmt: skip


def test_map_reduce_keeps_float32_sums_within_linreds_accuracy():
    """200 chunks' float32 sums of a segment, combined in float64: within 1e-6 of sum|x| of the
    float64 sum (a float32 combination of 200 parts errs by up to 200 roundings)."""
    rng = np.random.default_rng(12)
    x = rng.random(400_000).astype(np.float32)
    ids = rng.integers(0, 5, x.shape[0])
    got = linred.segmented_sum(da.from_array(x, chunks=2000), segment_ids=ids, num_segments=5).compute()
    ref = np.bincount(ids, weights=x.astype(np.float64), minlength=5)
    assert np.all(np.abs(got - ref) <= 1e-6 * ref)


@pytest.mark.parametrize("name", ARG_REDUCTIONS)
def test_unsorted_segment_ids_arg_reductions_of_few_segments(name):
    """Few segments (the result's chunks along the axis end in an empty one): positions mapped
    back block by block, as the single call's."""
    rng = np.random.default_rng(5)
    x = rng.random((12, 2))
    ids = np.tile([0, 2], 6)  # segment 1 empty
    fn = getattr(linred, f"segmented_{name}")
    got = fn(da.from_array(x, chunks=(4, 2)), segment_ids=ids, axis=0).compute()
    np.testing.assert_array_equal(got, fn(x, segment_ids=ids, axis=0))


@pytest.mark.parametrize("name", ARG_REDUCTIONS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
def test_arg_reductions_find_a_nan_in_a_later_chunk(name, dtype):
    """A NaN is the extreme of its segment wherever its chunk lies; bfloat16 (ml_dtypes: NumPy kind
    "V") missed one in a later chunk (2 instead of 6: the NaN rule was kept for kinds "f" and "c")."""
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    x = np.array([1, 2, 3, 4, 5, 6, np.nan, 7, 8, 9, 1, np.nan], dtype=dtype)
    fn = getattr(linred, f"segmented_{name}")
    for chunks in (3, 4, 5, 12):
        got = fn(da.from_array(x, chunks=chunks), offsets=[0, 9, 12]).compute()
        np.testing.assert_array_equal(got, [6, 11])
        np.testing.assert_array_equal(got, fn(x, offsets=[0, 9, 12]))


@pytest.mark.parametrize("name", ["sum", "softmax", "argmax"])
def test_unsorted_segment_ids_with_empty_chunks(name):
    """Chunks of which most are empty: Dask's gather sizes its output chunks by the mean input
    chunk (0 here) and raised "range() arg 3 must not be zero"; the empty chunks are dropped
    before the data moves into the ids' order."""
    fn = getattr(linred, f"segmented_{name}")
    for values, chunks, ids in (([1.0, 2.0], (0, 0, 1, 1), [1, 0]),
                                (np.arange(10.0), (0, 0, 0, 0, 0, 0, 1, 9), [1, 0] * 5)):  # fmt: skip
        x = np.asarray(values)
        got = fn(da.from_array(x, chunks=(chunks,)), segment_ids=ids).compute()
        np.testing.assert_allclose(got, fn(x, segment_ids=ids), rtol=1e-12)


@pytest.mark.parametrize("name", ["sum", "softmax", "var", "argmax"])
def test_ids_sorted_without_segment_ids_raises(name):
    """As for NumPy data: ``ids_sorted`` names segment ids' order, and is refused without them
    (the composed functions ignored it for Dask arrays)."""
    with pytest.raises(TypeError, match="ids_sorted applies to segment_ids only"):
        getattr(linred, f"segmented_{name}")(da.from_array(np.ones(10), chunks=4), 5, ids_sorted=True)


def test_segment_ids_dask_refuses():
    x = da.from_array(np.ones(10), chunks=4)
    # ids_sorted=False only says not to assume it: sorted ids are served all the same
    got = linred.segmented_softmax(x, segment_ids=[0] * 5 + [1] * 5, ids_sorted=False).compute()
    np.testing.assert_allclose(got, np.full(10, 0.2))
    with pytest.raises(ValueError, match=r"\[0, 2\); segment_ids\[3\] = 5"):  # unsorted: the caller's first
        linred.segmented_sum(x, segment_ids=[1, 0, 1, 5, 0, 9, 0, 0, 1, 1], num_segments=2)
    huge = np.zeros(10, np.uint64)
    huge[4] = 2**63 + 5  # (not wrapped to a negative id in the message)
    with pytest.raises(ValueError, match=r"segment_ids must fit in int64; got 9223372036854775813"):
        linred.segmented_sum(x, segment_ids=huge, num_segments=3)
    for other in ({"segment_length": 5}, {"offsets": [0, 5, 10]}, {"lengths": [5, 5]}):
        with pytest.raises(TypeError, match="give one of segment_length, offsets, lengths or segment_ids"):
            linred.segmented_softmax(x, segment_ids=[0] * 5 + [1] * 5, **other)
    for check in (True, False):
        with pytest.raises(ValueError, match=r"\[0, 2\); segment_ids\[8\] = 2"):
            linred.segmented_max(x, segment_ids=[0] * 4 + [1] * 4 + [2] * 2, num_segments=2, check=check)
    with pytest.raises(ValueError, match="one id per element"):
        linred.segmented_logsumexp(x, segment_ids=[0, 1])
    with pytest.raises(TypeError, match="array of integers"):
        linred.segmented_sum(x, segment_ids=np.zeros(10))


@pytest.mark.parametrize("name", ["sum", "max", "softmax"])
def test_segment_ids_read_as_numpy_datas_are(name):
    """Ids that NumPy data takes, Dask data takes alike: an empty list (for no elements), an
    object array of Python integers, uint64 and int8 ids; against the NumPy call."""
    fn = getattr(linred, f"segmented_{name}")
    empty = fn(da.zeros(0, chunks=1), segment_ids=[], num_segments=2).compute()
    np.testing.assert_array_equal(empty, fn(np.zeros(0), segment_ids=[], num_segments=2))
    assert empty.shape == ((0,) if name == "softmax" else (2,))
    values = np.array([3.0, -1.0, 2.5, 7.0, 0.5, -2.0])
    x = da.from_array(values, chunks=4)
    for ids in (np.array([0, 1, 1, 0, 2, 2], dtype=object), np.array([2, 0, 1, 0, 2, 1], np.uint64),
                np.array([0, 0, 1, 1, 2, 2], np.int8)):  # fmt: skip
        np.testing.assert_allclose(fn(x, segment_ids=ids).compute(), fn(values, segment_ids=ids), rtol=1e-15)


def test_composed_functions_refuse_what_dask_does_not_serve():
    x = da.from_array(np.ones(10), chunks=4)
    with pytest.raises(TypeError, match="stream cannot be given"):
        linred.segmented_logsumexp(x, 5, stream=0)
    with pytest.raises(ValueError, match="offsets"):
        linred.segmented_softmax(x, offsets=[0, 4, 3, 10])
    with pytest.raises(ValueError, match="ddof"):
        linred.segmented_var(x, 5, ddof=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy with a GPU")
@pytest.mark.parametrize("name", COMPOSED)
def test_unsorted_segment_ids_of_cupy_chunks(name):
    """Unsorted ids with CuPy chunks: the data moved on the device, CuPy results (positions too)."""
    import cupy

    rng = np.random.default_rng(4)
    ids = rng.integers(0, 20, 1000)
    x = rng.normal(size=(1000, 4)).astype(np.float32)
    for fn_name in (name, "sum", "argmax"):
        fn = getattr(linred, f"segmented_{fn_name}")
        result = fn(da.from_array(cupy.asarray(x), chunks=(128, 4)), segment_ids=ids, num_segments=22).compute()
        assert isinstance(result, cupy.ndarray)
        want = fn(x, segment_ids=ids, num_segments=22)
        np.testing.assert_allclose(cupy.asnumpy(result), want, rtol=2e-5, atol=2e-5, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy with a GPU")
@pytest.mark.parametrize("name", COMPOSED)
def test_composed_functions_of_cupy_chunks(name):
    import cupy

    rng = np.random.default_rng(3)
    x = rng.normal(size=(1000, 4)).astype(np.float32)
    offsets = [0, 10, 10, 300, 301, 650, 1000]
    got = getattr(linred, f"segmented_{name}")(da.from_array(cupy.asarray(x), chunks=(128, 4)), offsets=offsets)
    result = got.compute()
    assert isinstance(result, cupy.ndarray)
    want = getattr(linred, f"segmented_{name}")(x, offsets=offsets)
    np.testing.assert_allclose(cupy.asnumpy(result), want, rtol=2e-5, atol=2e-5)


def test_bfloat16_extremes_of_cut_segments_warn_nothing():
    """The pieces of a segment that chunks cut are joined by np.maximum / np.minimum, which warn
    "invalid value" for ml_dtypes' bfloat16 NaN (NumPy's own floats do not): no warning, the NaN."""
    import warnings

    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1, np.nan, 2, 3], dtype=ml_dtypes.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("max", "min"):
            got = getattr(linred, f"segmented_{name}")(da.from_array(x, chunks=1), 4).compute()
            assert np.isnan(got.astype(np.float32)).all()


def test_empty_complex_means_are_nan_plus_0j():
    """An empty segment's complex mean is nan+0j, as the functions give it for NumPy arrays (the
    chunks' finalizing 0/0 made it nan+nanj)."""
    x = np.array([1 + 2j, 3 + 4j])
    want = linred.segmented_mean(x, lengths=[0, 2, 0])
    got = linred.segmented_mean(da.from_array(x, chunks=1), lengths=[0, 2, 0]).compute()
    np.testing.assert_array_equal(got.real, want.real)
    np.testing.assert_array_equal(got.imag, want.imag)
    assert np.isnan(got.real[[0, 2]]).all() and (got.imag[[0, 2]] == 0).all()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("spec", ["offsets", "lengths", "segment_ids"])
def test_dask_segments_of_other_arrays_are_refused_not_computed(kind, spec):
    """A Dask array as the segments of a NumPy array or a tensor is refused: reading it would run
    its graph behind the caller's back (the Dask functions read them when they build theirs)."""
    if kind == "torch":
        torch = pytest.importorskip("torch")
        x = torch.arange(12.0)
    else:
        x = np.arange(12.0)
    value = {"offsets": [0, 4, 12], "lengths": [4, 8], "segment_ids": [0] * 4 + [1] * 8}[spec]
    lazy = da.from_array(np.array(value), chunks=2)
    for function in (linred.segmented_sum, linred.segmented_softmax, linred.segmented_argmax):
        with pytest.raises(TypeError, match=rf"^{spec} is a Dask array but x is not: pass {spec}.compute\(\)"):
            function(x, **{spec: lazy})


def test_warnings_errors_and_edges_as_the_single_call():
    """Dask's routes warn and raise as the single call: inf - inf and an overflow where two chunks'
    pieces of one segment are combined (the carry route) give linred's warnings; var of complex
    chunks builds its graph without NumPy's ComplexWarning; an all-negative id names [0, 0); a
    narrowing dtype= of max and min warns only where the segment's result overflows; a complex
    product (dtype=complex128 of real data) is not combined from chunks' parts (infinities make
    complex products depend on their order).  Against float64 references."""

    def caught(fn):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result = fn()
        return result, sorted({str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)})

    for values, want, message in (([np.inf, -np.inf, 1.0, 2.0], [np.nan, 3.0], "invalid value"),
                                  ([1e308, 1e308, 1.0, 2.0], [np.inf, 3.0], "overflow")):  # fmt: skip
        x = np.array(values)
        got, seen = caught(lambda x=x: linred.segmented_sum(da.from_array(x, chunks=1), 2).compute())
        np.testing.assert_array_equal(got, want)
        assert seen == [f"{message} encountered in a segmented reduction"], seen
    xc = np.array([1 + 2j, 3 + 1j, 2 - 1j, 0j])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = linred.segmented_var(da.from_array(xc, chunks=2), 2).compute()
    np.testing.assert_allclose(got, [np.var(xc[:2]), np.var(xc[2:])], rtol=1e-15)
    for make in (lambda: np.ones(1), lambda: da.from_array(np.ones(1), chunks=1)):
        with pytest.raises(ValueError, match=re.escape("[0, num_segments) = [0, 0); segment_ids[0] = -7")):
            linred.segmented_sum(make(), segment_ids=[-7])
    ids = np.array([0, 1, 0, 1])
    for values, want, seen_want in (([1e300, 5.0, 1.0, 6.0], [1.0, 5.0], []),
                                    ([1e300, 5.0, 3e300, 6.0], [np.inf, 5.0],
                                     ["overflow encountered in a segmented reduction"])):  # fmt: skip
        got, seen = caught(lambda v=values: linred.segmented_min(da.from_array(np.array(v), chunks=2), segment_ids=ids,
                                                                 dtype="float32").compute())  # fmt: skip
        assert got.dtype == np.float32 and seen == seen_want, seen
        np.testing.assert_array_equal(got, want)
    # a dtype= of max and min: the result dtype's identity for an empty segment, and the overflow
    # of a segment that some chunk lacks
    x = np.arange(8, dtype=np.int32)
    got = linred.segmented_max(da.from_array(x, chunks=4), segment_ids=[0, 2] * 4, num_segments=3, dtype="float64")
    np.testing.assert_array_equal(got.compute(), [6.0, -np.inf, 7.0])
    got, seen = caught(lambda: linred.segmented_max(da.from_array(np.array([5.0, 1e300, 6.0, 7.0]), chunks=2),
                                                    segment_ids=[1, 0, 1, 1], dtype="float32").compute())  # fmt: skip
    np.testing.assert_array_equal(got, [np.inf, 7.0])
    assert seen == ["overflow encountered in a segmented reduction"], seen
    x = np.array([np.inf, 1.0, 2.0, 1.0])
    got = linred.segmented_prod(da.from_array(x, chunks=2), segment_ids=ids, dtype=np.complex128)
    assert "by-ids" not in _tasks(got)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(got.compute(), linred.segmented_prod(x, segment_ids=ids, dtype=np.complex128))
