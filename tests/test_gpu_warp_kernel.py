"""GPU: the nvrtc backend's ``warp_reduce`` kernel (segments of aligned, contiguous rows given
by offsets, or by a fixed length that is not a power of two), against float64 NumPy.

The layouts aim at its parts: a tile's offsets read 64 at a time (dense and empty
segments, many batches per tile), the segment open at a tile's end carried to the next
one, tiles with no segment start (whose offsets are not read), a segment spanning
thousands of warps' runs (joined by the fix-up through the per-block group sums),
segments spanning a few runs (joined by one thread of the fix-up, or by a warp past
four), segments starting exactly where warps' runs start (each warp's search for its
first segment), the ragged last tile of a row and the empty segments at its end, rows of
a batch, and unaligned data, which goes to ``tile_reduce``.  Each with the fix-up as a kernel
of its own and as the reduction kernel's last block (``fixup``).
"""

from __future__ import annotations

import numpy as np
import pytest
from support import HAS_CUPY_GPU, assert_reduction, make_data, segment_bounds

import linred

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy with a GPU")]

if HAS_CUPY_GPU:
    import cupy


def _offsets(layout: str, rng: np.random.Generator) -> np.ndarray:
    """Segment boundaries of one of the layouts (``offsets[-1]`` is the data's length)."""
    if layout == "dense with empties":  # lengths 0-3: up to 512 segments in a tile of 512 elements
        lengths = rng.integers(0, 4, 200_000)
    elif layout == "many empties in one tile":  # 5000 empty segments at one position, then short ones
        lengths = np.concatenate([rng.integers(1, 40, 50), np.zeros(5000, np.int64), rng.integers(1, 40, 3000)])
    elif layout == "one segment over many runs":  # 2^21 elements: thousands of runs, whole groups of them
        lengths = np.concatenate([rng.integers(0, 20, 3000), [1 << 21], rng.integers(0, 20, 3000), [0, 0, 0]])
    elif layout == "long segments, ragged end":  # tiles inside segments, a ragged last tile
        lengths = np.concatenate([rng.integers(500, 5000, 300), [7]])
    elif layout == "segments over a few runs":  # 6M elements, runs of one tile: spans of 0-40 runs
        lengths = rng.integers(1, 40 * 512, 600)
    elif layout == "boundaries on tiles":  # every segment (and the empty ones) starts at a tile's start
        lengths = 512 * rng.integers(0, 4, 2000)
    else:
        raise AssertionError(layout)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


LAYOUTS = [
    "dense with empties",
    "many empties in one tile",
    "one segment over many runs",
    "long segments, ragged end",
    "segments over a few runs",
    "boundaries on tiles",
]
KINDS = [
    ("float32", "sum"),
    ("float32", "mean"),
    ("float32", "max"),
    ("float32", "min"),
    ("float64", "sum"),
    ("float16", "sum"),
    ("int32", "max"),
    ("int8", "sum"),
]


@pytest.fixture(params=["kernel", "last block"])
def fixup(request, monkeypatch):
    """Plans made while this is active join warp_reduce's runs in ``linred_fixup`` (a kernel of
    its own) or in the reduction kernel's last block, whatever the number of runs."""
    from linred.backends.nvrtc import executors

    linred.clear_plan_cache()
    monkeypatch.setattr(executors, "FUSED_FIXUP_PASSES", 0 if request.param == "kernel" else 1 << 40)
    yield request.param
    linred.clear_plan_cache()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("dtype", "reduction"), KINDS, ids=[f"{d}-{r}" for d, r in KINDS])
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_warp_kernel_layouts(layout, dtype, reduction, index, rng, fixup):
    off = _offsets(layout, rng)
    x_np = make_data(dtype, int(off[-1]), rng)
    x = cupy.asarray(x_np)
    offsets = cupy.asarray(off.astype(index))
    fn = getattr(linred, f"segmented_{reduction}")
    for check in (True, False):  # the second call takes the repeated-call path
        got = fn(x, offsets=offsets, backend="nvrtc", check=check)
        assert_reduction(got, reduction, x_np, segments=segment_bounds(x_np.shape[0], offsets=off), like=x)


@pytest.mark.parametrize("layout", ["batch", "offset by one", "fixed length 1000"])
def test_warp_kernel_batch_misaligned_fixed(layout, rng, fixup):
    off = _offsets("one segment over many runs", rng)
    n = int(off[-1])
    if layout == "batch":  # rows of a batch: each row's runs, and a segment spanning them
        x_np = make_data("float32", (2, n), rng)
        x, axis, kwargs, bounds = cupy.asarray(x_np), 1, {"offsets": cupy.asarray(off)}, segment_bounds(n, offsets=off)
    elif layout == "offset by one":  # not 16-byte aligned: tile_reduce
        buffer = cupy.asarray(make_data("float32", n + 1, rng))
        x = buffer[1:]
        assert x.data.ptr % 16
        x_np, axis, kwargs, bounds = cupy.asnumpy(x), 0, {"offsets": cupy.asarray(off)}, segment_bounds(n, offsets=off)
    else:  # a fixed length that is not a power of two goes to the same kernels
        x_np = make_data("float32", 1000 * 3001, rng)
        x, axis, kwargs, bounds = cupy.asarray(x_np), 0, {"segment_length": 1000}, segment_bounds(1000 * 3001, 1000)
    for _ in range(2):
        got = linred.segmented_sum(x, **kwargs, axis=axis, backend="nvrtc")
        assert_reduction(got, "sum", x_np, segments=bounds, axis=axis, like=x)


def test_warp_kernel_is_deterministic(rng, fixup):
    """Partials are joined in a fixed order: the same call gives the same bits."""
    off = cupy.asarray(_offsets("one segment over many runs", rng))
    x = cupy.asarray(make_data("float32", int(off[-1]), rng))
    first = linred.segmented_sum(x, offsets=off, backend="nvrtc")
    for _ in range(3):
        assert cupy.array_equal(linred.segmented_sum(x, offsets=off, backend="nvrtc"), first)


@pytest.mark.parametrize("runs_off", [-1, 0, 1])
@pytest.mark.parametrize("elements_off", [-1, 0, 1])
@pytest.mark.parametrize(("dtype", "reduction"), [("float32", "sum"), ("float32", "mean"), ("float64", "max")])
def test_warp_kernel_fixup_in_last_block_or_kernel(runs_off, elements_off, dtype, reduction, rng, monkeypatch):
    """Where the route changes (the runs one block goes through in FUSED_FIXUP_PASSES passes,
    and one run fewer or more, each with one element fewer or more than whole tiles): both
    fix-ups give the same bits, and the float64 result."""
    from linred.backends.nvrtc import DEFAULT_OPTIONS, executors

    # A warp tile: 32 lanes of 16 elements (8 with a float64 accumulator); at these sizes every
    # run is one tile (runs of several tiles are made only where there are many more).
    wt = 32 * (8 if dtype == "float64" else 16)
    runs = executors.FUSED_FIXUP_PASSES * DEFAULT_OPTIONS.threads + runs_off
    n = runs * wt + elements_off
    x_np = make_data(dtype, n, rng)
    lengths = rng.integers(0, 3 * wt, n // wt + 2)
    off = np.minimum(np.concatenate([[0], np.cumsum(lengths)]), n)
    off[-1] = n
    x, offsets = cupy.asarray(x_np), cupy.asarray(off)
    fn = getattr(linred, f"segmented_{reduction}")
    results = []
    for passes in (0, 1 << 40):
        linred.clear_plan_cache()
        monkeypatch.setattr(executors, "FUSED_FIXUP_PASSES", passes)
        for check in (True, False, True):  # a checked plan's second call: the checked variant
            got = fn(x, offsets=offsets, backend="nvrtc", check=check)
            assert_reduction(got, reduction, x_np, segments=segment_bounds(n, offsets=off), like=x)
        results.append(got)
    linred.clear_plan_cache()
    assert cupy.array_equal(results[0], results[1], equal_nan=True)
