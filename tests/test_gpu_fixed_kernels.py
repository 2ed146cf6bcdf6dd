"""GPU: the nvrtc backend's one-launch fixed-length kernels (``fixed_small``, ``fixed_rows``,
``fixed_staged``, ``fixed_long``) at every length class they serve, and just past it, against
float64 NumPy.

Each case is called twice: the first call plans and takes the validating path, the
second the repeated-call fast path that hands the kernel the caller's arrays as they
are.  The segment count (37, and 2 x 37 with a leading batch axis) leaves partial
chunks at the end of the grid; the ``offset by one`` cases start the data one element
into a buffer, so that it is not 16-byte aligned and goes to the tile kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import HAS_CUPY_GPU, assert_reduction, make_data, segment_bounds

import linred

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy with a GPU")]

if HAS_CUPY_GPU:
    import cupy

#: (dtype, the longest length of fixed_small, the longest of fixed_rows): 32 vectors of 16 bytes,
#: then 16 rows of those for data of 2 bytes or more
LIMITS = {
    "float32": (128, 2048),
    "float64": (64, 1024),
    "float16": (256, 4096),
    "int16": (256, 4096),
    "int32": (128, 2048),
    "uint8": (512, 512),
    "bool": (512, 512),
}


def _lengths(dtype: str) -> list[int]:
    small, rows = LIMITS[dtype]
    pow2 = [1 << k for k in range(rows.bit_length())]
    return sorted({*pow2, small * 2, rows * 2})  # past each limit: the next kernel takes over


CASES = [(dtype, L) for dtype in LIMITS for L in _lengths(dtype)]


@pytest.mark.parametrize(("dtype", "L"), CASES, ids=[f"{d}-L={L}" for d, L in CASES])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
def test_fixed_kernels_every_length(dtype, L, reduction, rng):
    if dtype == "bool" and reduction == "mean":
        pytest.skip("the mean of bool is the int8 mean, covered by the other integer types")
    x_np = make_data(dtype, 37 * L, rng)
    x = cupy.asarray(x_np)
    for _ in range(2):
        got = linred.__dict__[f"segmented_{reduction}"](x, L, backend="nvrtc")
        assert_reduction(got, reduction, x_np, segments=segment_bounds(x_np.shape[0], L), like=x)


@pytest.mark.parametrize(
    ("dtype", "L"), [("float16", 1), ("float16", 2), ("float16", 4), ("float32", 1), ("float32", 2), ("uint8", 1),
                     ("uint8", 4), ("float64", 1)]
)  # fmt: skip
@pytest.mark.parametrize("reduction", ["sum", "max"])
def test_fixed_small_results_into_an_unaligned_out(dtype, L, reduction, rng):
    """Lengths shorter than a vector store a thread's results together where ``out`` is aligned
    to them, one by one where it is not (an ``out=`` view one element into a buffer)."""
    x_np = make_data(dtype, 16 * 37 * L, rng)
    x = cupy.asarray(x_np)
    fn = linred.__dict__[f"segmented_{reduction}"]
    dt = fn(x, L, backend="nvrtc").dtype
    buffer = cupy.zeros(x_np.shape[0] // L + 1, dt)
    out = buffer[1:]
    for _ in range(2):
        assert fn(x, L, out=out, backend="nvrtc") is out
        assert_reduction(out, reduction, x_np, segments=segment_bounds(x_np.shape[0], L), like=x)
    assert float(buffer[0]) == 0  # nothing stored before out


@pytest.mark.parametrize("L", [256, 2048])
@pytest.mark.parametrize("layout", ["batch", "offset by one"])
def test_fixed_rows_batch_and_misaligned(L, layout, rng):
    if layout == "batch":
        x_np = make_data("float32", (2, 37 * L), rng)
        x = cupy.asarray(x_np)
        axis = 1
    else:
        buffer = cupy.asarray(make_data("float32", 37 * L + 1, rng))
        x = buffer[1:]
        assert x.data.ptr % 16
        x_np = cupy.asnumpy(x)
        axis = 0
    for _ in range(2):
        got = linred.segmented_sum(x, L, axis=axis, backend="nvrtc")
        bounds = segment_bounds(37 * L, L)
        assert_reduction(got, "sum", x_np, segments=bounds, axis=axis, like=x)


def test_fixed_rows_exact_for_integers_past_int32():
    """int32 data summed into int64 (the default accumulation): exact past the int32 range."""
    L = 2048
    x = cupy.full(8 * L, 2**30, dtype=cupy.int32)
    got = linred.segmented_sum(x, L, backend="nvrtc")
    assert got.dtype == cupy.int64
    np.testing.assert_array_equal(cupy.asnumpy(got), np.full(8, L * 2**30, dtype=np.int64))


#: (dtype, L) for fixed_long: a chunk per segment, several chunks (partials and tickets),
#: lengths that are not powers of two, and one past fixed_rows
LONG_CASES = [
    ("float32", 500),  # 125 vectors: blocks of 64 threads, 2 vectors each at most
    ("float64", 300),  # 150 vectors: 64 threads, 4 each at most
    ("float16", 1000),
    ("float32", 1000),  # 250 vectors: 64 threads, 4 each at most
    ("float32", 1028),  # 257 vectors: 128 threads, 4 each at most, one chunk
    ("float32", 3000),
    ("float32", 4096),
    ("float32", 2**16 + 4),  # 16385 vectors: five chunks, the last one nearly empty
    ("float32", 2**20),  # 256 chunks
    ("float64", 2**12 + 2),
    ("float64", 2**17),
    ("float16", 8192),
    ("float16", 2**18 + 8),
    ("int32", 40_000),
    ("int16", 2**15),
]


@pytest.mark.parametrize(("dtype", "L"), LONG_CASES, ids=[f"{d}-L={L}" for d, L in LONG_CASES])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
def test_fixed_long(dtype, L, reduction, rng):
    x_np = make_data(dtype, 5 * L, rng)
    x = cupy.asarray(x_np)
    fn = linred.__dict__[f"segmented_{reduction}"]
    first = None
    for _ in range(3):  # the tickets must be back at zero after every call
        got = fn(x, L, backend="nvrtc")
        assert_reduction(got, reduction, x_np, segments=segment_bounds(x_np.shape[0], L), like=x)
        got = cupy.asnumpy(got)
        if first is None:
            first = got
        np.testing.assert_array_equal(got, first)  # the same bits every call: partials added in order


@pytest.mark.parametrize("layout", ["batch", "offset by one", "stream"])
def test_fixed_long_layouts(layout, rng):
    L = 2**16
    if layout == "batch":
        x_np = make_data("float32", (3, 4 * L), rng)
        x, axis = cupy.asarray(x_np), 1
    else:
        buffer = cupy.asarray(make_data("float32", 4 * L + 1, rng))
        x, axis = (buffer[1:], 0) if layout == "offset by one" else (buffer[:-1], 0)
        x_np = cupy.asnumpy(x)
    stream = cupy.cuda.Stream(non_blocking=True) if layout == "stream" else None
    for _ in range(2):
        got = linred.segmented_sum(x, L, axis=axis, backend="nvrtc", stream=stream)
        if stream is not None:
            stream.synchronize()
        assert_reduction(got, "sum", x_np, segments=segment_bounds(4 * L, L), axis=axis, like=x)


@pytest.mark.parametrize("how", ["offsets", "long fixed length"])
def test_one_plan_on_two_streams_at_once(how, rng):
    """The scratch buffers of a plan (partials, tickets, tile bounds) serve one stream at a time:
    calls alternated between two non-blocking streams, never synchronized in between, are each
    right."""
    n = 2**22
    data = [make_data("float32", n, rng) for _ in range(2)]
    xs = [cupy.asarray(d) for d in data]
    if how == "offsets":
        lengths = rng.geometric(1 / 300, size=n // 100)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        offsets = np.append(offsets[offsets < n], n)
        kwargs = {"offsets": cupy.asarray(offsets), "check": False}
        bounds = segment_bounds(n, offsets=offsets)
    else:
        kwargs = {"segment_length": 2**18}  # 16 chunks per segment: partials and tickets
        bounds = segment_bounds(n, 2**18)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    results = [linred.segmented_sum(xs[i % 2], **kwargs, backend="nvrtc", stream=streams[i % 2]) for i in range(8)]
    for s in streams:
        s.synchronize()
    for i, got in enumerate(results):
        assert_reduction(got, "sum", data[i % 2], segments=bounds, like=xs[i % 2])


#: (dtype, the longest fixed_staged length: 256 bytes)
STAGED = {"float32": 64, "float16": 128, "float64": 32, "int8": 256, "uint8": 256, "int32": 64, "int16": 128}


def _staged_lengths(dtype: str) -> list[int]:
    top = STAGED[dtype]
    # short odd and even lengths, the longest (and the next, past it: warp_reduce), and the length
    # where a tile drops from 256 threads to 128 (segments over 128 bytes)
    half = top // 2
    return sorted({3, 5, 6, 7, 12, half - 1, half + 1, top - 1, top + 1} - {1, 2, 4, 8, 16, 32, 64, 128, 256})


STAGED_CASES = [(dtype, L) for dtype in STAGED for L in _staged_lengths(dtype)]


@pytest.mark.parametrize(("dtype", "L"), STAGED_CASES, ids=[f"{d}-L={L}" for d, L in STAGED_CASES])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
def test_fixed_staged(dtype, L, reduction, rng):
    """Segment counts at a tile's boundary (threads x segments per thread: 256 or 128 threads,
    max(1, 64 // segment bytes) segments each): the last tile short by one, full, and one segment
    into the next."""
    size = L * np.dtype(dtype).itemsize
    tile = (256 if size <= 128 else 128) * max(1, 64 // size)
    fn = linred.__dict__[f"segmented_{reduction}"]
    for m in (tile - 1, tile, tile + 1, 3 * tile + 7):
        x_np = make_data(dtype, m * L, rng)
        x = cupy.asarray(x_np)
        for _ in range(2):
            got = fn(x, L, backend="nvrtc")
            assert_reduction(got, reduction, x_np, segments=segment_bounds(m * L, L), like=x)


@pytest.mark.parametrize("layout", ["batch", "offset by one", "out offset by one"])
def test_fixed_staged_layouts(layout, rng):
    L, m = 7, 300
    if layout == "batch":  # rows of a batch, one flat run
        x_np = make_data("float16", (3, m * L), rng)
        x, axis = cupy.asarray(x_np), 1
    else:
        buffer = cupy.asarray(make_data("float16", m * L + 1, rng))
        x = buffer[1:] if layout == "offset by one" else buffer[: m * L]  # not 16-byte aligned: tile_reduce
        x_np, axis = cupy.asnumpy(x), 0
    out = None
    if layout == "out offset by one":
        out = cupy.zeros(m + 1, cupy.float16)[1:]
    for _ in range(2):
        got = linred.segmented_sum(x, L, axis=axis, backend="nvrtc", out=out)
        assert_reduction(got, "sum", x_np, segments=segment_bounds(m * L, L), axis=axis, like=x)
